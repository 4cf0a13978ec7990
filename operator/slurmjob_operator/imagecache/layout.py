"""Where the image cache keeps things, and the names that tie a record to its import jobs.

Under the site's cache root (all on one filesystem, so the import's rename is atomic):

- `entries/<scope>/sha256-<hex>.<sqsh|sif>`: the published images, one per (scope, digest,
  format); `<scope>` is `public` or `tenant-<tenant>`;
- `locks/<scope>/sha256-<hex>.<sqsh|sif>.lock`: the import's lock per entry (flock), never
  unlinked: unlinking a lock file another process holds open lets a third lock a new one;
- `tmp/<job name>/`: one import attempt's work directory;
- `results/<job name>.result`: the attempt's result file (`record.ImportResult`), named by
  the job, not the digest: for a tag the operator learns the digest from this file;
- `logs/<job name>.log`: the attempt's output.

An import job's name (`slurmjob-import-<hash12>-<n>`) comes from the record key, the record's
epoch (its creation second: a record deleted and created again never reuses a name another
job of the same key already had) and the attempt number. Every word derived here is a safe
word (`is_safe_word`): no space, quote, '/', leading '-' or '.'.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import PurePosixPath

from slurmjob_operator.imagecache.reference import DIGEST_ALGORITHM, ImageReference
from slurmjob_operator.site.catalogs import ArtifactFormat

PUBLIC_SCOPE = "public"
TENANT_SCOPE_PREFIX = "tenant-"
ENTRIES_DIR = "entries"
LOCKS_DIR = "locks"
TMP_DIR = "tmp"
RESULTS_DIR = "results"
LOGS_DIR = "logs"
LOCK_SUFFIX = ".lock"
RESULT_SUFFIX = ".result"
LOG_SUFFIX = ".log"
IMPORT_JOB_PREFIX = "slurmjob-import-"
RECORD_KEY_PREFIX = "image-"
#: A Kubernetes object name usable as a label value too (DNS-1123 label).
RECORD_KEY_MAX = 63
_KEY_HASH = 16
_KEY_SLUG_MAX = RECORD_KEY_MAX - len(RECORD_KEY_PREFIX) - 1 - _KEY_HASH
_JOB_HASH = 12
MAX_WORD = 255
DNS_LABEL_MAX = 63

_LOWER = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
_ALNUM = _LOWER | frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_SAFE = _ALNUM | frozenset("._-")
_HEX = frozenset("0123456789abcdef")


def is_safe_word(word: str) -> bool:
    """A path component or shell word that needs no quoting and cannot be an option: 1 to 255
    of `[A-Za-z0-9._-]`, starting with a letter or digit (so never '.', '..' or '-x')."""
    return 0 < len(word) <= MAX_WORD and word[0] in _ALNUM and set(word) <= _SAFE


def _safe(word: str) -> str:
    # Every name below is built from checked parts; this is the last line should one not be.
    if not is_safe_word(word):
        raise ValueError(f"{word!r} is not a safe path word")
    return word


def is_dns_label(text: str) -> bool:
    return (
        0 < len(text) <= DNS_LABEL_MAX
        and set(text) <= _LOWER | {"-"}
        and text[0] != "-"
        and text[-1] != "-"
    )


def scope_word(tenant: str | None) -> str:
    """The scope of a tenant's own entries (`tenant-<name>`), or `public` for None."""
    if tenant is None:
        return PUBLIC_SCOPE
    if not is_dns_label(tenant):
        raise ValueError(f"tenant {tenant!r} is not a DNS label")
    return TENANT_SCOPE_PREFIX + tenant


def scope_tenant(scope: str) -> str | None:
    """The tenant a scope belongs to (None: shared), or a ValueError for a malformed scope."""
    if scope == PUBLIC_SCOPE:
        return None
    tenant = scope.removeprefix(TENANT_SCOPE_PREFIX)
    if tenant == scope or not is_dns_label(tenant):
        raise ValueError(f"scope {scope!r} is neither {PUBLIC_SCOPE!r} nor tenant-<DNS label>")
    return tenant


def digest_hex(digest: str) -> str:
    algorithm, _, hexes = digest.partition(":")
    if algorithm != DIGEST_ALGORITHM or len(hexes) != 64 or not set(hexes) <= _HEX:
        raise ValueError(f"{digest!r} is not a sha256 digest")
    return hexes


def entry_file_name(digest: str, fmt: ArtifactFormat) -> str:
    """`sha256-<hex>.<sqsh|sif>`: the cache file of one digest in one format."""
    return _safe(f"{DIGEST_ALGORITHM}-{digest_hex(digest)}.{fmt.value}")


def _hash(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def record_key(scope: str, reference: ImageReference) -> str:
    """The record's name: `image-<slug>-<hash16>`, a DNS-1123 label of at most 63
    characters; the hash is of the scope and the canonical reference, the slug (the last
    repository component) is only there for people."""
    scope_tenant(scope)
    slug = "".join(c if c in _LOWER else "-" for c in reference.path[-1])
    slug = "-".join(part for part in slug.split("-") if part)[:_KEY_SLUG_MAX].strip("-")
    digest = _hash(f"{scope}\n{reference.canonical}", _KEY_HASH)
    key = f"{RECORD_KEY_PREFIX}{slug or 'x'}-{digest}"
    if not is_dns_label(key):  # pragma: no cover - by construction
        raise ValueError(f"record key {key!r} is not a DNS label")
    return key


def import_job_name(key: str, epoch: int, attempt: int) -> str:
    """`slurmjob-import-<hash12>-<n>`: one name per attempt of one record's life, short
    enough for any Slurm (job names are cut at 1024 characters; squeue shows far fewer)."""
    if not is_dns_label(key):
        raise ValueError(f"record key {key!r} is not a DNS label")
    if attempt < 1 or epoch < 0:
        raise ValueError("attempts count from 1; the epoch is a Unix time")
    seed = f"{key}\n{epoch}"
    return _safe(f"{IMPORT_JOB_PREFIX}{_hash(seed, _JOB_HASH)}-{attempt}")


def runtime_uri(reference: ImageReference, fmt: ArtifactFormat) -> str:
    """What the import passes to its runtime: Enroot's URI for SQSH, Apptainer's for SIF."""
    return reference.enroot_uri() if fmt is ArtifactFormat.SQSH else reference.apptainer_uri()


@dataclass(frozen=True)
class CacheLayout:
    """The paths of one cache root, as the nodes and the operator see it (a site setting)."""

    root: PurePosixPath

    def __post_init__(self) -> None:
        root = PurePosixPath(self.root)
        if not root.is_absolute() or any(not is_safe_word(p) for p in root.parts[1:]):
            raise ValueError(
                f"image cache root {str(root)!r} must be an absolute path of safe words "
                "([A-Za-z0-9._-], no '..')"
            )
        object.__setattr__(self, "root", root)

    def scope_dir(self, scope: str) -> PurePosixPath:
        scope_tenant(scope)
        return self.root / ENTRIES_DIR / _safe(scope)

    def entry_path(self, scope: str, digest: str, fmt: ArtifactFormat) -> PurePosixPath:
        return self.scope_dir(scope) / entry_file_name(digest, fmt)

    def lock_path(self, scope: str, digest: str, fmt: ArtifactFormat) -> PurePosixPath:
        scope_tenant(scope)
        name = entry_file_name(digest, fmt) + LOCK_SUFFIX
        return self.root / LOCKS_DIR / _safe(scope) / name

    def temp_dir(self, job_name: str) -> PurePosixPath:
        return self.root / TMP_DIR / _safe(job_name)

    def result_path(self, job_name: str) -> PurePosixPath:
        return self.root / RESULTS_DIR / (_safe(job_name) + RESULT_SUFFIX)

    def log_path(self, job_name: str) -> PurePosixPath:
        return self.root / LOGS_DIR / (_safe(job_name) + LOG_SUFFIX)

    def is_entry_path(self, path: str) -> bool:
        """Whether `path` is an entry file of this cache (a record's path is checked
        before anything acts on it)."""
        candidate = PurePosixPath(path)
        parts = candidate.parts
        if str(candidate) != path or candidate.parent.parent != self.root / ENTRIES_DIR:
            return False
        try:
            scope_tenant(parts[-2])
        except ValueError:
            return False
        name = parts[-1]
        stem, dot, suffix = name.rpartition(".")
        return (
            dot == "."
            and suffix in {f.value for f in ArtifactFormat}
            and stem.startswith(f"{DIGEST_ALGORITHM}-")
            and len(stem) == len(DIGEST_ALGORITHM) + 1 + 64
            and set(stem[len(DIGEST_ALGORITHM) + 1 :]) <= _HEX
        )
