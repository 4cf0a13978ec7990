"""Token providers for `X-SLURM-USER-TOKEN`.

slurmrestd does not check tokens itself; slurmctld does (HS256 with `jwt_key`, claims
`exp`, `iat`, `sun`). Both providers are synchronous and cheap: the file one stats a file,
the minting one signs with the standard library, so calling `token()` per request is fine.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

# Refresh a minted token once less than this share of its lifespan is left.
REFRESH_FRACTION = 0.2


class TokenProvider(Protocol):
    """Anything that yields the current token and, when known, its expiry."""

    def token(self) -> str: ...

    @property
    def expires_at(self) -> datetime | None: ...


class TokenError(RuntimeError):
    """The token cannot be produced (file missing or empty, key unreadable)."""


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def decode_claims(token: str) -> dict[str, Any] | None:
    """The claims of a JWT, *without* verifying it; None when it is not a readable JWT."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(_b64url_decode(parts[1]))
    except (ValueError, binascii.Error):
        return None
    return claims if isinstance(claims, dict) else None


def expiry_of(token: str) -> datetime | None:
    claims = decode_claims(token)
    exp = claims.get("exp") if claims else None
    if isinstance(exp, int | float) and not isinstance(exp, bool):
        return datetime.fromtimestamp(exp, tz=UTC)
    return None


def encode_hs256(claims: dict[str, Any], key: bytes) -> str:
    """A compact JWS (HS256) over `claims`, as Slurm's auth/jwt verifies it."""
    header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    payload = _b64url(json.dumps(claims, separators=(",", ":")).encode())
    signing_input = f"{header}.{payload}".encode("ascii")
    signature = hmac.new(key, signing_input, hashlib.sha256).digest()
    return f"{header}.{payload}.{_b64url(signature)}"


class JwtFileToken:
    """A token kept in a file (e.g. a mounted Secret rotated by something else).

    The file is re-read whenever its (inode, size, mtime_ns) changes, which also catches the
    symlink swap Kubernetes does for Secret volumes. `scontrol token` output
    (`SLURM_JWT=...`) may be stored as is.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int, int] | None = None
        self._token: str | None = None

    def token(self) -> str:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise TokenError(f"cannot read JWT file {self.path}: {exc}") from exc
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if stamp != self._stamp or self._token is None:
            text = self.path.read_text(encoding="utf-8").strip()
            if text.startswith("SLURM_JWT="):
                text = text[len("SLURM_JWT=") :].strip()
            if not text:
                raise TokenError(f"JWT file {self.path} is empty")
            self._token, self._stamp = text, stamp
        return self._token

    @property
    def expires_at(self) -> datetime | None:
        return expiry_of(self.token())


class MintedToken:
    """Short-lived HS256 tokens signed here with the cluster's `jwt_key` file.

    The key file's bytes are the HMAC key, as slurmctld uses them. A new token is minted when
    less than 20% of `lifespan` is left, so requests never carry a nearly expired token.
    """

    def __init__(
        self,
        key_file: Path | str,
        user: str,
        lifespan: int = 1800,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if lifespan <= 0:
            raise ValueError("lifespan must be positive")
        if not user:
            raise ValueError("user must not be empty")
        self.key_file = Path(key_file)
        self.user = user
        self.lifespan = lifespan
        self._clock = clock
        self._token: str | None = None
        self._exp: int = 0

    def _mint(self, now: int) -> str:
        try:
            key = self.key_file.read_bytes()
        except OSError as exc:
            raise TokenError(f"cannot read JWT key {self.key_file}: {exc}") from exc
        if not key:
            raise TokenError(f"JWT key {self.key_file} is empty")
        exp = now + self.lifespan
        token = encode_hs256({"exp": exp, "iat": now, "sun": self.user}, key)
        self._token, self._exp = token, exp
        return token

    def token(self) -> str:
        now = int(self._clock())
        if self._token is None or self._exp - now < self.lifespan * REFRESH_FRACTION:
            return self._mint(now)
        return self._token

    @property
    def expires_at(self) -> datetime | None:
        return expiry_of(self._token) if self._token is not None else None
