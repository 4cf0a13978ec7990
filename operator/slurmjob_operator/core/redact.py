"""Hiding secret values in text the operator publishes (the log tails in the status).

`Redactor(values)` prepares, once, the forms in which a value realistically reaches a log:

- the value as is, and each line of a multi-line value (a PEM key cut by the line cap);
- JSON-escaped (`json.dumps` with and without `ensure_ascii`, with `/` escaped as `\\/`, and
  with `<`, `>`, `&` as `\\u003c`... as Go's encoder writes them): a value logged inside JSON;
- URL-encoded (`quote` keeping `/` and not, `quote_plus`; upper- and lower-case hex digits):
  a value in a URL, a query or a form body;
- base64 of the value's UTF-8 bytes, standard and URL-safe alphabets: the whole encoding (with
  and without padding) and, for each of the three byte alignments the value can have inside a
  longer base64 stream, the characters that encode the value's bytes alone (a token inside an
  encoded `user:token` header, a base64'd config file, `echo "$TOKEN" | base64`).

`redact` replaces every occurrence of every form by `***`. It searches the text with its line
breaks (`\\n`, `\\r`) taken out and maps the hits back, so a value split over lines at any
point (a terminal's wrap, `base64`'s 76 columns, a logger's line limit) is found too. A hit
keeps the line breaks inside it (each run of other characters becomes `***`), so the tail's
line count stays what the job wrote. With `cut_start`/`cut_end` (the text begins or ends in
the middle of a line) a form's end at the start, or its beginning at the end, of at least
`MIN_REDACT_LENGTH` characters is replaced as well: the cut, or a writer still half-way
through, may have split the value.

Time is linear in the text for a fixed set of values: plain substring search over a fixed list
of forms (no regular expression is ever built from a value, so nothing can backtrack), and the
cut edges use a prefix function, linear in the form's length.

Not covered (a job that means to leak a value can always re-encode it; this guards against
accidents): other encodings (hex, base32, compression, reversal, case changes), encodings of
encodings (URL-encoded base64, JSON-escaped base64 with escapes inside), a value interleaved
with anything but line breaks (spaces, ANSI colour codes, backspaces), a fragment of a value
inside the text (only the whole value, or a fragment at the tail's cut edges), the trailing
base64 characters that mix a value's last bits with the bytes after it (at most one character,
under 6 bits of the value), and values shorter than `MIN_REDACT_LENGTH`: replacing every "1"
or "abc" would wreck the log, so such values are refused when the job is submitted.
"""

from __future__ import annotations

import base64
import json
import re
from bisect import bisect_right
from collections.abc import Iterable
from urllib.parse import quote, quote_plus

__all__ = ["MIN_REDACT_LENGTH", "REDACTED", "Redactor", "redact_text"]

#: Shorter values cannot be hidden without wrecking the log; they are refused at submit.
MIN_REDACT_LENGTH = 4
REDACTED = "***"

_BREAKS = "\r\n"
_BREAK_RE = re.compile("[\r\n]")  # fixed: never built from a value
_URLSAFE = str.maketrans("+/", "-_")
_GO_HTML = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"}


def _json_forms(value: str) -> set[str]:
    forms = {json.dumps(value, ensure_ascii=ascii_only)[1:-1] for ascii_only in (True, False)}
    more = set()
    for form in forms:
        more.add(form.replace("/", "\\/"))
        html = form
        for char, escaped in _GO_HTML.items():
            html = html.replace(char, escaped)
        more.add(html)
    return forms | more


def _lower_hex(form: str) -> str:
    """`%2F` -> `%2f`: both spellings of percent-encoding are common."""
    parts = form.split("%")
    return parts[0] + "".join(p[:2].lower() + p[2:] for p in parts[1:])


def _url_forms(value: str) -> set[str]:
    forms = {quote(value, safe=""), quote(value), quote_plus(value, safe=""), quote_plus(value)}
    return forms | {_lower_hex(f) for f in forms}


def _base64_forms(data: bytes) -> set[str]:
    """The whole encoding, and for each alignment inside a longer stream the characters that
    depend on `data` alone: with `k` bytes before it in its 3-byte group, character `i` of
    the encoding of (k bytes + data) covers bits [6i, 6i+6), which are all data bits when
    6i >= 8k and 6i + 6 <= 8(k + len(data))."""
    whole = base64.b64encode(data).decode()
    forms = {whole, whole.rstrip("=")}
    for k in range(3):
        encoded = base64.b64encode(bytes(k) + data).decode()
        forms.add(encoded[-(-8 * k // 6) : 8 * (k + len(data)) // 6])
    return forms | {f.translate(_URLSAFE) for f in forms}


def _forms(value: str) -> set[str]:
    forms = {value}
    if "\n" in value or "\r" in value:
        forms.update(value.splitlines())
    forms |= _json_forms(value) | _url_forms(value) | _base64_forms(value.encode("utf-8"))
    stripped = {_strip(f) for f in forms}
    return {f for f in stripped if len(f) >= MIN_REDACT_LENGTH}


def _strip(text: str) -> str:
    return text.replace("\r", "").replace("\n", "")


def _overlap(left: str, right: str) -> int:
    """The length of the longest suffix of `left` that is a prefix of `right` (the prefix
    function of right + separator + left; the separator never matches, so it is at most
    min(len(left), len(right)))."""
    seq: list[str | None] = [*right[: len(left)], None, *left]
    pi = [0] * len(seq)
    for i in range(1, len(seq)):
        k = pi[i - 1]
        while k and seq[i] != seq[k]:
            k = pi[k - 1]
        if seq[i] == seq[k]:
            k += 1
        pi[i] = k
    return pi[-1]


class Redactor:
    """The forms of a set of secret values, ready to be searched for in any number of texts."""

    def __init__(self, values: Iterable[str]) -> None:
        forms: set[str] = set()
        for value in values:
            if len(value) >= MIN_REDACT_LENGTH:
                forms |= _forms(value)
        self._forms = sorted(forms, key=lambda f: (-len(f), f))

    def __bool__(self) -> bool:
        return bool(self._forms)

    def __repr__(self) -> str:  # never the values
        return f"Redactor({len(self._forms)} forms)"

    def _hits(self, flat: str, cut_start: bool, cut_end: bool) -> list[tuple[int, int]]:
        hits: list[tuple[int, int]] = []
        for form in self._forms:
            # Overlapping occurrences too ("abab" in "ababab"): every one must be covered.
            at = flat.find(form)
            while at >= 0:
                hits.append((at, at + len(form)))
                at = flat.find(form, at + 1)
            if cut_start:
                k = _overlap(form, flat)
                if MIN_REDACT_LENGTH <= k < len(form):
                    hits.append((0, k))
            if cut_end:
                k = _overlap(flat[-len(form) :], form)
                if MIN_REDACT_LENGTH <= k < len(form):
                    hits.append((len(flat) - k, len(flat)))
        return hits

    def redact(
        self, text: str, *, cut_start: bool = False, cut_end: bool = False, start: int = 0
    ) -> str:
        """`text` with every form replaced (see the module docstring).

        With `start`, only `text[start:]` is returned, redacted as a part of the whole: a
        value that begins before `start` and ends after it is replaced from `start` on. A
        reader that goes on from where it stopped passes the text it already gave out as
        context, so a value split between two reads is still found whole."""
        if not 0 <= start <= len(text):
            raise ValueError(f"start {start} is outside the text")
        if not self._forms or not text:
            return text[start:]
        flat = _strip(text)
        hits = self._hits(flat, cut_start, cut_end)
        if not hits:
            return text[start:]
        # Original index of flat index s: s plus the breaks at or before it. Break j (at
        # original position b) is followed by flat index b - j, so count those <= s.
        breaks = [m.start() for m in _BREAK_RE.finditer(text)] if flat != text else []
        after = [b - j for j, b in enumerate(breaks)]

        def original(s: int) -> int:
            return s + bisect_right(after, s)

        out: list[str] = []
        done = start  # original index up to which `out` is complete
        hits.sort()
        first, end = hits[0]
        for s, e in [*hits[1:], (len(flat) + 1, len(flat) + 1)]:
            if s < end:
                end = max(end, e)
                continue
            lo, hi = original(first), original(end - 1) + 1
            if hi > start:  # a hit inside the context alone is not given out
                lo = max(lo, start)
                out.append(text[done:lo])
                out.append(_replace_keeping_breaks(text[lo:hi]))
                done = hi
            first, end = s, e
        out.append(text[done:])
        return "".join(out)


def _replace_keeping_breaks(span: str) -> str:
    """Each run of non-break characters of `span` as `***`, its line breaks kept."""
    out: list[str] = []
    run = False
    for char in span:
        if char in _BREAKS:
            out.append(char)
            run = False
        elif not run:
            out.append(REDACTED)
            run = True
    return "".join(out)


def redact_text(
    text: str, redact: Iterable[str], *, cut_start: bool = False, cut_end: bool = False
) -> str:
    """`text` with every secret value (length >= 4), in every form `Redactor` knows, replaced
    by `***`; see the module docstring for `cut_start` and `cut_end`."""
    return Redactor(redact).redact(text, cut_start=cut_start, cut_end=cut_end)
