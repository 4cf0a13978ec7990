"""Who asks, when the kube-apiserver proxies a request to an aggregated API server.

The apiserver authenticates the user, then calls the aggregated server presenting its
front-proxy client certificate and naming the user in headers (`X-Remote-User`,
`X-Remote-Group`, `X-Remote-Extra-<key>`). Which CA signs that certificate, which names it
may have and which headers carry the user are published in the ConfigMap
`kube-system/extension-apiserver-authentication` (written by the apiserver from its
`--requestheader-*` flags). This module reads that ConfigMap's data and the headers by the
rules of Kubernetes' own request-header authenticator
(k8s.io/apiserver/pkg/authentication/request/headerrequest):

* the user name (and uid): the first configured header that has a non-empty value, and that
  header's first value;
* the groups: every non-empty value of every configured group header, in order;
* the extra: every header starting with a configured prefix (case-insensitively), its key the
  rest of the header's name lower-cased and then %-unescaped (kept as sent when that is
  malformed), its values in order.

The headers mean something only on a connection whose client certificate chains to that CA
and whose common name is allowed (`RequestHeaderTrust.name_allowed`); the TLS layer checks the
chain, the caller the name. Pure: no I/O here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

CONFIGMAP_NAMESPACE = "kube-system"
CONFIGMAP_NAME = "extension-apiserver-authentication"

CA_KEY = "requestheader-client-ca-file"
ALLOWED_NAMES_KEY = "requestheader-allowed-names"
USERNAME_HEADERS_KEY = "requestheader-username-headers"
UID_HEADERS_KEY = "requestheader-uid-headers"
GROUP_HEADERS_KEY = "requestheader-group-headers"
EXTRA_PREFIXES_KEY = "requestheader-extra-headers-prefix"

#: A value longer than this in a log line is cut: the line stays one bounded line.
LOG_VALUE_CHARS = 256

_HEX = frozenset("0123456789abcdefABCDEF")


class TrustError(ValueError):
    """The ConfigMap's data cannot be read as the apiserver writes it."""


@dataclass(frozen=True)
class RemoteUser:
    """A user as the apiserver named it in the request's headers: what a
    SubjectAccessReview asks about. Hashable (a decision cache's key): `extra` is sorted by
    key, each value list in the order received."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def extra_map(self) -> dict[str, list[str]]:
        return {key: list(values) for key, values in self.extra}


@dataclass(frozen=True)
class RequestHeaderTrust:
    """What the ConfigMap says: the CA bundle (PEM) client certificates must chain to, the
    common names allowed (empty: any that CA signed), and the header names."""

    ca_pem: str
    allowed_names: frozenset[str] = frozenset()
    username_headers: tuple[str, ...] = ()
    uid_headers: tuple[str, ...] = ()
    group_headers: tuple[str, ...] = ()
    extra_prefixes: tuple[str, ...] = ()

    @classmethod
    def from_configmap(cls, data: Mapping[str, str]) -> RequestHeaderTrust | None:
        """The trust the ConfigMap's data describes; None when it names no requestheader CA
        (an apiserver without the aggregation flags: nobody can be trusted). TrustError when
        a list is not a JSON array of strings."""
        ca = data.get(CA_KEY, "")
        if not ca.strip():
            return None
        return cls(
            ca_pem=ca,
            allowed_names=frozenset(_string_list(data, ALLOWED_NAMES_KEY)),
            username_headers=_string_list(data, USERNAME_HEADERS_KEY),
            uid_headers=_string_list(data, UID_HEADERS_KEY),
            group_headers=_string_list(data, GROUP_HEADERS_KEY),
            extra_prefixes=_string_list(data, EXTRA_PREFIXES_KEY),
        )

    def name_allowed(self, common_name: str | None) -> bool:
        """Whether a verified client certificate with this common name may assert users."""
        if not self.allowed_names:
            return True
        return common_name is not None and common_name in self.allowed_names

    def user(self, headers: Iterable[tuple[str, str]]) -> RemoteUser | None:
        """The user the headers name (None when none is named), read from the configured
        headers only."""
        pairs = [(name.lower(), value) for name, value in headers]
        username = _first(pairs, self.username_headers)
        if not username:
            return None
        groups = [
            value
            for header in self.group_headers
            for name, value in pairs
            if name == header.lower() and value
        ]
        extra: dict[str, list[str]] = {}
        for prefix in self.extra_prefixes:
            low = prefix.lower()
            for name, value in pairs:
                if name.startswith(low):
                    extra.setdefault(_unescape(name[len(low) :]), []).append(value)
        return RemoteUser(
            username=username,
            uid=_first(pairs, self.uid_headers),
            groups=tuple(groups),
            extra=tuple((key, tuple(values)) for key, values in sorted(extra.items())),
        )


def common_name(subject: Iterable[Iterable[tuple[str, str]]] | None) -> str | None:
    """The common name of a certificate subject as Python's `ssl` gives it
    (`getpeercert()["subject"]`: relative distinguished names of (attribute, value) pairs);
    the last one when there are several, as Go's `pkix.Name` reads it."""
    found = None
    for rdn in subject or ():
        for attribute, value in rdn:
            if attribute == "commonName":
                found = value
    return found


def printable(value: object, limit: int = LOG_VALUE_CHARS) -> str:
    """`value` safe for one log line: control and other non-printable characters escaped
    (a decoded `%0A` cannot start a forged line), and at most `limit` characters kept."""
    text = str(value)
    cut = len(text) > limit
    text = text[:limit]
    out = "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )
    return out + "..." if cut else out


def _first(pairs: list[tuple[str, str]], headers: tuple[str, ...]) -> str:
    for header in headers:
        low = header.lower()
        value = next((v for name, v in pairs if name == low), "")
        if value:
            return value
    return ""


def _unescape(key: str) -> str:
    """%-decoding as Go's url.PathUnescape does it (`+` stays); the key as sent when an escape
    is malformed or the bytes are not UTF-8."""
    if "%" not in key:
        return key
    raw = bytearray()
    i = 0
    while i < len(key):
        c = key[i]
        if c == "%":
            pair = key[i + 1 : i + 3]
            if len(pair) != 2 or not set(pair) <= _HEX:
                return key
            raw.append(int(pair, 16))
            i += 3
            continue
        raw += c.encode("utf-8")
        i += 1
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return key


def _string_list(data: Mapping[str, str], key: str) -> tuple[str, ...]:
    text = data.get(key)
    if text is None or not text.strip():
        return ()
    try:
        value = json.loads(text)
    except ValueError:
        raise TrustError(f"{key} is not JSON") from None
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TrustError(f"{key} is not a JSON array of strings")
    return tuple(value)
