# syntax=docker/dockerfile:1
# The slurmjob-operator image: the wheel built from this repository, installed into a venv on
# python:3.11-slim, run as a numeric non-root user. Nothing is written outside /tmp at run
# time, so the container works with readOnlyRootFilesystem and an emptyDir at /tmp.
#
#   docker build -t slurmjob-operator:0.1.0 .
#
# tests/integration/test_image.py repeats the same steps without a Docker engine (build the
# wheel, install it into a fresh venv, start the entry point) and runs hadolint on this file.

ARG PYTHON_IMAGE=python:3.11-slim

# -- build: the wheel (hatchling is fetched by pip's isolated build) -------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md LICENSE SECURITY.md ./
COPY templates/ templates/
COPY operator/ operator/
RUN pip wheel --no-deps --wheel-dir /wheels .

# -- jemalloc: the allocator the runtime preloads, from the base image's own Debian ---------
# Unpinned on purpose: the python:3.11-slim tag moves from one Debian release to the next, and
# a pinned version would not exist in the next one; the library is whatever that release has.
FROM ${PYTHON_IMAGE} AS jemalloc
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libjemalloc2 \
    && mkdir /jemalloc \
    && cp -L /usr/lib/*-linux-gnu/libjemalloc.so.2 /jemalloc/libjemalloc.so.2 \
    && rm -rf /var/lib/apt/lists/*

# -- runtime: python:3.11-slim, the wheel in a venv, no compilers ---------------------------
FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=""
LABEL org.opencontainers.image.title="slurmjob-operator" \
      org.opencontainers.image.description="Kubernetes operator that runs SlurmJob resources as Slurm jobs through slurmrestd" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/library/python:3.11-slim"

# jemalloc in /usr/local/lib, which the loader's cache covers once ldconfig has run (before
# LD_PRELOAD below names it), so that LD_PRELOAD finds it by soname on any architecture.
COPY --from=jemalloc /jemalloc/libjemalloc.so.2 /usr/local/lib/libjemalloc.so.2
RUN ldconfig

# The allocator (docs/benchmarks.md measured it, the scale bench runs with it): Python's objects
# in the C allocator (PYTHONMALLOC=malloc), that allocator jemalloc (LD_PRELOAD), which returns
# pages unused for a second (MALLOC_CONF) and whose arenas the operator purges
# (SLURMJOB_MEMORY_TRIM_INTERVAL).
# Against glibc's heap with malloc_trim: 10,000 SlurmJobs created while it runs held 263 MB
# instead of 329 MB once submitted, peak 318 MB instead of 341. The chart sets PYTHONMALLOC and
# MALLOC_CONF too.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONMALLOC=malloc \
    MALLOC_CONF=background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0 \
    LD_PRELOAD=libjemalloc.so.2 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/slurmjob-operator \
    PATH=/opt/slurmjob-operator/bin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/tmp \
    TMPDIR=/tmp \
    USER=slurmjob-operator

# HOME and TMPDIR point at /tmp (an emptyDir in the chart): kopf and the Kubernetes client
# write the kubeconfig's embedded certificates to temporary files there. USER is set because
# the numeric uid has no passwd entry (the chart may run the pod as the Slurm job user's uid),
# and kopf names its identity after $POD_ID, else $USER, else the passwd entry: without either
# variable `run` fails with "getpwuid(): uid not found".

# Binary wheels only: the runtime stage has no compiler, and a dependency that would need one
# must fail the build rather than pull in a toolchain. The wheel is bind-mounted from the
# build stage, so it never lands in a layer; pip compiles the .pyc files at install time, so
# nothing needs writing when the root filesystem is read-only.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m venv /opt/slurmjob-operator \
    && /opt/slurmjob-operator/bin/pip install --no-cache-dir --only-binary=:all: /wheels/slurmjob_operator-*.whl \
    && /opt/slurmjob-operator/bin/slurmjob-operator --help > /dev/null

# The licence and the security policy, where Debian-based images keep a package's documents
# (the wheel carries them too, in its .dist-info).
COPY LICENSE SECURITY.md /usr/share/doc/slurmjob-operator/

WORKDIR /tmp
USER 65532:65532
# 8080: the health probe (/healthz); 8081: the log API (TLS; SLURMJOB_LOGS_PORT);
# 9090: Prometheus /metrics (SLURMJOB_METRICS_PORT).
EXPOSE 8080 8081 9090
ENTRYPOINT ["/opt/slurmjob-operator/bin/slurmjob-operator"]
CMD ["run", "--liveness", "http://0.0.0.0:8080/healthz", "--log-format", "json"]
