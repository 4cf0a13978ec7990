"""What the operator serves in `Settings`: /metrics, the log API and its serving certificate,
and the limits every listener holds its clients to."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings


class ServingSettings(BaseSettings):
    """A part of `Settings`, never read alone: the operator's listeners."""

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
