# THE test command is `make test`: it installs what it needs (venv, Debian's Slurm on the host,
# Slurm 26.05 in a cached chroot, a kube-apiserver built from Go modules), then runs ruff,
# mypy (strict) and pytest.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-16)
PYTEST_ARGS ?=
SLURM ?= 26.05

.PHONY: test venv testbed lint unit pytest timings crd docs clean dev-up dev-down demo demo-down bench-scale release

test: venv testbed lint pytest

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $@

# Debian's Slurm on the host, Slurm 26.05 in a cached chroot, and kube-apiserver, etcd,
# kubectl and helm built from the Go module proxy (cached; about 13 minutes the first time).
testbed:
	bash tests/testbed/install.sh
	bash tests/k8s/build.sh
	@command -v lua5.4 >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq lua5.4; }
	@# jemalloc, the allocator the image runs the operator with (Dockerfile; the scale bench and
	@# tests/unit/test_memtrim.py load it the same way).
	@dpkg -s libjemalloc2 >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libjemalloc2; }

lint: venv
	$(BIN)/ruff check operator tests bench
	$(BIN)/ruff format --check operator tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

# pytest's exit 5 (no tests collected) is a failure like any other non-zero exit. The whole
# suite runs through tests/lanes.py: the daemons started once, the modules that must be alone
# one by one, then the others in two concurrent pytest processes (`python -m tests.lanes
# --plan` prints them). With PYTEST_ARGS (paths, -k ...) it is plain pytest in one process.
pytest: venv
ifeq ($(strip $(PYTEST_ARGS)),)
	$(BIN)/python -m tests.lanes
else
	$(BIN)/pytest $(PYTEST_ARGS)
endif

unit: venv
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

# Where the time goes: the suite (or PYTEST_ARGS, e.g. PYTEST_ARGS=tests/unit) with the 30
# slowest tests, and the per-module time table every run prints (tests/timing.py, budgets in
# tests/budgets.toml) written to $(TIMINGS) as JSON too. pytest's exit status is kept.
TIMINGS ?= timings.json
timings: venv testbed
ifeq ($(strip $(PYTEST_ARGS)),)
	$(BIN)/python -m tests.lanes --durations=30 --timings-json $(TIMINGS)
else
	$(BIN)/pytest --durations=30 --timings-json $(TIMINGS) $(PYTEST_ARGS)
endif

crd: venv
	$(BIN)/slurmjob-operator crd > crds/slurmjob.io_slurmjobs.yaml
	$(BIN)/python -m slurmjob_operator.gen.chartcrd < crds/slurmjob.io_slurmjobs.yaml \
		> charts/slurmjob-operator/templates/crd.yaml
	$(BIN)/python -m slurmjob_operator.gen.admission > charts/slurmjob-operator/templates/admission.yaml

docs: venv
	$(BIN)/python -m slurmjob_operator.gen.docs > docs/crd.md

# A person's own test clusters (see docs/development.md, "Local development cluster"): the same installs and
# builds as `make test`, then Slurm $(SLURM) and kube-apiserver started (or re-used) and .dev/env
# written. dev-down stops only what dev-up started.
dev-up: venv testbed
	$(BIN)/python -m tests.testbed.dev up --slurm $(SLURM)

dev-down: venv
	$(BIN)/python -m tests.testbed.dev down

# The whole product in one command: local Slurm and kube-apiserver, the operator in the
# background, the examples applied and followed to their final status and log tails.
demo: venv testbed
	$(BIN)/python -m tests.testbed.demo up --slurm $(SLURM)

demo-down: venv
	$(BIN)/python -m tests.testbed.demo down

# The scale bench of docs/benchmarks.md ("Scale"): the baseline and the operator, one after the
# other, BENCH_REPEATS times at each N of BENCH_SIZES (the report gives medians), on the dev
# stack (started or re-used as dev-up does). Writes docs/benchmarks/scale.json, the plots next
# to it and the Scale section. Hours at 10,000.
BENCH_SIZES ?= 1000,5000,10000
BENCH_REPEATS ?= 3
bench-scale: venv testbed
	@$(BIN)/python -c 'import matplotlib' 2>/dev/null || $(BIN)/pip install --quiet 'matplotlib>=3.8'
	$(BIN)/python -m tests.testbed.dev up --slurm 26.05
	PYTHONPATH=$(CURDIR)/operator:$(CURDIR) $(BIN)/python -m bench.scale --sizes $(BENCH_SIZES) \
		--repeats $(BENCH_REPEATS)

# The wheel, the sdist, the chart package and the image build context of the version in
# slurmjob_operator/__init__.py, into dist/ (refused when the chart, the Dockerfile or
# CHANGELOG.md do not carry that version, or the tree is dirty).
HELM ?= $(shell command -v helm || ls /var/cache/slurmjob-testbed/k8s/helm-*/helm 2>/dev/null | head -1)
release: venv
	@test -n "$(HELM)" || { echo "helm not found: make testbed, or HELM=/path/to/helm" >&2; exit 1; }
	$(BIN)/python .ci/release.py --helm $(HELM)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
