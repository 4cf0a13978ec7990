"""OCI references (imagecache/reference.py): the distribution grammar narrowed to an explicit
registry and exactly one tag or digest, parsed without a regular expression."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmjob_operator.imagecache.reference import (
    MAX_REFERENCE_LENGTH,
    ImageReference,
    ImageReferenceError,
    parse_reference,
    parse_registry_prefix,
)

HEX = "0123456789abcdef" * 4
DIGEST = f"sha256:{HEX}"


@pytest.mark.parametrize(
    ("text", "registry", "repository", "tag", "digest"),
    [
        ("nvcr.io/nvidia/pytorch:24.01-py3", "nvcr.io", "nvidia/pytorch", "24.01-py3", None),
        ("docker.io/library/ubuntu:24.04", "docker.io", "library/ubuntu", "24.04", None),
        ("localhost/x:1", "localhost", "x", "1", None),
        ("localhost:5000/a/b/c:_t", "localhost:5000", "a/b/c", "_t", None),
        ("reg:443/a:latest", "reg:443", "a", "latest", None),
        ("Reg.Example.COM/a:T", "reg.example.com", "a", "T", None),
        (f"ghcr.io/o/r@{DIGEST}", "ghcr.io", "o/r", None, DIGEST),
        ("r.io/a.b/c__d/e-f/g---h/i_j:x", "r.io", "a.b/c__d/e-f/g---h/i_j", "x", None),
        ("r.io/a:" + "t" * 128, "r.io", "a", "t" * 128, None),
    ],
)
def test_accepted(
    text: str, registry: str, repository: str, tag: str | None, digest: str | None
) -> None:
    ref = parse_reference(text)
    assert ref == ImageReference(registry, repository, tag, digest)
    assert parse_reference(ref.canonical) == ref


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty"),
        ("ubuntu:24.04", "no repository"),
        ("library/ubuntu:24.04", "no registry host"),
        ("nvidia/pytorch:24.01", "implicit docker.io"),
        ("Localhost/x:1", "no registry host"),
        ("r.io/a", "neither a tag nor a digest"),
        (f"r.io/a:t@{DIGEST}", "both a tag and a digest"),
        ("r.io/a:t:u", "more than one ':'"),
        (f"r.io/a@{DIGEST}@{DIGEST}", "more than one '@'"),
        ("r.io/a@sha512:" + "0" * 128, "sha256 is the only"),
        ("r.io/a@sha256:" + "A" * 64, "lowercase hex"),
        ("r.io/a@sha256:" + "0" * 63, "exactly 64"),
        ("r.io/A:t", "must be lowercase"),
        ("r.io/a//b:t", "empty repository path component"),
        ("r.io/a/:t", "empty repository path component"),
        ("r.io/-a:t", "start and end"),
        ("r.io/a-:t", "start and end"),
        ("r.io/a..b:t", "separator '..'"),
        ("r.io/a___b:t", "separator '___'"),
        ("r.io/a._b:t", "separator '._'"),
        ("r.io/a:.t", "tag"),
        ("r.io/a:-t", "tag"),
        ("r.io/a:" + "t" * 129, "1 to 128"),
        ("r.io/a:", "1 to 128"),
        ("r.io:0/a:t", "1 to 65535"),
        ("r.io:65536/a:t", "1 to 65535"),
        ("r.io:0443/a:t", "leading zeros"),
        ("r.io:/a:t", "not a number"),
        ("r.io:12a/a:t", "not a number"),
        ("-r.io/a:t", "host label"),
        ("r..io/a:t", "host label"),
        ("r_x.io/a:t", "host label"),
        ("[::1]:5000/a:t", "IPv6"),
        ("r.io/a b:t", "character ' '"),
        ("r.io/a:t\n", "character '\\n'"),
        ("r.io/a;rm:t", "character ';'"),
        ("r.io/a:$(id)", "character '$'"),
        ("r.io/ä:t", "character 'ä'"),
        ("r.io/" + "a" * 260 + ":t", "more than 255"),
        ("r.io/" + "a" * 600 + ":t", f"more than {MAX_REFERENCE_LENGTH}"),
    ],
)
def test_refused_with_a_reason(text: str, says: str) -> None:
    with pytest.raises(ImageReferenceError) as caught:
        parse_reference(text)
    assert says in str(caught.value)
    assert len(str(caught.value)) < 400


def test_not_a_string_is_refused() -> None:
    with pytest.raises(ImageReferenceError, match="a string"):
        parse_reference(42)  # type: ignore[arg-type]


def test_runtime_uris() -> None:
    tag = parse_reference("nvcr.io/nvidia/pytorch:24.01-py3")
    assert tag.enroot_uri() == "docker://nvcr.io#nvidia/pytorch:24.01-py3"
    assert tag.apptainer_uri() == "docker://nvcr.io/nvidia/pytorch:24.01-py3"
    pinned = parse_reference(f"localhost:5000/a/b@{DIGEST}")
    assert pinned.enroot_uri() == f"docker://localhost:5000#a/b@{DIGEST}"
    assert pinned.apptainer_uri() == f"docker://localhost:5000/a/b@{DIGEST}"
    assert tag.with_digest(DIGEST).canonical == f"nvcr.io/nvidia/pytorch@{DIGEST}"
    with pytest.raises(ImageReferenceError):
        tag.with_digest("sha256:x")


@pytest.mark.parametrize(
    ("allowed", "expected"),
    [
        (["nvcr.io"], True),
        (["nvcr.io/nvidia"], True),
        (["nvcr.io/nvidia/pytorch"], True),
        (["nvcr.io/nv"], False),  # whole components only
        (["nvcr.io/nvidia/pytorch/x"], False),
        (["nvcr.io:443"], False),  # another port is another registry
        (["ghcr.io", "NVCR.IO/nvidia"], True),
        ([], False),
    ],
)
def test_matches_registry(allowed: list[str], expected: bool) -> None:
    assert parse_reference("nvcr.io/nvidia/pytorch:1").matches_registry(allowed) is expected


@pytest.mark.parametrize(
    "entry", ["", "nvcr", "nvcr.io/", "nvcr.io/A", "nvcr.io/a:t", "nvcr.io@x", "n io"]
)
def test_malformed_registry_entries_are_refused(entry: str) -> None:
    with pytest.raises(ImageReferenceError):
        parse_registry_prefix(entry)


def test_hostile_input_is_linear() -> None:
    # Inputs that take a backtracking matcher of the component grammar a long time.
    worst = ["r.io/" + "a-" * 250 + "!", "r.io/" + "a" * 500 + "_", "r.io/" + "a." * 250]
    start = time.perf_counter()
    for text in worst * 200:
        with pytest.raises(ImageReferenceError):
            parse_reference(text)
    assert time.perf_counter() - start < 1.0


_lower = st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=6)
_separator = st.sampled_from([".", "_", "__", "-", "--", "---"])
_component = st.builds(
    lambda first, rest: first + "".join(s + w for s, w in rest),
    _lower,
    st.lists(st.tuples(_separator, _lower), max_size=3),
)
_label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True)
_host = st.one_of(
    st.just("localhost"),
    st.builds(lambda labels: ".".join(labels), st.lists(_label, min_size=2, max_size=3)),
)
_registry = st.builds(
    lambda host, port: host if port is None else f"{host}:{port}",
    _host,
    st.one_of(st.none(), st.integers(min_value=1, max_value=65535)),
)
_tag = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}", fullmatch=True)
_digest = st.text("0123456789abcdef", min_size=64, max_size=64).map(lambda h: f"sha256:{h}")
references = st.builds(
    lambda registry, path, suffix: ImageReference(
        registry, "/".join(path), *((None, suffix[1]) if suffix[0] else (suffix[1], None))
    ),
    _registry,
    st.lists(_component, min_size=1, max_size=4),
    st.one_of(st.tuples(st.just(False), _tag), st.tuples(st.just(True), _digest)),
)


@settings(max_examples=200, deadline=None)
@given(ref=references)
def test_canonical_round_trip(ref: ImageReference) -> None:
    assert parse_reference(ref.canonical) == ref
    assert parse_reference(ref.canonical).canonical == ref.canonical
    assert ref.matches_registry([ref.registry])
    assert ref.matches_registry([f"{ref.registry}/{ref.path[0]}"])


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=80))
def test_any_text_parses_or_is_refused_with_a_value_error(text: str) -> None:
    try:
        ref = parse_reference(text)
    except ImageReferenceError:
        return
    assert parse_reference(ref.canonical) == ref
