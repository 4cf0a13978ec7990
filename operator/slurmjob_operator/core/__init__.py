"""The pure decision core: no I/O, no adapter imports (see docs/architecture.md)."""
