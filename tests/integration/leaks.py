"""A leak scan over what the operator writes while the integration tests run.

After every integration test's body (before its fixtures clean up), `conftest.py` scans what
the operator wrote during the test: the attempt files it stages below the test clusters'
storage root (`job.sh`, `job.env`; not the 0600 `secrets.env` sidecar, which exists to carry
the values, and not the job's own output), the operator log files under the test's tmp_path,
and, when the test used the Kubernetes test bed, every SlurmJob (status, log tails included)
and Event. Nothing there may hold:

- a Secret value a test handed to a job (`secret()` registers it), raw or base64-encoded;
- the JWT signing key of a test cluster, raw, hex or base64;
- a JWT (three base64url parts starting with `eyJ`, as every JWT header does).
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

# What a test gave a job as a Secret value; a value is registered before it is used.
_SECRETS: set[str] = set()
_JWT = re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")
# The attempt files the operator writes (core.naming); the job writes the rest.
_STAGED = {"job.sh", "job.env"}
_MAX_FILE = 4 * 1024 * 1024  # runtime images are large and hold nothing the operator wrote


def secret(value: str) -> str:
    """Register a Secret value a test hands to a job; returns it."""
    _SECRETS.add(value)
    return value


def _forms(value: bytes) -> Iterator[tuple[str, bytes]]:
    yield "raw", value
    yield "base64", base64.b64encode(value).rstrip(b"=")
    yield "base64url", base64.urlsafe_b64encode(value).rstrip(b"=")
    yield "hex", value.hex().encode()


def _needles(key_files: Iterable[Path]) -> list[tuple[str, bytes]]:
    needles = [(f"Secret value {v[:4]}…", form) for v in _SECRETS for _, form in _forms(v.encode())]
    for key_file in key_files:
        try:
            key = key_file.read_bytes().strip()
        except OSError:
            continue
        if len(key) >= 16:
            needles += [(f"JWT key {key_file} ({how})", form) for how, form in _forms(key)]
    return needles


def scan_bytes(where: str, data: bytes, needles: list[tuple[str, bytes]]) -> list[str]:
    found = [f"{where}: {what}" for what, needle in needles if needle and needle in data]
    if _JWT.search(data.decode("utf-8", "replace")):
        found.append(f"{where}: a JWT")
    return found


def _changed_files(root: Path, since: float) -> Iterator[Path]:
    for dirpath, _dirs, filenames in os.walk(root, followlinks=False):
        for name in filenames:
            if name not in _STAGED:
                continue
            path = Path(dirpath) / name
            try:
                st = path.lstat()
            except OSError:
                continue
            if path.is_symlink() or not path.is_file() or st.st_size > _MAX_FILE:
                continue
            if st.st_mtime >= since:
                yield path


def scan(
    *,
    storage_roots: Iterable[Path],
    key_files: Iterable[Path],
    since: float,
    operator_logs: Iterable[Path] = (),
    kube_json: str | None = None,
) -> list[str]:
    """Every leak found (empty: none)."""
    needles = _needles(key_files)
    found: list[str] = []
    for root in storage_roots:
        for path in _changed_files(root, since):
            try:
                found += scan_bytes(str(path), path.read_bytes(), needles)
            except OSError:
                continue  # removed meanwhile, or not ours to read
    for path in operator_logs:
        try:
            found += scan_bytes(str(path), path.read_bytes(), needles)
        except OSError:
            continue
    if kube_json is not None:
        for item in json.loads(kube_json).get("items", []):
            kind = item.get("kind", "?")
            meta = item.get("metadata") or {}
            where = f"{kind} {meta.get('namespace')}/{meta.get('name')}"
            found += scan_bytes(where, json.dumps(item).encode(), needles)
    return found
