"""Redaction (`core.redact`): every form a value realistically takes in a log is hidden, also
split over lines; properties by hypothesis, one per encoding (issue 9, redaction gaps)."""

from __future__ import annotations

import base64
import json
import time
from urllib.parse import quote, quote_plus

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from slurmjob_operator.core.redact import MIN_REDACT_LENGTH, Redactor, redact_text

# No "*": "***" next to a leftover "a" could spell a secret "a***" again; not a real secret.
SECRET_ALPHABET = st.characters(
    blacklist_categories=["Cs"], blacklist_characters="*\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
)
secrets_ = st.text(alphabet=SECRET_ALPHABET, min_size=MIN_REDACT_LENGTH, max_size=40)
ascii_secrets = st.text(
    alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~+/=&?:@ \"'\\<>",
    min_size=MIN_REDACT_LENGTH,
    max_size=40,
)
context = st.text(alphabet="xyz ,.;\n", max_size=40)


def flat(text: str) -> str:
    return text.replace("\r", "").replace("\n", "")


def hidden(form: str, text: str) -> bool:
    """`form` appears neither in `text` nor in `text` with its line breaks removed."""
    return form not in text and flat(form) not in flat(text)


@settings(max_examples=300)
@given(secret=secrets_, before=context, after=context)
def test_the_raw_value(secret: str, before: str, after: str) -> None:
    out = redact_text(before + secret + after, [secret])
    assert hidden(secret, out)
    assert out.count("\n") == (before + after).count("\n")


@settings(max_examples=300)
@given(secret=secrets_, before=context, after=context, ascii_only=st.booleans())
def test_json_escaped(secret: str, before: str, after: str, ascii_only: bool) -> None:
    doc = json.dumps({"token": secret, "n": 1}, ensure_ascii=ascii_only)
    out = redact_text(before + doc + after, [secret])
    assert hidden(json.dumps(secret, ensure_ascii=ascii_only)[1:-1], out)
    assert '"n": 1' in out


@settings(max_examples=300)
@given(secret=ascii_secrets, before=context, after=context)
def test_json_escaped_the_way_go_writes_it(secret: str, before: str, after: str) -> None:
    form = json.dumps(secret)[1:-1]
    for char, escaped in {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"}.items():
        form = form.replace(char, escaped)
    out = redact_text(before + form + after, [secret])
    assert hidden(form, out)
    slashed = json.dumps(secret)[1:-1].replace("/", "\\/")
    assert hidden(slashed, redact_text(before + slashed + after, [secret]))


@settings(max_examples=300)
@given(secret=secrets_, before=context, after=context, lower=st.booleans())
def test_url_encoded(secret: str, before: str, after: str, lower: bool) -> None:
    for form in (quote(secret, safe=""), quote(secret), quote_plus(secret)):
        if lower:
            parts = form.split("%")
            form = parts[0] + "".join(p[:2].lower() + p[2:] for p in parts[1:])
        url = f"https://example.org/x?token={form}&n=1"
        out = redact_text(before + url + after, [secret])
        assert hidden(form, out)
        assert "&n=1" in out


@settings(max_examples=300)
@given(secret=secrets_, before=context, after=context, urlsafe=st.booleans())
def test_base64_whole(secret: str, before: str, after: str, urlsafe: bool) -> None:
    encode = base64.urlsafe_b64encode if urlsafe else base64.b64encode
    data = secret.encode()
    own = encode(data).decode()[: 8 * len(data) // 6]  # the characters of the value alone
    for form in (encode(data).decode(), encode(data + b"\n").decode()):  # echo "$T" | base64
        out = redact_text(before + form + after, [secret])
        assert form not in out
        assert own not in flat(out)


def _secret_chars(prefix: int, size: int) -> tuple[int, int]:
    """The characters of a base64 stream that encode bytes [prefix, prefix + size) alone:
    character i covers bits [6i, 6i + 6)."""
    first = next(i for i in range(10**6) if 6 * i >= 8 * prefix)
    last = max(i for i in range(first, first + size * 2) if 6 * i + 6 <= 8 * (prefix + size))
    return first, last + 1


@settings(max_examples=500)
@given(
    secret=secrets_,
    prefix=st.binary(max_size=20),
    suffix=st.binary(max_size=20),
    urlsafe=st.booleans(),
    wrap=st.one_of(st.none(), st.integers(min_value=1, max_value=80)),
)
def test_base64_inside_a_longer_stream(
    secret: str, prefix: bytes, suffix: bytes, urlsafe: bool, wrap: int | None
) -> None:
    """At any of the three alignments, and wrapped at any width (`base64` wraps at 76)."""
    # The label must survive, so it cannot hold the secret (a secret "data" hides it too).
    assume(secret not in "data: ")
    data = secret.encode()
    encode = base64.urlsafe_b64encode if urlsafe else base64.b64encode
    stream = encode(prefix + data + suffix).decode()
    first, end = _secret_chars(len(prefix), len(data))
    secret_part = stream[first:end]
    text = stream
    if wrap is not None:
        text = "\n".join(stream[i : i + wrap] for i in range(0, len(stream), wrap)) + "\n"
    out = redact_text("data: " + text, [secret])
    assert secret_part not in flat(out)
    assert flat(out).startswith("data: ")


@settings(max_examples=500)
@given(
    secret=secrets_,
    before=context,
    after=context,
    cut=st.integers(min_value=1),
    breaks=st.sampled_from(["\n", "\r\n", "\n\n", "\r"]),
)
def test_a_value_split_over_lines_at_any_point(
    secret: str, before: str, after: str, cut: int, breaks: str
) -> None:
    cut = 1 + cut % (len(secret) - 1)
    text = before + secret[:cut] + breaks + secret[cut:] + after
    out = redact_text(text, [secret])
    assert hidden(secret, out)
    assert out.count("\n") == text.count("\n"), "the line structure stays"
    assert out.count("\r") == text.count("\r")


@settings(max_examples=300)
@given(secret=secrets_, other=st.text(alphabet=" ,.;:!?()[]{}#~\n", max_size=200))
def test_text_without_the_value_is_untouched(secret: str, other: str) -> None:
    if any(c.isalnum() or c in "%" for c in secret):  # every form then has such a character
        assert redact_text(other, [secret]) == other


def test_short_values_are_not_searched() -> None:
    assert redact_text("a 123 b abc", ["123", "abc", ""]) == "a 123 b abc"
    assert not Redactor(["abc"])


def test_overlapping_occurrences_are_all_hidden() -> None:
    assert redact_text("xabababy", ["abab"]) == "x***y"


def test_the_redactor_never_shows_its_values() -> None:
    assert "hunter22" not in repr(Redactor(["hunter22"]))


def test_time_is_linear_even_for_a_worst_case() -> None:
    """64 KiB of one character and a value made of it (every position a hit), and a value
    that almost matches everywhere: both well under a second."""
    text = "a" * 65536
    started = time.monotonic()
    assert redact_text(text, ["a" * 40]) == "***"
    redact_text(text + "\n", ["a" * 4000 + "b"], cut_start=True, cut_end=True)
    many = [f"secret-{i:04d}-value" for i in range(50)]
    redact_text("".join(f"line {i} secret-{i:04d}-value\n" for i in range(3000)), many)
    assert time.monotonic() - started < 3.0
