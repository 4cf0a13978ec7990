"""Token providers: file rotation and stdlib HS256 minting."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from slurmjob_operator.slurm.auth import (
    JwtFileToken,
    MintedToken,
    TokenError,
    decode_claims,
    encode_hs256,
    expiry_of,
)


def _b64d(text: str) -> bytes:
    import base64

    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def make_token(exp: int | None, key: bytes = b"k") -> str:
    claims: dict[str, object] = {"sun": "alice"}
    if exp is not None:
        claims["exp"] = exp
    return encode_hs256(claims, key)


def test_file_token_strips_prefix_and_whitespace(tmp_path: Path) -> None:
    path = tmp_path / "jwt"
    token = make_token(2_000_000_000)
    path.write_text(f"SLURM_JWT={token}\n")
    provider = JwtFileToken(path)
    assert provider.token() == token
    assert provider.expires_at == datetime.fromtimestamp(2_000_000_000, tz=UTC)


def test_file_token_follows_rotation(tmp_path: Path) -> None:
    path = tmp_path / "jwt"
    first, second = make_token(2_000_000_000), make_token(2_000_000_999)
    path.write_text(first)
    provider = JwtFileToken(path)
    assert provider.token() == first
    # Same size, same mtime would hide a change; force a distinct mtime as a rewrite does.
    path.write_text(second)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert provider.token() == second
    # Atomic replacement (a new inode), as a Secret volume update does.
    tmp = tmp_path / "jwt.new"
    tmp.write_text("  " + first + "  ")
    tmp.replace(path)
    assert provider.token() == first


def test_file_token_without_exp_and_garbage(tmp_path: Path) -> None:
    path = tmp_path / "jwt"
    path.write_text(make_token(None))
    assert JwtFileToken(path).expires_at is None
    path.write_text("not-a-jwt")
    assert JwtFileToken(path).expires_at is None


def test_file_token_errors(tmp_path: Path) -> None:
    with pytest.raises(TokenError):
        JwtFileToken(tmp_path / "missing").token()
    empty = tmp_path / "empty"
    empty.write_text("SLURM_JWT=\n")
    with pytest.raises(TokenError):
        JwtFileToken(empty).token()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_minted_token_verifies_and_carries_claims(tmp_path: Path) -> None:
    key = os.urandom(32)
    key_file = tmp_path / "jwt_hs256.key"
    key_file.write_bytes(key)
    clock = Clock(1_800_000_000)
    provider = MintedToken(key_file, "slurmci", lifespan=600, clock=clock)
    token = provider.token()
    header_b64, payload_b64, signature_b64 = token.split(".")
    expected = hmac.new(key, f"{header_b64}.{payload_b64}".encode(), hashlib.sha256).digest()
    assert hmac.compare_digest(_b64d(signature_b64), expected)
    assert json.loads(_b64d(header_b64)) == {"alg": "HS256", "typ": "JWT"}
    assert decode_claims(token) == {"exp": 1_800_000_600, "iat": 1_800_000_000, "sun": "slurmci"}
    assert provider.expires_at == datetime.fromtimestamp(1_800_000_600, tz=UTC)
    assert "=" not in token


def test_minted_token_refreshes_at_twenty_percent(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_bytes(b"secret")
    clock = Clock(1_000)
    provider = MintedToken(key_file, "u", lifespan=100, clock=clock)
    assert provider.expires_at is None
    first = provider.token()
    clock.now = 1_079  # 21 s left: keep
    assert provider.token() == first
    clock.now = 1_081  # 19 s left: below 20%
    second = provider.token()
    assert second != first
    assert expiry_of(second) == datetime.fromtimestamp(1_181, tz=UTC)


def test_minted_token_errors(tmp_path: Path) -> None:
    with pytest.raises(TokenError):
        MintedToken(tmp_path / "none", "u").token()
    with pytest.raises(ValueError, match="lifespan"):
        MintedToken(tmp_path / "none", "u", lifespan=0)
    with pytest.raises(ValueError, match="user"):
        MintedToken(tmp_path / "none", "")
