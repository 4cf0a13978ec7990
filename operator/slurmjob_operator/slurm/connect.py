"""Build the client from settings: token provider, the one HTTP transport, version choice."""

from __future__ import annotations

import ssl

from slurmjob_operator.config import AUTO, ConfigError, Settings
from slurmjob_operator.slurm.auth import JwtFileToken, MintedToken, TokenProvider
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.discovery import discover
from slurmjob_operator.slurm.exchange import OnRequest
from slurmjob_operator.slurm.http import HttpTransport


def make_token_provider(settings: Settings) -> TokenProvider:
    if settings.slurm_jwt_file and settings.slurm_jwt_key_file:
        raise ConfigError(
            "SLURMJOB_SLURM_JWT_FILE and SLURMJOB_SLURM_JWT_KEY_FILE are exclusive: set one"
        )
    if settings.slurm_jwt_file:
        return JwtFileToken(settings.slurm_jwt_file)
    if settings.slurm_jwt_key_file:
        if not settings.slurm_rest_user:
            raise ConfigError(
                "SLURMJOB_SLURM_REST_USER: required to mint tokens from SLURMJOB_SLURM_JWT_KEY_FILE"
            )
        return MintedToken(
            settings.slurm_jwt_key_file, settings.slurm_rest_user, settings.slurm_jwt_lifespan
        )
    raise ConfigError("SLURMJOB_SLURM_JWT_FILE or SLURMJOB_SLURM_JWT_KEY_FILE: one is required")


def user_token(settings: Settings, user: str) -> MintedToken:
    """Tokens for another Slurm user than the operator's own (a tenant's `slurmUser`): only
    the JWT key can sign them, so without SLURMJOB_SLURM_JWT_KEY_FILE there are none."""
    if settings.slurm_jwt_key_file is None:
        raise ConfigError(
            f"SLURMJOB_SLURM_JWT_KEY_FILE: required to act as Slurm user {user!r} (a token "
            "file carries one user's token only)"
        )
    return MintedToken(settings.slurm_jwt_key_file, user, settings.slurm_jwt_lifespan)


def _ssl(settings: Settings) -> ssl.SSLContext | None:
    if not settings.slurm_rest_url.startswith("https://"):
        return None
    if not settings.slurm_tls_verify:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    return ssl.create_default_context(
        cafile=str(settings.slurm_ca_bundle) if settings.slurm_ca_bundle else None
    )


def open_transport(settings: Settings) -> HttpTransport:
    """The process's one transport to slurmrestd: a fresh connection per request (see
    `slurm.http` for why), at most 32 at a time."""
    return HttpTransport(_ssl(settings), max_connections=32)


async def connect(
    settings: Settings,
    transport: HttpTransport,
    *,
    token: TokenProvider | None = None,
    on_request: OnRequest | None = None,
) -> SlurmClient:
    """A client for the configured version (checked to be served), or for the newest served
    one when the setting is `auto`."""
    provider = token or make_token_provider(settings)
    configured = settings.slurm_rest_api_version
    found = await discover(
        transport,
        settings.slurm_rest_url,
        token=provider,
        user=settings.slurm_rest_user,
        request_timeout=settings.slurm_rest_timeout,
        wanted=None if configured == AUTO else configured,
    )
    return SlurmClient(
        transport,
        settings.slurm_rest_url,
        found.version,
        accounting=found.accounting,
        token=provider,
        user=settings.slurm_rest_user,
        timeout=settings.slurm_rest_timeout,
        on_request=on_request,
    )


def client_as(
    settings: Settings,
    transport: HttpTransport,
    like: SlurmClient,
    user: str,
    *,
    on_request: OnRequest | None = None,
) -> SlurmClient:
    """A client that speaks `like`'s version over the same transport (what discovery found,
    accounting included, is not asked again) but authenticates as `user` with tokens minted
    for that user (`user_token`)."""
    return SlurmClient(
        transport,
        settings.slurm_rest_url,
        like.version,
        accounting=like.accounting,
        token=user_token(settings, user),
        user=user,
        timeout=settings.slurm_rest_timeout,
        on_request=on_request,
    )
