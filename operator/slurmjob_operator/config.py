"""Operator settings, read once from `SLURMJOB_*` environment variables.

`Settings` is a pydantic-settings `BaseSettings`: the env source finds, parses and validates
the variables. Every field carries its meaning in its description so that
`docs/configuration.md` and `doctor` can list them; a test keeps the docs in step.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings.sources.utils import parse_env_vars

from slurmjob_operator.versions import SUPPORTED_VERSIONS

# A cluster's name (the clusters file, spec.cluster); api.spec checks spec.cluster against it.
CLUSTER_NAME_RE = r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$"

ENV_PREFIX = "SLURMJOB_"
AUTO = "auto"
# A bool setting is true unless set to one of these (case and surrounding blanks ignored).
FALSE_WORDS = frozenset({"0", "false", "no", "off"})

# The environment `Settings.from_env` reads; unset (a plain `Settings(...)`) means none at all.
_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("slurmjob_environ", default=None)


class RuntimeProfile(StrEnum):
    ENROOT_PYXIS = "enroot-pyxis"
    APPTAINER = "apptainer"


def parse_owner(value: str | None) -> tuple[int, int] | None:
    """`uid:gid` (Settings.staging_owner, already checked against its pattern) as two ints."""
    if value is None:
        return None
    uid, _, gid = value.partition(":")
    return int(uid), int(gid)


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


class Settings(BaseSettings):
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

    slurm_rest_url: str = Field(
        default="http://127.0.0.1:6820", description="Base URL of slurmrestd."
    )
    slurm_rest_api_version: str = Field(
        default=AUTO,
        description="REST API version such as v0.0.45, or auto: the newest the server serves.",
    )
    slurm_rest_user: str | None = Field(
        default=None, description="Slurm user the operator acts as (X-SLURM-USER-NAME)."
    )
    slurm_jwt_file: Path | None = Field(
        default=None, description="File holding a JWT; re-read when it changes (rotation)."
    )
    slurm_jwt_key_file: Path | None = Field(
        default=None, description="HS256 key file: mint short-lived tokens instead of a file."
    )
    slurm_jwt_lifespan: int = Field(
        default=1800, ge=60, description="Lifespan in seconds of minted tokens."
    )
    slurm_rest_timeout: float = Field(
        default=30.0, gt=0, description="Seconds before a slurmrestd request times out."
    )
    slurm_message_timeout: float = Field(
        default=10.0,
        gt=0,
        description=(
            "slurmctld's MessageTimeout in seconds (slurm.conf; Slurm's default is 10): part of "
            "the fencing window after which an unconfirmed submit may be proven absent."
        ),
    )
    absence_margin: float = Field(
        default=30.0,
        ge=0,
        description=(
            "Seconds added to SLURMJOB_SLURM_REST_TIMEOUT + SLURMJOB_SLURM_MESSAGE_TIMEOUT: "
            "the fencing window after which an unconfirmed submit found neither in the "
            "controller nor in accounting is proven absent and the next attempt submitted."
        ),
    )
    slurm_partition: str | None = Field(
        default=None, description="Partition used when spec.partition is empty."
    )
    slurm_runtime_profile: RuntimeProfile = Field(
        default=RuntimeProfile.ENROOT_PYXIS, description="enroot-pyxis or apptainer."
    )
    storage_root: Path = Field(
        default=Path("/var/lib/slurmjob"),
        description="The shared storage root as the operator sees it.",
    )
    slurm_storage_root: Path | None = Field(
        default=None, description="The same root as the cluster mounts it, when the path differs."
    )
    slurm_tls_verify: bool = Field(default=True, description="Verify slurmrestd's TLS certificate.")
    slurm_ca_bundle: Path | None = Field(
        default=None, description="CA bundle for slurmrestd's TLS certificate."
    )
    slurm_job_path: str = Field(
        default="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        description="PATH given to the batch script on the compute node.",
    )
    staging_owner: str | None = Field(
        default=None,
        pattern=r"^\d+:\d+$",
        description=(
            "uid:gid that staging directories and files are handed to, when the operator runs "
            "as another user than the Slurm job user (needs CAP_CHOWN)."
        ),
    )
    runtime_registry_file: Path | None = Field(
        default=None, description="YAML runtime registry: runtimes: [{id, format, path, sha256}]."
    )
    gpu_series_file: Path | None = Field(
        default=None,
        description="YAML GPU series catalog: series: [{name, slurmConstraint, gpusPerNode}].",
    )
    clusters_file: Path | None = Field(
        default=None,
        description=(
            "YAML clusters file: clusters: [{name, restUrl, apiVersion, user, jwtFile, "
            "jwtKeyFile, partition, runtimeProfile, storageRoot, ...}], several Slurm clusters "
            "behind one operator (spec.cluster picks one; the first is the default). A key "
            "left out takes the SLURMJOB_* setting. Unset: one cluster, from these settings."
        ),
    )
    cluster_name: str = Field(
        default="default",
        pattern=CLUSTER_NAME_RE,
        description=(
            "Name of the one cluster when there is no clusters file (what spec.cluster may say)."
        ),
    )
    tenants_file: Path | None = Field(
        default=None,
        description=(
            "YAML tenants file: tenants: [{name, namespaces, accounts, partitions, qos, "
            "mountSources, maxTimeLimit, slurmUser, uid, defaultCluster, clusters}]. Unset: "
            "single-tenant; set: a SlurmJob in a namespace of no tenant is refused, and each "
            "tenant's limits are enforced before submit."
        ),
    )
    templates_dir: Path | None = Field(
        default=None, description="Directory with site copies of the batch-script templates."
    )
    poll_interval: float = Field(
        default=10.0,
        gt=0,
        description="Seconds between two polls of slurmrestd for every tracked job.",
    )
    delete_timeout: float = Field(
        default=120.0,
        gt=0,
        description="Seconds a deletion waits for a cancelled job to end before trying again.",
    )
    submit_concurrency: int = Field(
        default=8,
        ge=1,
        le=256,
        description=(
            "Submissions (render, stage, POST) in progress at once; the waiting ones are served "
            "round-robin across namespaces."
        ),
    )
    refresh_concurrency: int = Field(
        default=16,
        ge=1,
        le=256,
        description="Status refreshes (apiserver read and patch) in progress at once in a poll.",
    )
    log_refresh: float = Field(
        default=30.0,
        ge=0,
        description=(
            "Seconds between two log-tail refreshes of a running job (a state change, and the "
            "job's end, always refresh them)."
        ),
    )
    status_tail_bytes: int = Field(
        default=8192,
        ge=256,
        le=65536,
        description=(
            "Bytes of each log tail (stdout, stderr) kept in the status: the last whole lines "
            "of the 64 KiB the log reader takes (the retry rules' patterns see all of that). "
            "Every status is stored in etcd with each revision, so this bounds a SlurmJob's "
            "size there."
        ),
    )
    metrics_port: int = Field(
        default=9090, ge=0, le=65535, description="Port of /metrics (Prometheus); 0 disables it."
    )
    metrics_address: str = Field(
        default="0.0.0.0",  # noqa: S104  (a pod's address is not known before it runs)
        min_length=1,
        max_length=253,
        description="Address /metrics listens on.",
    )
    logs_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description=(
            "Port of the log endpoint `kubectl slurmjob logs` reads through the apiserver's "
            "service proxy (every replica serves it); 0 disables it."
        ),
    )
    logs_address: str = Field(
        default="0.0.0.0",  # noqa: S104  (a pod's address is not known before it runs)
        min_length=1,
        max_length=253,
        description="Address the log endpoint listens on.",
    )
    # The log API's serving certificate (servingcert.py): files, or the operator's own Secret.
    logs_tls_cert_file: Path | None = Field(
        default=None,
        description=(
            "PEM certificate (chain) the log API serves, e.g. a mounted cert-manager or admin "
            "Secret; re-read when it changes. Set with SLURMJOB_LOGS_TLS_KEY_FILE."
        ),
    )
    logs_tls_key_file: Path | None = Field(
        default=None, description="PEM private key of SLURMJOB_LOGS_TLS_CERT_FILE."
    )
    logs_cert_secret: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$",
        description=(
            "Secret of the operator's namespace holding its own CA and serving certificate "
            "(both replicas read it; the leader creates it when missing and renews it before "
            "expiry). Not with the files."
        ),
    )
    logs_apiservice: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$",
        description=(
            "APIService whose spec.caBundle the leader keeps equal to that Secret's CA bundle "
            "(e.g. v1alpha1.logs.slurmjob.io). Unset: none is patched."
        ),
    )
    logs_service: str = Field(
        default="slurmjob-operator-logs",
        pattern=r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$",
        description=(
            "Service in front of the log API: the operator's own certificate is made for "
            "<service>.<namespace>.svc (and .svc.cluster.local)."
        ),
    )
    pod_namespace: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        description=(
            "The operator's own namespace (its certificate Secret and Service). Unset: the "
            "pod's namespace in a cluster, `default` outside one."
        ),
    )
    listener_header_timeout: float = Field(
        default=5.0,
        gt=0,
        le=300,
        description=(
            "Seconds a client of any listener (log endpoint, health probe, /metrics) has to "
            "send a request's head, from its first byte (from the accept for the first "
            "request); a connection still sending one then is closed."
        ),
    )
    listener_keepalive: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="Seconds a listener keeps an idle connection open after an answer.",
    )
    listener_write_timeout: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description=(
            "Seconds a listener waits for a client that does not read its answer before "
            "closing the connection."
        ),
    )
    listener_max_connections: int = Field(
        default=64,
        ge=1,
        le=65535,
        description=(
            "Connections each listener holds at once. One more closes the oldest unproven "
            "connection (of the address holding the most) in its place; when every held one is "
            "proven (the log API's front proxy), it is answered 503 and closed at once."
        ),
    )
    listener_max_per_source: int = Field(
        default=8,
        ge=1,
        le=65535,
        description=(
            "Unproven connections each listener holds at once from one address (the log API: "
            "before a handshake with the front proxy's certificate; the health probe and "
            "/metrics: every connection); one more from it is answered 503 and closed at once."
        ),
    )
    kueue: bool = Field(
        default=False,
        description=(
            "Watch Kueue's Workloads (kueue.x-k8s.io/v1beta2): a SlurmJob labelled "
            "kueue.x-k8s.io/queue-name is then reconciled as soon as Kueue admits or evicts "
            "it. Without it, admission is looked for every poll interval and evictions are not "
            "acted on. The chart sets it with kueue.enabled."
        ),
    )
    leader_election: bool = Field(
        default=True,
        description=(
            "Run only while holding a coordination.k8s.io Lease, so that replicas stand by "
            "(`run --no-leader-election` turns it off for one process)."
        ),
    )
    lease_name: str = Field(
        default="slurmjob-operator",
        pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$",
        description="Name of the Lease the replicas elect a leader on.",
    )
    lease_namespace: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        description=(
            "Namespace of the Lease. Unset: the pod's own namespace in a cluster, `default` "
            "outside one."
        ),
    )
    lease_identity: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="This replica's name in the Lease. Unset: the host name and a random suffix.",
    )
    lease_duration: float = Field(
        default=15.0,
        gt=0,
        description="Seconds a Lease not renewed stays its holder's before a standby may take it.",
    )
    lease_renew_deadline: float = Field(
        default=10.0,
        gt=0,
        description=(
            "Seconds the leader goes on without renewing before it stops; shorter than the "
            "lease duration, so it has stopped before anyone may take over."
        ),
    )
    lease_retry_period: float = Field(
        default=2.0,
        gt=0,
        description="Seconds between two attempts to renew (leader) or take (standby) the Lease.",
    )

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

    @field_validator("slurm_rest_api_version")
    @classmethod
    def _version(cls, value: str) -> str:
        if value != AUTO and value not in SUPPORTED_VERSIONS:
            raise ValueError(
                f"{value!r} is not supported; use auto or one of {', '.join(SUPPORTED_VERSIONS)}"
            )
        return value

    @property
    def cluster_storage_root(self) -> Path:
        return self.slurm_storage_root or self.storage_root

    def to_cluster_path(self, path: Path) -> Path:
        """Translate a path under the operator's storage root to the cluster's view of it."""
        return self.cluster_storage_root / path.relative_to(self.storage_root)

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
