"""core.requestheader: the extension-apiserver-authentication ConfigMap read as the apiserver
writes it, and the user read from the headers by the rules of Kubernetes' request-header
authenticator (first username header with a value, every group value, extra keys lower-cased
and %-unescaped), the allowed names, the certificate's common name, and log escaping."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmjob_operator.core.requestheader import (
    RemoteUser,
    RequestHeaderTrust,
    TrustError,
    common_name,
    printable,
)

CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def trust(**more: object) -> RequestHeaderTrust:
    data = {
        "requestheader-client-ca-file": CA,
        "requestheader-allowed-names": '["front-proxy-client"]',
        "requestheader-username-headers": '["X-Remote-User"]',
        "requestheader-uid-headers": '["X-Remote-Uid"]',
        "requestheader-group-headers": '["X-Remote-Group"]',
        "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]',
    }
    data.update({k: json.dumps(v) for k, v in more.items()})
    found = RequestHeaderTrust.from_configmap(data)
    assert found is not None
    return found


def test_the_configmap_as_the_apiserver_writes_it() -> None:
    t = trust()
    assert t.ca_pem == CA
    assert t.allowed_names == frozenset({"front-proxy-client"})
    assert t.username_headers == ("X-Remote-User",)
    assert t.uid_headers == ("X-Remote-Uid",)
    assert t.group_headers == ("X-Remote-Group",)
    assert t.extra_prefixes == ("X-Remote-Extra-",)


def test_no_requestheader_ca_trusts_nobody_and_missing_lists_are_empty() -> None:
    assert RequestHeaderTrust.from_configmap({"client-ca-file": CA}) is None
    assert RequestHeaderTrust.from_configmap({"requestheader-client-ca-file": " \n"}) is None
    t = RequestHeaderTrust.from_configmap(
        {"requestheader-client-ca-file": CA, "requestheader-allowed-names": "null"}
    )
    assert t == RequestHeaderTrust(CA)


@pytest.mark.parametrize("value", ["x-remote-user", '"X-Remote-User"', "[1]", '{"a": 1}'])
def test_a_list_that_is_no_json_array_of_strings_is_refused(value: str) -> None:
    with pytest.raises(TrustError, match="requestheader-username-headers"):
        RequestHeaderTrust.from_configmap(
            {"requestheader-client-ca-file": CA, "requestheader-username-headers": value}
        )


def test_allowed_names_empty_means_any_and_otherwise_exactly_those() -> None:
    assert RequestHeaderTrust(CA).name_allowed("anyone")
    assert RequestHeaderTrust(CA).name_allowed(None)  # the chain is the check then
    t = trust()
    assert t.name_allowed("front-proxy-client")
    assert not t.name_allowed("front-proxy-client2")
    assert not t.name_allowed("Front-Proxy-Client")
    assert not t.name_allowed(None)


def test_the_user_groups_uid_and_extra_from_the_configured_headers() -> None:
    headers = [
        ("x-remote-user", "alice"),
        ("X-Remote-User", "mallory"),  # only the first value of the first header
        ("X-Remote-Uid", "u-1"),
        ("X-Remote-Group", "devs"),
        ("X-Remote-Group", ""),  # empty values are dropped
        ("x-remote-group", "system:authenticated"),
        ("X-Remote-Extra-Scopes", "a"),
        ("X-Remote-Extra-scopes", "b"),
        ("X-Remote-Extra-Authentication.kubernetes.io%2fpod-Name", "p-1"),
        ("X-Remote-Extra-Bad%zzKey", "v"),  # malformed escape: kept as sent (lower-cased)
        ("X-Remote-Extra-Not%ffUtf8", "w"),
        ("X-Other-Group", "system:masters"),
        ("Authorization", "Bearer x"),
    ]
    assert trust().user(headers) == RemoteUser(
        "alice",
        "u-1",
        ("devs", "system:authenticated"),
        (
            ("authentication.kubernetes.io/pod-name", ("p-1",)),
            ("bad%zzkey", ("v",)),
            ("not%ffutf8", ("w",)),
            ("scopes", ("a", "b")),
        ),
    )


def test_header_order_of_the_configuration_decides() -> None:
    t = trust(
        **{
            "requestheader-username-headers": ["X-Proxy-User", "X-Remote-User"],
            "requestheader-group-headers": ["X-B", "X-A"],
        }
    )
    user = t.user([("X-Remote-User", "bob"), ("X-A", "a"), ("X-B", "b"), ("X-Proxy-User", "")])
    assert user is not None
    assert (user.username, user.groups) == ("bob", ("b", "a"))
    user = t.user([("X-Remote-User", "bob"), ("X-Proxy-User", "alice")])
    assert user is not None
    assert user.username == "alice"


def test_no_user_named_and_no_headers_configured() -> None:
    assert trust().user([("X-Remote-Group", "system:masters")]) is None
    assert trust().user([("X-Remote-User", "")]) is None
    assert RequestHeaderTrust(CA).user([("X-Remote-User", "alice")]) is None


def test_the_user_is_a_cache_key_of_all_it_holds() -> None:
    a = RemoteUser("alice", "u", ("g",), (("k", ("v",)),))
    assert len({a, RemoteUser("alice", "u", ("g",), (("k", ("v",)),))}) == 1
    assert a != RemoteUser("alice", "u", ("g", "h"), (("k", ("v",)),))
    assert a != RemoteUser("alice", "u", ("g",), (("k", ("w",)),))
    assert a != RemoteUser("alice", "v", ("g",), (("k", ("v",)),))
    assert a.extra_map() == {"k": ["v"]}


def test_the_common_name_of_a_subject_as_go_reads_it() -> None:
    subject = (
        (("organizationName", "system:masters"),),
        (("commonName", "first"),),
        (("commonName", "front-proxy-client"),),
    )
    assert common_name(subject) == "front-proxy-client"
    assert common_name(((("organizationName", "front-proxy-client"),),)) is None
    assert common_name(None) is None


@given(st.text(max_size=300))
def test_printable_is_one_bounded_printable_line(text: str) -> None:
    out = printable(text, limit=100)
    assert out.isprintable()
    assert len(out.splitlines()) <= 1
    assert len(out) <= 100 * 10 + 3  # each character escaped at most as \U0010ffff


def test_printable_escapes_what_could_forge_a_line() -> None:
    assert printable("a\nERROR b") == "a\\nERROR b"
    assert printable("a\u2028b\x1b[2K") == "a\\u2028b\\x1b[2K"
    assert printable("x" * 300) == "x" * 256 + "..."
