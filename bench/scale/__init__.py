"""The scale benchmark of issue 10: the whole operator, as its own process, at N SlurmJobs.

`python -m bench.scale` (or `make bench-scale`) runs it against the dev stack; see
docs/benchmarks.md, "Scale", for what is measured and how.
"""
