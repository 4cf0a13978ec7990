"""The shared filesystem: per-attempt staging directories and log tails."""
