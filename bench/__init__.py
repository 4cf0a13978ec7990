"""Benchmarks and soaks (not part of `make test`)."""
