"""The log API on the wire: what `kubectl slurmjob logs` asks and what the operator answers
(`logserver.py` serves it, `plugin/` reads it).

The operator serves an aggregated API, `logs.slurmjob.io/v1alpha1`, whose one resource is the
subresource `slurmjobs/log`; the plugin asks the kube-apiserver, which authenticates the user
and proxies the request over TLS with its front-proxy client certificate, naming the user in
`X-Remote-*` headers (docs/security.md, "The log endpoint"). No user credential reaches the
operator.

    GET /apis/logs.slurmjob.io/v1alpha1/namespaces/{namespace}/slurmjobs/{name}/log
        ?stream=stdout|stderr&attempt=N&index=I&offset=B&uid=U

Without `offset` the answer is the log's tail (at most 64 KiB and 2,000 lines, whole lines);
with it, the bytes from `offset` on (at most 64 KiB, up to the last line break read), so a
follower asks again from `nextOffset`. `GET /apis/logs.slurmjob.io/v1alpha1` is the API's
discovery (an APIResourceList). With `uid`, a SlurmJob deleted since is read from the log
archive (the one of that uid, while its namespace is the one it was archived from).

The query is parsed strictly: only these five parameters, each at most once, numbers as plain
decimal digits (`int()` would take "+1", " 1" and "1_000") and the uid as a lower-case UUID,
so what reaches a path is a small int or a checked uid, never free text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import StrEnum
from typing import Literal

from pydantic import ConfigDict, Field

from slurmjob_operator.api.model import Model

#: The aggregated API: its group, version and the APIService that registers it.
API_GROUP = "logs.slurmjob.io"
API_VERSION = "v1alpha1"
API_SERVICE_NAME = f"{API_VERSION}.{API_GROUP}"
#: The API's discovery path, and the log's (a `str.format` template).
API_PATH = f"/apis/{API_GROUP}/{API_VERSION}"
API_LOG_PATH = API_PATH + "/namespaces/{namespace}/slurmjobs/{name}/log"
#: The resource and subresource a SubjectAccessReview asks about.
API_RESOURCE = "slurmjobs"
API_SUBRESOURCE = "log"
#: What one answer holds at most: the log reader's caps (storage/logs.py).
READ_BYTES = 64 * 1024
READ_LINES = 2000
#: Array task indexes a log name may carry (`core.naming.log_file`).
MAX_ARRAY_INDEX = 999_999
#: The answer's `kind`, so a client tells the operator's refusals from the apiserver's own.
ERROR_KIND: Literal["SlurmJobLogError"] = "SlurmJobLogError"

_DIGITS = re.compile(r"[0-9]{1,19}")
UID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_LABEL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")
_MAX_OFFSET = 2**62


def dns_name(value: str, max_length: int, *, dots: bool) -> bool:
    """A namespace (an RFC 1123 label: `dots` False, 63) or an object name (a subdomain: dots
    True, 253): lower-case letters, digits, `-` (and `.`), alphanumeric at both ends and
    around every dot. Checked by hand: nothing to backtrack."""
    if not 0 < len(value) <= max_length:
        return False
    for label in value.split(".") if dots else [value]:
        if not label or not set(label) <= _LABEL_CHARS:
            return False
        if label[0] == "-" or label[-1] == "-":
            return False
    return True


class LogStream(StrEnum):
    STDOUT = "stdout"
    STDERR = "stderr"


class QueryError(ValueError):
    """A query the endpoint does not take; the message names the parameter."""


class LogQuery(Model):
    stream: LogStream = LogStream.STDOUT
    attempt: int | None = Field(default=None, ge=1, le=1_000_000)
    index: int | None = Field(default=None, ge=0, le=MAX_ARRAY_INDEX)
    offset: int | None = Field(default=None, ge=0, le=_MAX_OFFSET)
    uid: str | None = Field(default=None, pattern=UID_RE.pattern)

    @classmethod
    def parse(cls, items: Iterable[tuple[str, str]]) -> LogQuery:
        """The query from its (name, value) pairs; QueryError naming what is wrong."""
        seen: dict[str, str] = {}
        for name, value in items:
            if name not in cls.model_fields:
                raise QueryError(f"unknown parameter {name!r}")
            if name in seen:
                raise QueryError(f"{name}: given more than once")
            seen[name] = value
        values: dict[str, object] = {}
        for name, value in seen.items():
            if name == "stream":
                if value not in tuple(LogStream):
                    raise QueryError(f"stream: {value!r} is not stdout or stderr")
                values[name] = LogStream(value)
                continue
            if name == "uid":
                if not UID_RE.fullmatch(value):
                    raise QueryError(f"uid: {value[:64]!r} is not a SlurmJob's uid")
                values[name] = value
                continue
            if not _DIGITS.fullmatch(value):
                raise QueryError(f"{name}: {value!r} is not a non-negative decimal integer")
            values[name] = int(value)
        bounds = {
            "attempt": (1, 1_000_000),
            "index": (0, MAX_ARRAY_INDEX),
            "offset": (0, _MAX_OFFSET),
        }
        for name, (low, high) in bounds.items():
            number = values.get(name)
            if isinstance(number, int) and not low <= number <= high:
                raise QueryError(f"{name}: {number} is not from {low} to {high}")
        return cls.model_validate(values)

    def items(self) -> list[tuple[str, str]]:
        """The query parameters, for a client (defaults left out)."""
        out = [("stream", self.stream.value)]
        out += [
            (name, str(value))
            for name in ("attempt", "index", "offset", "uid")
            if (value := getattr(self, name)) is not None
        ]
        return out


class _Answer(Model):
    # A client reads the answers of a newer operator: fields it does not know are left out.
    model_config = ConfigDict(**{**Model.model_config, "extra": "ignore"})


class LogAnswer(_Answer):
    """One read of one log file of one attempt."""

    namespace: str
    name: str
    attempt: int = Field(ge=1, description="The attempt read.")
    latest_attempt: int = Field(ge=1, description="The resource's newest attempt.")
    stream: LogStream
    index: int | None = None
    found: bool = Field(description="Whether the log file exists (yet).")
    text: str = Field(default="", description="The text read, redacted.")
    offset: int | None = Field(
        default=None,
        ge=0,
        description=(
            "A read from an offset: the byte `text` starts at (the offset asked for, or 0 when "
            "the file is now shorter: it was replaced or cut short). None for a tail."
        ),
    )
    next_offset: int = Field(ge=0, description="Where the next read (`offset`) starts.")
    size: int = Field(ge=0, description="The file's size when it was read.")
    truncated: bool = Field(
        default=False, description="A tail: earlier content was left out (64 KiB / 2,000 lines)."
    )
    ended: bool = Field(description="The attempt has ended: its logs grow no more.")
    phase: str | None = None


class LogError(_Answer):
    """A refusal or failure, in the operator's words."""

    kind: Literal["SlurmJobLogError"] = ERROR_KIND
    code: int
    reason: str
    message: str


#: The kind the discovery names for the log subresource (its answer is a LogAnswer).
LOG_KIND = "SlurmJobLog"


def api_resource_list() -> dict[str, object]:
    """The API's discovery document (a v1 APIResourceList): the one subresource, namespaced,
    `get` only. The aggregator's availability check and its discovery read this."""
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{API_GROUP}/{API_VERSION}",
        "resources": [
            {
                "name": f"{API_RESOURCE}/{API_SUBRESOURCE}",
                "singularName": "",
                "namespaced": True,
                "kind": LOG_KIND,
                "verbs": ["get"],
            }
        ],
    }
