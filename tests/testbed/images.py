"""The container images every test-bed job runs in, built by tests/testbed/images.sh (run by
`make testbed`) and cached by content under /var/cache/slurmjob-testbed/images.

images.sh writes ``images/current``: one ``NAME=DIRECTORY`` line per image, each directory
holding ``image.sqsh`` (Enroot/Pyxis) and ``image.sif`` (Apptainer) of the same root
filesystem (Debian trixie: neither the host's release nor the chroot's)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

CACHE_DIR = Path("/var/cache/slurmjob-testbed")
CURRENT = CACHE_DIR / "images" / "current"
#: The marker each image carries, read by tests from inside the container.
MARKER = "/etc/slurmjob-testbed-image"


class ImagesMissing(RuntimeError):
    pass


def _directories() -> dict[str, Path]:
    try:
        text = CURRENT.read_text()
    except FileNotFoundError:
        raise ImagesMissing(
            f"{CURRENT} is missing: run `make testbed` (tests/testbed/images.sh) first"
        ) from None
    found: dict[str, Path] = {}
    for line in text.splitlines():
        name, sep, directory = line.strip().partition("=")
        if sep and name and directory:
            found[name] = Path(directory)
    return found


def image(name: str, fmt: str) -> Path:
    """The file of image ``name`` in format ``sif`` or ``sqsh``."""
    directory = _directories().get(name)
    if directory is None:
        raise ImagesMissing(f"{CURRENT} names no image {name!r}: run `make testbed`")
    path = directory / ("image.sif" if fmt == "sif" else "image.sqsh")
    if not (directory / ".complete").is_file() or not path.is_file():
        raise ImagesMissing(f"{path} is missing or incomplete: run `make testbed`")
    return path


@functools.cache
def sha256(path: Path) -> str:
    """The file's sha256 (images are immutable once complete: hashed once per process)."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
