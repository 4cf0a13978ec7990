"""Operator settings, read once from `SLURMJOB_*` environment variables.

`Settings` is a pydantic-settings `BaseSettings`: the env source finds, parses and validates
the variables. Every field carries its meaning in its description so that
`docs/configuration.md` and `doctor` can list them; a test keeps the docs in step.

`Settings` is the union of one part per concern, each a module of this package: the Slurm
side (slurm.py), the site's files (site.py), the pace of the work loops (pacing.py), what the
operator serves (serving.py) and Kueue and leader election (coordination.py). What reads the
environment, and the checks across fields, stay here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from pydantic import ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings.sources.utils import parse_env_vars

from slurmjob_operator.config.coordination import CoordinationSettings
from slurmjob_operator.config.images import ImageSettings
from slurmjob_operator.config.pacing import PacingSettings
from slurmjob_operator.config.serving import ServingSettings
from slurmjob_operator.config.site import CLUSTER_NAME_RE, SiteSettings, parse_owner
from slurmjob_operator.config.slurm import AUTO, RuntimeProfile, SlurmSettings

__all__ = [
    "AUTO",
    "CLUSTER_NAME_RE",
    "ENV_PREFIX",
    "FALSE_WORDS",
    "ConfigError",
    "RuntimeProfile",
    "Settings",
    "parse_owner",
]

ENV_PREFIX = "SLURMJOB_"
# A bool setting is true unless set to one of these (case and surrounding blanks ignored).
FALSE_WORDS = frozenset({"0", "false", "no", "off"})

# The environment `Settings.from_env` reads; unset (a plain `Settings(...)`) means none at all.
_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("slurmjob_environ", default=None)


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names the variable."""


class _EnvSource(EnvSettingsSource):
    """pydantic-settings' env source over the environment given to `Settings.from_env`.

    Names match as spelled in upper case (`SLURMJOB_POLL_INTERVAL`, not
    `slurmjob_poll_interval`): the source matches case-insensitively, since a case-sensitive
    one would look for `SLURMJOB_poll_interval`, and only upper-case names reach it. Bool
    settings take the operator's own spelling: anything but 0/false/no/off is true.
    """

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls, case_sensitive=False)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        environ = _ENVIRON.get() or {}
        spelled = {k: v for k, v in environ.items() if k.startswith(ENV_PREFIX) and k.isupper()}
        return parse_env_vars(
            spelled, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str
        )

    def prepare_field_value(
        self, field_name: str, field: FieldInfo, value: Any, value_is_complex: bool
    ) -> Any:
        if field.annotation is bool and isinstance(value, str):
            return value.strip().lower() not in FALSE_WORDS
        return super().prepare_field_value(field_name, field, value, value_is_complex)


@contextmanager
def _reading(environ: Mapping[str, str]) -> Iterator[None]:
    token = _ENVIRON.set(environ)
    try:
        yield
    finally:
        _ENVIRON.reset(token)


# pydantic orders the fields base-most first (the MRO reversed), so the parts are listed last
# to first: the fields keep the order the docs, the chart and the JSON schema list them in.
#: What a job of the image cache's user (an import, a housekeeping or verification job) needs.
CACHE_USER_JOB_SETTINGS = (
    "image_cache_root",
    "image_cache_user",
    "image_cache_uid",
    "image_import_partition",
)


class Settings(
    CoordinationSettings,
    ServingSettings,
    PacingSettings,
    ImageSettings,
    SiteSettings,
    SlurmSettings,
):
    """The operator's settings: `Settings.from_env()` reads them from `SLURMJOB_*` variables.

    `Settings(...)` directly takes keyword arguments only and never looks at os.environ.
    Unknown `SLURMJOB_*` variables are ignored; unknown keyword arguments are errors.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_ignore_empty=True,
        case_sensitive=True,  # keyword arguments; see `_EnvSource` for the variables
        frozen=True,
        extra="forbid",
    )

    # Both checks stay here, in this order, though each reads one part: a part's validators
    # would run in the parts' order, and `from_env` reports the first check that fails.
    @model_validator(mode="after")
    def _lease_timing(self) -> Settings:
        if not 0 < self.lease_retry_period < self.lease_renew_deadline < self.lease_duration:
            raise ValueError(
                "SLURMJOB_LEASE_RETRY_PERIOD < SLURMJOB_LEASE_RENEW_DEADLINE < "
                "SLURMJOB_LEASE_DURATION is required"
            )
        return self

    @model_validator(mode="after")
    def _logs_certificate(self) -> Settings:
        if (self.logs_tls_cert_file is None) != (self.logs_tls_key_file is None):
            raise ValueError(
                "SLURMJOB_LOGS_TLS_CERT_FILE and SLURMJOB_LOGS_TLS_KEY_FILE go together"
            )
        if self.logs_tls_cert_file is not None and self.logs_cert_secret:
            raise ValueError(
                "SLURMJOB_LOGS_CERT_SECRET is not read with SLURMJOB_LOGS_TLS_CERT_FILE: set one"
            )
        return self

    def _unset(self, *names: str) -> list[str]:
        """The environment names of the settings among `names` that are not set."""
        return [self.env_name(name) for name in names if getattr(self, name) is None]

    @model_validator(mode="after")
    def _image_cache(self) -> Settings:
        if not self.images_enabled:
            return self
        missing = self._unset(*CACHE_USER_JOB_SETTINGS)
        if missing:
            raise ValueError(f"SLURMJOB_IMAGES_ENABLED needs {', '.join(missing)}")
        return self

    @model_validator(mode="after")
    def _artifact_verification(self) -> Settings:
        if not self.artifact_verify_jobs:
            return self
        # Its jobs run as the cache user (a minted token: with a token file every job is one
        # user, who could then forge a result) and write under the cache.
        missing = self._unset(*CACHE_USER_JOB_SETTINGS, "slurm_jwt_key_file")
        if missing:
            raise ValueError(
                f"SLURMJOB_ARTIFACT_VERIFY_JOBS needs {', '.join(missing)}: the verification "
                "jobs run as the cache user, with a token minted for it, on the import "
                "partition, and record their results in the cache"
            )
        return self

    @classmethod
    def env_name(cls, field: str) -> str:
        return ENV_PREFIX + field.upper()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Keyword arguments, then the environment; no dotenv or secrets files.
        return init_settings, _EnvSource(settings_cls)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from `environ` (os.environ when None; a given mapping replaces it)."""
        with _reading(os.environ if environ is None else environ):
            try:
                return cls()
            except ValidationError as exc:
                first = exc.errors()[0]
                if not first["loc"]:  # a rule across settings names them in its message
                    raise ConfigError(str(first["msg"])) from exc
                name = cls.env_name(str(first["loc"][0]))
                raise ConfigError(f"{name}: {first['msg']}") from exc
