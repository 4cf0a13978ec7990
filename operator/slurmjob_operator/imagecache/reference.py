"""OCI image references (`spec.framework.image`), parsed strictly.

The grammar is the distribution reference's (github.com/distribution/reference), narrowed:

- the registry host is explicit: the first component has a '.' or a ':' or is `localhost`
  (no implicit docker.io: a tenant lists the registries it may pull from);
- exactly one of a tag (`:tag`, no implicit `:latest`) and a digest (`@sha256:<64 hex>`, the
  only algorithm);
- no IPv6 literal hosts; at most `MAX_REFERENCE_LENGTH` characters.

The text comes from a tenant and its parts end up in paths, URIs and a batch script, so the
parser is hand-written: splits on fixed characters and per-character checks of bounded
parts, linear in the input with no regular expression at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_REFERENCE_LENGTH = 512
#: distribution's limit on `registry/repository`.
MAX_NAME_LENGTH = 255
MAX_TAG_LENGTH = 128
MAX_HOST_LENGTH = 253
MAX_HOST_LABEL_LENGTH = 63
DIGEST_ALGORITHM = "sha256"
DIGEST_HEX_LENGTH = 64
LOCALHOST = "localhost"

_LOWER = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
_UPPER = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_ALNUM = _LOWER | _UPPER
_HEX = frozenset("0123456789abcdef")
_DIGITS = frozenset("0123456789")
_TAG_FIRST = _ALNUM | {"_"}
_TAG_REST = _TAG_FIRST | {".", "-"}
_HOST_LABEL = _ALNUM | {"-"}
#: Every character a reference may hold; anything else is refused before any splitting.
_ALPHABET = _ALNUM | frozenset("._-:/@")
_SHOWN = 80


class ImageReferenceError(ValueError):
    """The text is not an image reference this operator accepts; the message says why."""


def _shown(text: str) -> str:
    # A refused reference is echoed into a status message: bounded, control characters escaped.
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")


@dataclass(frozen=True)
class ImageReference:
    """A parsed reference; build it with `parse_reference`. Exactly one of `tag` and
    `digest` is set; `registry` is lowercase."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def is_digest(self) -> bool:
        return self.digest is not None

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.repository.split("/"))

    @property
    def _suffix(self) -> str:
        return f"@{self.digest}" if self.digest is not None else f":{self.tag}"

    @property
    def canonical(self) -> str:
        """The one spelling of this reference (`parse_reference(r.canonical) == r`)."""
        return f"{self.registry}/{self.repository}{self._suffix}"

    def __str__(self) -> str:
        return self.canonical

    def with_digest(self, digest: str) -> ImageReference:
        """The same repository pinned to `digest` (what a tag resolved to)."""
        _check_digest(digest, f"image {_shown(self.canonical)}")
        return ImageReference(self.registry, self.repository, None, digest)

    def matches_registry(self, allowed: Sequence[str]) -> bool:
        """Whether an entry of `allowed` (`host[:port]` optionally followed by a path
        prefix, `nvcr.io/nvidia`) covers this reference: the same host and port, and the
        prefix's components leading the repository's (whole components: `nvcr.io/nv` does
        not cover `nvcr.io/nvidia/x`). Raises `ImageReferenceError` for a malformed entry."""
        mine = self.path
        for entry in allowed:
            prefix = parse_registry_prefix(entry)
            if prefix.registry == self.registry and mine[: len(prefix.path)] == prefix.path:
                return True
        return False

    def enroot_uri(self) -> str:
        """`enroot import`'s URI: `docker://HOST[:PORT]#REPO:TAG` (or `@sha256:...`)."""
        return f"docker://{self.registry}#{self.repository}{self._suffix}"

    def apptainer_uri(self) -> str:
        """`apptainer build`'s URI: `docker://HOST[:PORT]/REPO:TAG` (or `@sha256:...`)."""
        return f"docker://{self.registry}/{self.repository}{self._suffix}"


@dataclass(frozen=True)
class RegistryPrefix:
    """An allow-list entry: a registry and a (possibly empty) leading repository path."""

    registry: str
    path: tuple[str, ...] = ()


def parse_reference(text: str) -> ImageReference:
    """The reference `text` names, or an `ImageReferenceError` naming what is wrong."""
    if not isinstance(text, str):
        raise ImageReferenceError(f"an image reference is a string, not {type(text).__name__}")
    where = f"image {_shown(text)}"
    if not text:
        raise ImageReferenceError("image: empty reference")
    if len(text) > MAX_REFERENCE_LENGTH:
        raise ImageReferenceError(
            f"{where}: {len(text)} characters, more than {MAX_REFERENCE_LENGTH}"
        )
    _check_alphabet(text, where)
    name, at, digest = text.partition("@")
    if at:
        if "@" in digest:
            raise ImageReferenceError(f"{where}: more than one '@'")
        _check_digest(digest, where)
    host, slash, rest = name.partition("/")
    if not slash:
        raise ImageReferenceError(
            f"{where}: names no repository; write registry/repository:tag (there is no "
            "implicit registry)"
        )
    registry = _checked_host(host, where)
    # Repository components hold no ':', so the first one in `rest` starts the tag.
    repository, colon, tag = rest.partition(":")
    if colon:
        if ":" in tag:
            raise ImageReferenceError(f"{where}: more than one ':' after the registry")
        _check_tag(tag, where)
    _check_path(repository, where)
    if len(name) > MAX_NAME_LENGTH:
        raise ImageReferenceError(
            f"{where}: registry and repository are {len(name)} characters, more than "
            f"{MAX_NAME_LENGTH}"
        )
    if colon and at:
        raise ImageReferenceError(f"{where}: names both a tag and a digest; name one of them")
    if not colon and not at:
        raise ImageReferenceError(
            f"{where}: names neither a tag nor a digest; write :<tag> or @sha256:<hex> "
            "(there is no implicit :latest)"
        )
    return ImageReference(registry, repository, tag if colon else None, digest if at else None)


def parse_registry_prefix(text: str) -> RegistryPrefix:
    """An allow-list entry `host[:port][/path/prefix]`, or an `ImageReferenceError`."""
    where = f"registry {_shown(text)}"
    if not text:
        raise ImageReferenceError("registry: empty entry")
    if len(text) > MAX_NAME_LENGTH:
        raise ImageReferenceError(f"{where}: more than {MAX_NAME_LENGTH} characters")
    _check_alphabet(text, where)
    if "@" in text:
        raise ImageReferenceError(f"{where}: a registry entry names no tag or digest")
    host, slash, rest = text.partition("/")
    registry = _checked_host(host, where)
    if not slash:
        return RegistryPrefix(registry)
    if ":" in rest:
        raise ImageReferenceError(f"{where}: a registry entry names no tag")
    _check_path(rest, where)
    return RegistryPrefix(registry, tuple(rest.split("/")))


def _check_alphabet(text: str, where: str) -> None:
    for char in text:
        if char not in _ALPHABET:
            hint = " (IPv6 literal hosts are not supported)" if char in "[]" else ""
            raise ImageReferenceError(
                f"{where}: character {char!r} is not allowed (letters, digits, '.', '_', "
                f"'-', ':', '/', '@'){hint}"
            )


def _check_digest(digest: str, where: str) -> None:
    algorithm, colon, hexes = digest.partition(":")
    if not colon or algorithm != DIGEST_ALGORITHM:
        raise ImageReferenceError(
            f"{where}: digest {_shown(digest)} is not sha256:<64 hex digits> (sha256 is the "
            "only digest algorithm accepted)"
        )
    if len(hexes) != DIGEST_HEX_LENGTH or not set(hexes) <= _HEX:
        raise ImageReferenceError(
            f"{where}: digest {_shown(digest)} must be sha256: followed by exactly "
            f"{DIGEST_HEX_LENGTH} lowercase hex digits"
        )


def _is_host_word(host: str) -> bool:
    return "." in host or ":" in host or host == LOCALHOST


def _checked_host(host: str, where: str) -> str:
    """`host[:port]` lowercased, or an error."""
    if not _is_host_word(host):
        raise ImageReferenceError(
            f"{where}: no registry host: the first component {_shown(host)} must be a host "
            "name with a '.' or a port, or localhost (there is no implicit docker.io; write "
            "docker.io/library/ubuntu:24.04)"
        )
    domain, colon, port = host.partition(":")
    if colon:
        if not port or not set(port) <= _DIGITS or len(port) > 5:
            raise ImageReferenceError(f"{where}: port {_shown(port)} is not a number")
        if port[0] == "0" or int(port) > 65535:
            raise ImageReferenceError(
                f"{where}: port {port} must be 1 to 65535, without leading zeros"
            )
    if not domain or len(domain) > MAX_HOST_LENGTH:
        raise ImageReferenceError(f"{where}: registry host must be 1 to {MAX_HOST_LENGTH} chars")
    for label in domain.split("."):
        if (
            not label
            or len(label) > MAX_HOST_LABEL_LENGTH
            or not set(label) <= _HOST_LABEL
            or label[0] == "-"
            or label[-1] == "-"
        ):
            raise ImageReferenceError(
                f"{where}: host label {_shown(label)} must be 1 to {MAX_HOST_LABEL_LENGTH} "
                "letters, digits or '-', not starting or ending with '-'"
            )
    return host.lower()


def _check_tag(tag: str, where: str) -> None:
    if not tag or len(tag) > MAX_TAG_LENGTH:
        raise ImageReferenceError(f"{where}: a tag has 1 to {MAX_TAG_LENGTH} characters")
    if tag[0] not in _TAG_FIRST or not set(tag) <= _TAG_REST:
        raise ImageReferenceError(
            f"{where}: tag {_shown(tag)} must be letters, digits, '_', '.' or '-', not "
            "starting with '.' or '-'"
        )


def _check_path(path: str, where: str) -> None:
    for component in path.split("/"):
        problem = _component_problem(component)
        if problem:
            raise ImageReferenceError(f"{where}: {problem}")


def _component_problem(component: str) -> str | None:
    """Why `component` is not `[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*`, else None."""
    if not component:
        return "empty repository path component ('//', or '/' at the start or end)"
    if any(char in _UPPER for char in component):
        return f"repository path {_shown(component)} must be lowercase"
    if component[0] not in _LOWER or component[-1] not in _LOWER:
        return (
            f"repository path component {_shown(component)} must start and end with a "
            "lowercase letter or digit"
        )
    i, n = 0, len(component)
    while i < n:
        if component[i] in _LOWER:
            i += 1
            continue
        j = i
        while j < n and component[j] not in _LOWER:
            j += 1
        separator = component[i:j]
        if separator not in (".", "_", "__") and set(separator) != {"-"}:
            return (
                f"repository path component {_shown(component)}: separator "
                f"{_shown(separator)} is not allowed (one '.', one or two '_', or dashes)"
            )
        i = j
    return None
