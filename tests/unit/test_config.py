"""Settings from `SLURMJOB_*` variables (config): values, defaults and the errors naming them."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from slurmjob_operator.config import AUTO, ConfigError, RuntimeProfile, Settings
from slurmjob_operator.versions import NEWEST, SUPPORTED_VERSIONS

APPTAINER = RuntimeProfile.APPTAINER

# -- values ---------------------------------------------------------------------------------------

VALUES: list[tuple[str, str, str, Any]] = [
    ("SLURMJOB_SLURM_REST_URL", "https://slurm:6820", "slurm_rest_url", "https://slurm:6820"),
    ("SLURMJOB_SLURM_REST_API_VERSION", "auto", "slurm_rest_api_version", AUTO),
    ("SLURMJOB_SLURM_REST_API_VERSION", "v0.0.38", "slurm_rest_api_version", "v0.0.38"),
    ("SLURMJOB_SLURM_REST_API_VERSION", NEWEST, "slurm_rest_api_version", NEWEST),
    ("SLURMJOB_SLURM_REST_USER", "slurm", "slurm_rest_user", "slurm"),
    ("SLURMJOB_SLURM_JWT_FILE", "/run/jwt", "slurm_jwt_file", Path("/run/jwt")),
    ("SLURMJOB_SLURM_JWT_KEY_FILE", "/run/key", "slurm_jwt_key_file", Path("/run/key")),
    ("SLURMJOB_SLURM_JWT_LIFESPAN", "60", "slurm_jwt_lifespan", 60),
    ("SLURMJOB_SLURM_REST_TIMEOUT", "2.5", "slurm_rest_timeout", 2.5),
    ("SLURMJOB_SLURM_PARTITION", "batch", "slurm_partition", "batch"),
    ("SLURMJOB_SLURM_RUNTIME_PROFILE", "apptainer", "slurm_runtime_profile", APPTAINER),
    ("SLURMJOB_STORAGE_ROOT", "/lustre/sj", "storage_root", Path("/lustre/sj")),
    ("SLURMJOB_SLURM_STORAGE_ROOT", "/mnt/sj", "slurm_storage_root", Path("/mnt/sj")),
    ("SLURMJOB_SLURM_CA_BUNDLE", "ca.pem", "slurm_ca_bundle", Path("ca.pem")),
    ("SLURMJOB_SLURM_JOB_PATH", "/usr/bin:/bin", "slurm_job_path", "/usr/bin:/bin"),
    ("SLURMJOB_STAGING_OWNER", "1000:100", "staging_owner", "1000:100"),
    ("SLURMJOB_RUNTIME_REGISTRY_FILE", "rt.yaml", "runtime_registry_file", Path("rt.yaml")),
    ("SLURMJOB_GPU_SERIES_FILE", "/etc/gpu.yaml", "gpu_series_file", Path("/etc/gpu.yaml")),
    ("SLURMJOB_TENANTS_FILE", "/etc/tenants.yaml", "tenants_file", Path("/etc/tenants.yaml")),
    ("SLURMJOB_TEMPLATES_DIR", "/etc/tpl", "templates_dir", Path("/etc/tpl")),
    ("SLURMJOB_MPI_PLUGINS", "pmi2,pmix", "mpi_plugins", "pmi2,pmix"),
    ("SLURMJOB_PROBE_ATTEMPTS", "0", "probe_attempts", 0),
    ("SLURMJOB_MAX_TOTAL_TIME", "7d", "max_total_time", "7d"),
    ("SLURMJOB_PROBE_CACHE_SECONDS", "60", "probe_cache_seconds", 60),
    ("SLURMJOB_PROBE_AVOID_SECONDS", "600", "probe_avoid_seconds", 600),
    ("SLURMJOB_PROBE_CONFIGMAP", "probes", "probe_configmap", "probes"),
    ("SLURMJOB_PROBE_CAPACITY_BYTES", "131072", "probe_capacity_bytes", 131072),
    ("SLURMJOB_PROBE_FLOOR_BYTES", "0", "probe_floor_bytes", 0),
    ("SLURMJOB_POLL_INTERVAL", "5", "poll_interval", 5.0),
    ("SLURMJOB_POLL_INTERVAL", " 0.5 ", "poll_interval", 0.5),
    ("SLURMJOB_DELETE_TIMEOUT", "30", "delete_timeout", 30.0),
    ("SLURMJOB_TTL_AFTER_FINISHED_DEFAULT", "3600", "ttl_after_finished_default", 3600),
    ("SLURMJOB_TTL_AFTER_FINISHED_MAX", "86400", "ttl_after_finished_max", 86400),
    ("SLURMJOB_ARCHIVE_ROOT", "/archive", "archive_root", Path("/archive")),
    ("SLURMJOB_ARCHIVE_RETENTION_DAYS", "7", "archive_retention_days", 7),
    ("SLURMJOB_ARCHIVE_MAX_BYTES", "1073741824", "archive_max_bytes", 1024**3),
    ("SLURMJOB_ARCHIVE_FILE_MAX_BYTES", "65536", "archive_file_max_bytes", 65536),
    ("SLURMJOB_ARCHIVE_ENTRY_MAX_BYTES", "1048576", "archive_entry_max_bytes", 1024**2),
    ("SLURMJOB_SUBMIT_CONCURRENCY", "2", "submit_concurrency", 2),
    ("SLURMJOB_REFRESH_CONCURRENCY", "4", "refresh_concurrency", 4),
    ("SLURMJOB_LOG_REFRESH", "0", "log_refresh", 0.0),
    ("SLURMJOB_STATUS_TAIL_BYTES", "65536", "status_tail_bytes", 65536),
    ("SLURMJOB_STATUS_TAIL_BYTES", "256", "status_tail_bytes", 256),
    ("SLURMJOB_WATCH_PAGE_SIZE", "0", "watch_page_size", 0),
    ("SLURMJOB_WATCH_PAGE_SIZE", "250", "watch_page_size", 250),
    ("SLURMJOB_WORKER_IDLE_TIMEOUT", "2.5", "worker_idle_timeout", 2.5),
    ("SLURMJOB_MEMORY_TRIM_INTERVAL", "0", "memory_trim_interval", 0.0),
    ("SLURMJOB_LEADER_ELECTION", "0", "leader_election", False),
    ("SLURMJOB_KUEUE", "1", "kueue", True),
    ("SLURMJOB_LEASE_NAME", "ops.lease-1", "lease_name", "ops.lease-1"),
    ("SLURMJOB_LEASE_NAMESPACE", "slurmjob-system", "lease_namespace", "slurmjob-system"),
    ("SLURMJOB_LEASE_IDENTITY", "pod-7f9c", "lease_identity", "pod-7f9c"),
    ("SLURMJOB_SLURM_MESSAGE_TIMEOUT", "20", "slurm_message_timeout", 20.0),
    ("SLURMJOB_ABSENCE_MARGIN", "5", "absence_margin", 5.0),
    (
        "SLURMJOB_CLUSTERS_FILE",
        "/etc/slurmjob/clusters.yaml",
        "clusters_file",
        Path("/etc/slurmjob/clusters.yaml"),
    ),
    ("SLURMJOB_CLUSTER_NAME", "west", "cluster_name", "west"),
    ("SLURMJOB_LEASE_DURATION", "30", "lease_duration", 30.0),
    ("SLURMJOB_LEASE_RENEW_DEADLINE", "5", "lease_renew_deadline", 5.0),
    ("SLURMJOB_LEASE_RETRY_PERIOD", "1", "lease_retry_period", 1.0),
    ("SLURMJOB_METRICS_PORT", "0", "metrics_port", 0),
    ("SLURMJOB_METRICS_PORT", "65535", "metrics_port", 65535),
    ("SLURMJOB_LOGS_PORT", "8081", "logs_port", 8081),
    ("SLURMJOB_LOGS_ADDRESS", "192.0.2.7", "logs_address", "192.0.2.7"),
    ("SLURMJOB_LOGS_CERT_SECRET", "sj-logs-cert", "logs_cert_secret", "sj-logs-cert"),
    (
        "SLURMJOB_LOGS_APISERVICE",
        "v1alpha1.logs.slurmjob.io",
        "logs_apiservice",
        "v1alpha1.logs.slurmjob.io",
    ),
    ("SLURMJOB_LOGS_SERVICE", "sj-logs", "logs_service", "sj-logs"),
    ("SLURMJOB_POD_NAMESPACE", "slurmjob-system", "pod_namespace", "slurmjob-system"),
    ("SLURMJOB_METRICS_ADDRESS", "127.0.0.1", "metrics_address", "127.0.0.1"),
    ("SLURMJOB_LISTENER_HEADER_TIMEOUT", "0.5", "listener_header_timeout", 0.5),
    ("SLURMJOB_LISTENER_KEEPALIVE", "2", "listener_keepalive", 2.0),
    ("SLURMJOB_LISTENER_WRITE_TIMEOUT", "3", "listener_write_timeout", 3.0),
    ("SLURMJOB_LISTENER_MAX_CONNECTIONS", "16", "listener_max_connections", 16),
    ("SLURMJOB_LISTENER_MAX_PER_SOURCE", "4", "listener_max_per_source", 4),
    (
        "SLURMJOB_IMAGE_REGISTRIES",
        "nvcr.io/nvidia,127.0.0.1:5000",
        "image_registries",
        "nvcr.io/nvidia,127.0.0.1:5000",
    ),
    ("SLURMJOB_IMAGE_CACHE_ROOT", "/cache", "image_cache_root", Path("/cache")),
    ("SLURMJOB_SLURM_IMAGE_CACHE_ROOT", "/gpfs/cache", "slurm_image_cache_root", "/gpfs/cache"),
    ("SLURMJOB_IMAGE_CACHE_USER", "imagecache", "image_cache_user", "imagecache"),
    ("SLURMJOB_IMAGE_IMPORT_PARTITION", "cpu", "image_import_partition", "cpu"),
    ("SLURMJOB_IMAGE_CACHE_UID", "990", "image_cache_uid", 990),
    ("SLURMJOB_IMAGE_IMPORT_ACCOUNT", "infra", "image_import_account", "infra"),
    ("SLURMJOB_IMAGE_IMPORT_CPUS", "8", "image_import_cpus", 8),
    ("SLURMJOB_IMAGE_IMPORT_MEMORY_MB", "16000", "image_import_memory_mb", 16000),
    ("SLURMJOB_IMAGE_IMPORT_TIME_MINUTES", "60", "image_import_time_minutes", 60),
    ("SLURMJOB_IMAGE_IMPORT_TMP", "/local/tmp", "image_import_tmp", "/local/tmp"),
    ("SLURMJOB_IMAGE_IMPORT_CA_FILE", "/etc/ca.pem", "image_import_ca_file", "/etc/ca.pem"),
    ("SLURMJOB_IMAGE_TAG_REUSE_SECONDS", "60", "image_tag_reuse_seconds", 60),
    ("SLURMJOB_IMAGE_IMPORT_RETRIES", "1", "image_import_retries", 1),
    ("SLURMJOB_IMAGE_CACHE_MAX_BYTES", str(2 * 1024**4), "image_cache_max_bytes", 2 * 1024**4),
    ("SLURMJOB_IMAGE_CACHE_FLOOR_BYTES", str(1024**3), "image_cache_floor_bytes", 1024**3),
    ("SLURMJOB_IMAGE_CACHE_SWEEP_SECONDS", "2", "image_cache_sweep_seconds", 2.0),
    ("SLURMJOB_IMAGE_CACHE_CHECK_SECONDS", "3600", "image_cache_check_seconds", 3600.0),
    ("SLURMJOB_IMAGE_IMPORTS_PER_TENANT", "3", "image_imports_per_tenant", 3),
    ("SLURMJOB_IMAGE_IMPORTS_MAX", "12", "image_imports_max", 12),
]


@pytest.mark.parametrize(("name", "raw", "field", "expected"), VALUES)
def test_a_variable_sets_its_field(name: str, raw: str, field: str, expected: Any) -> None:
    settings = Settings.from_env({name: raw})
    assert getattr(settings, field) == expected
    assert type(getattr(settings, field)) is type(expected)
    assert Settings.env_name(field) == name


def test_the_serving_certificate_files_go_together() -> None:
    settings = Settings.from_env(
        {"SLURMJOB_LOGS_TLS_CERT_FILE": "/tls/tls.crt", "SLURMJOB_LOGS_TLS_KEY_FILE": "/tls/k"}
    )
    assert (settings.logs_tls_cert_file, settings.logs_tls_key_file) == (
        Path("/tls/tls.crt"),
        Path("/tls/k"),
    )


_IMAGE_CACHE = {
    "SLURMJOB_IMAGE_CACHE_ROOT": "/cache",
    "SLURMJOB_IMAGE_CACHE_USER": "imagecache",
    "SLURMJOB_IMAGE_CACHE_UID": "990",
    "SLURMJOB_IMAGE_IMPORT_PARTITION": "cpu",
}


def test_images_need_the_cache_its_user_and_partition() -> None:
    settings = Settings.from_env({"SLURMJOB_IMAGES_ENABLED": "1", **_IMAGE_CACHE})
    assert settings.images_enabled is True
    assert settings.image_cache_floor == settings.image_cache_max_bytes // 16
    for left_out in _IMAGE_CACHE:
        given = {k: v for k, v in _IMAGE_CACHE.items() if k != left_out}
        with pytest.raises(ConfigError, match=f"SLURMJOB_IMAGES_ENABLED needs {left_out}"):
            Settings.from_env({"SLURMJOB_IMAGES_ENABLED": "yes", **given})
    assert Settings.from_env({"SLURMJOB_IMAGES_ENABLED": "off"}).images_enabled is False


def test_verified_artifacts_need_the_cache_and_minted_tokens(tmp_path: Path) -> None:
    """The verification jobs run as the cache user (a token minted for it: with one token
    file every job is one user, who could forge a result) and record into the cache; images
    themselves may stay off."""
    key = tmp_path / "jwt.key"
    key.write_bytes(b"k" * 32)
    needed = {**_IMAGE_CACHE, "SLURMJOB_SLURM_JWT_KEY_FILE": str(key)}
    settings = Settings.from_env({"SLURMJOB_ARTIFACT_VERIFY_JOBS": "1", **needed})
    assert (settings.artifact_verify_jobs, settings.images_enabled) == (True, False)
    for left_out in needed:
        given = {k: v for k, v in needed.items() if k != left_out}
        with pytest.raises(ConfigError, match=f"SLURMJOB_ARTIFACT_VERIFY_JOBS needs {left_out}"):
            Settings.from_env({"SLURMJOB_ARTIFACT_VERIFY_JOBS": "on", **given})
    assert Settings.from_env({}).artifact_verify_jobs is False


def test_a_registry_list_is_host_port_and_path_prefixes() -> None:
    settings = Settings.from_env({"SLURMJOB_IMAGE_REGISTRIES": "nvcr.io/nvidia,reg:5000"})
    assert settings.allowed_image_registries == ("nvcr.io/nvidia", "reg:5000")
    for bad in ("nvcr.io/nvidia,", "a b", "https://nvcr.io", "NVCR.io"):
        with pytest.raises(ConfigError, match="SLURMJOB_IMAGE_REGISTRIES"):
            Settings.from_env({"SLURMJOB_IMAGE_REGISTRIES": bad})


def test_the_value_table_covers_every_setting() -> None:
    names = {name for name, *_ in VALUES} | {"SLURMJOB_SLURM_TLS_VERIFY"}
    names |= {"SLURMJOB_IMAGES_ENABLED"}  # with the cache settings, above
    names |= {"SLURMJOB_ARTIFACT_VERIFY_JOBS"}  # with the cache settings, above
    names |= {"SLURMJOB_LOGS_TLS_CERT_FILE", "SLURMJOB_LOGS_TLS_KEY_FILE"}  # together, above
    assert names == {Settings.env_name(f) for f in Settings.model_fields}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("0", False),
        ("false", False),
        ("FALSE", False),
        ("No", False),
        (" off ", False),
        ("1", True),
        ("true", True),
        ("yes", True),
        ("on", True),
        # Anything but 0/false/no/off verifies, as documented: a typo never disables TLS checks.
        ("f", True),
        ("n", True),
        ("2", True),
        ("disabled", True),
        (" ", True),
    ],
)
def test_tls_verify_is_true_unless_switched_off(raw: str, expected: bool) -> None:
    assert Settings.from_env({"SLURMJOB_SLURM_TLS_VERIFY": raw}).slurm_tls_verify is expected


# -- defaults -------------------------------------------------------------------------------------


def test_no_variables_give_the_defaults() -> None:
    assert Settings.from_env({}) == Settings()
    settings = Settings.from_env({})
    assert settings.slurm_rest_url == "http://127.0.0.1:6820"
    assert settings.slurm_rest_api_version == AUTO
    assert settings.slurm_tls_verify is True
    assert settings.slurm_runtime_profile is RuntimeProfile.ENROOT_PYXIS
    assert settings.storage_root == Path("/var/lib/slurmjob")
    assert settings.poll_interval == 10.0
    assert settings.metrics_port == 9090
    assert settings.slurm_jwt_file is None


@pytest.mark.parametrize("field", list(Settings.model_fields))
def test_an_empty_variable_is_unset(field: str) -> None:
    assert Settings.from_env({Settings.env_name(field): ""}) == Settings()


@pytest.mark.parametrize(
    "environ",
    [
        {"SLURMJOB_BOGUS": "1"},
        {"SLURMJOB_": "x"},
        {"SLURMJOB_POLL_INTERVAL_SECONDS": "nonsense"},
        {"POLL_INTERVAL": "0"},
        {"poll_interval": "0"},
        {"HOME": "/root", "PATH": "/bin"},
    ],
)
def test_unrelated_variables_are_ignored(environ: dict[str, str]) -> None:
    assert Settings.from_env(environ) == Settings()


@pytest.mark.parametrize("name", ["slurmjob_poll_interval", "SLURMJOB_poll_interval"])
def test_names_match_only_as_spelled(name: str) -> None:
    assert Settings.from_env({name: "0"}).poll_interval == 10.0


# -- errors ---------------------------------------------------------------------------------------

ERRORS: list[tuple[dict[str, str], str]] = [
    ({"SLURMJOB_POLL_INTERVAL": "0"}, "SLURMJOB_POLL_INTERVAL: Input should be greater than 0"),
    ({"SLURMJOB_POLL_INTERVAL": "soon"}, "SLURMJOB_POLL_INTERVAL: Input should be a valid number"),
    ({"SLURMJOB_POLL_INTERVAL": " "}, "SLURMJOB_POLL_INTERVAL: Input should be a valid number"),
    ({"SLURMJOB_DELETE_TIMEOUT": "-1"}, "SLURMJOB_DELETE_TIMEOUT: Input should be greater than 0"),
    ({"SLURMJOB_SLURM_REST_TIMEOUT": "0"}, "SLURMJOB_SLURM_REST_TIMEOUT: Input should be greater"),
    ({"SLURMJOB_SLURM_JWT_LIFESPAN": "59"}, "SLURMJOB_SLURM_JWT_LIFESPAN: Input should be greater"),
    ({"SLURMJOB_SLURM_JWT_LIFESPAN": "1e3"}, "SLURMJOB_SLURM_JWT_LIFESPAN: Input should be"),
    ({"SLURMJOB_METRICS_PORT": "65536"}, "SLURMJOB_METRICS_PORT: Input should be less than"),
    # Past 960 KiB the probe ConfigMap could reach the apiserver's 1 MiB (issue 42).
    (
        {"SLURMJOB_PROBE_CAPACITY_BYTES": "1048576"},
        "SLURMJOB_PROBE_CAPACITY_BYTES: Input should be less than or equal to 983040",
    ),
    ({"SLURMJOB_LEASE_NAME": "Bad_Name"}, "SLURMJOB_LEASE_NAME: String should match pattern"),
    ({"SLURMJOB_LEASE_NAMESPACE": "a" * 64}, "SLURMJOB_LEASE_NAMESPACE: String should match"),
    (
        {"SLURMJOB_LEASE_RENEW_DEADLINE": "20"},
        "Value error, SLURMJOB_LEASE_RETRY_PERIOD < SLURMJOB_LEASE_RENEW_DEADLINE < "
        "SLURMJOB_LEASE_DURATION is required",
    ),
    ({"SLURMJOB_STATUS_TAIL_BYTES": "255"}, "SLURMJOB_STATUS_TAIL_BYTES: Input should be greater"),
    ({"SLURMJOB_STATUS_TAIL_BYTES": "65537"}, "SLURMJOB_STATUS_TAIL_BYTES: Input should be less"),
    ({"SLURMJOB_WATCH_PAGE_SIZE": "-1"}, "SLURMJOB_WATCH_PAGE_SIZE: Input should be greater"),
    ({"SLURMJOB_WORKER_IDLE_TIMEOUT": "0"}, "SLURMJOB_WORKER_IDLE_TIMEOUT: Input should be"),
    ({"SLURMJOB_MEMORY_TRIM_INTERVAL": "-1"}, "SLURMJOB_MEMORY_TRIM_INTERVAL: Input should be"),
    ({"SLURMJOB_METRICS_PORT": "-1"}, "SLURMJOB_METRICS_PORT: Input should be greater"),
    ({"SLURMJOB_METRICS_PORT": "http"}, "SLURMJOB_METRICS_PORT: Input should be a valid integer"),
    ({"SLURMJOB_LOGS_PORT": "65536"}, "SLURMJOB_LOGS_PORT: Input should be less than"),
    ({"SLURMJOB_LOGS_ADDRESS": "a" * 254}, "SLURMJOB_LOGS_ADDRESS: String should have at most"),
    (
        {"SLURMJOB_LOGS_TLS_CERT_FILE": "/tls/tls.crt"},
        "Value error, SLURMJOB_LOGS_TLS_CERT_FILE and SLURMJOB_LOGS_TLS_KEY_FILE go together",
    ),
    (
        {"SLURMJOB_LOGS_TLS_KEY_FILE": "/tls/tls.key"},
        "Value error, SLURMJOB_LOGS_TLS_CERT_FILE and SLURMJOB_LOGS_TLS_KEY_FILE go together",
    ),
    (
        {
            "SLURMJOB_LOGS_TLS_CERT_FILE": "/c",
            "SLURMJOB_LOGS_TLS_KEY_FILE": "/k",
            "SLURMJOB_LOGS_CERT_SECRET": "s",
        },
        "Value error, SLURMJOB_LOGS_CERT_SECRET is not read with SLURMJOB_LOGS_TLS_CERT_FILE",
    ),
    ({"SLURMJOB_LOGS_CERT_SECRET": "Bad_Name"}, "SLURMJOB_LOGS_CERT_SECRET: String should match"),
    ({"SLURMJOB_LOGS_SERVICE": "a.b"}, "SLURMJOB_LOGS_SERVICE: String should match pattern"),
    ({"SLURMJOB_POD_NAMESPACE": "a" * 64}, "SLURMJOB_POD_NAMESPACE: String should match"),
    ({"SLURMJOB_STAGING_OWNER": "1000"}, "SLURMJOB_STAGING_OWNER: String should match pattern"),
    ({"SLURMJOB_STAGING_OWNER": "slurm:slurm"}, "SLURMJOB_STAGING_OWNER: String should match"),
    (
        {"SLURMJOB_SLURM_RUNTIME_PROFILE": "docker"},
        "SLURMJOB_SLURM_RUNTIME_PROFILE: Input should be 'enroot-pyxis' or 'apptainer'",
    ),
    (
        {"SLURMJOB_SLURM_RUNTIME_PROFILE": "APPTAINER"},
        "SLURMJOB_SLURM_RUNTIME_PROFILE: Input should be 'enroot-pyxis' or 'apptainer'",
    ),
    (
        {"SLURMJOB_SLURM_REST_API_VERSION": "v0.0.39"},
        "SLURMJOB_SLURM_REST_API_VERSION: Value error, 'v0.0.39' is not supported; use auto or "
        f"one of {', '.join(SUPPORTED_VERSIONS)}",
    ),
    (
        {"SLURMJOB_SLURM_REST_API_VERSION": "AUTO"},
        "SLURMJOB_SLURM_REST_API_VERSION: Value error, 'AUTO' is not supported",
    ),
    # Several bad variables: the first setting in declaration order is named.
    (
        {"SLURMJOB_METRICS_PORT": "-1", "SLURMJOB_POLL_INTERVAL": "0"},
        "SLURMJOB_POLL_INTERVAL: ",
    ),
]


@pytest.mark.parametrize(("environ", "prefix"), ERRORS)
def test_a_bad_variable_is_named(environ: dict[str, str], prefix: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(environ)
    assert str(caught.value).startswith(prefix), str(caught.value)
    assert isinstance(caught.value.__cause__, ValidationError)


# -- where the values come from -------------------------------------------------------------------


def test_an_explicit_mapping_replaces_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMJOB_POLL_INTERVAL", "0")  # invalid: read, it would raise
    monkeypatch.setenv("SLURMJOB_STORAGE_ROOT", "/from/os")
    settings = Settings.from_env({"SLURMJOB_SLURM_PARTITION": "batch"})
    assert settings.slurm_partition == "batch"
    assert settings.poll_interval == 10.0
    assert settings.storage_root == Path("/var/lib/slurmjob")
    assert Settings.from_env({}) == Settings()


def test_without_a_mapping_os_environ_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMJOB_STORAGE_ROOT", "/from/os")
    monkeypatch.setenv("SLURMJOB_SLURM_TLS_VERIFY", "off")
    settings = Settings.from_env()
    assert settings.storage_root == Path("/from/os")
    assert settings.slurm_tls_verify is False
    monkeypatch.setenv("SLURMJOB_POLL_INTERVAL", "0")
    with pytest.raises(ConfigError, match=r"^SLURMJOB_POLL_INTERVAL: "):
        Settings.from_env()


def test_direct_construction_never_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMJOB_STORAGE_ROOT", "/from/os")
    monkeypatch.setenv("SLURMJOB_POLL_INTERVAL", "0")
    assert Settings().storage_root == Path("/var/lib/slurmjob")
    assert Settings(storage_root=Path("/s")).storage_root == Path("/s")


def test_from_env_leaves_no_environment_behind() -> None:
    Settings.from_env({"SLURMJOB_STORAGE_ROOT": "/a"})
    with pytest.raises(ConfigError):
        Settings.from_env({"SLURMJOB_POLL_INTERVAL": "0"})
    assert Settings().storage_root == Path("/var/lib/slurmjob")


def test_threads_read_their_own_mapping() -> None:
    results: dict[str, Path] = {}

    def read(root: str) -> None:
        for _ in range(50):
            results[root] = Settings.from_env({"SLURMJOB_STORAGE_ROOT": root}).storage_root
            assert results[root] == Path(root)

    threads = [threading.Thread(target=read, args=(f"/root{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {f"/root{i}": Path(f"/root{i}") for i in range(4)}


# -- direct construction (tests and callers that build Settings themselves) -----------------------


def test_keyword_arguments_are_validated_and_exact() -> None:
    assert Settings(slurm_tls_verify=False).slurm_tls_verify is False
    with pytest.raises(ValidationError):
        Settings(poll_interval=0)
    with pytest.raises(ValidationError):
        Settings(bogus=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        Settings(STORAGE_ROOT="/s")  # type: ignore[call-arg]


def test_settings_are_frozen_and_hashable() -> None:
    settings = Settings()
    with pytest.raises(ValidationError):
        settings.poll_interval = 1.0  # type: ignore[misc]
    assert hash(settings) == hash(Settings())


def test_every_setting_has_a_description() -> None:
    for field, info in Settings.model_fields.items():
        assert info.description, field


def test_cluster_paths() -> None:
    same = Settings(storage_root=Path("/lustre/sj"))
    assert same.cluster_storage_root == Path("/lustre/sj")
    assert same.to_cluster_path(Path("/lustre/sj/a/b")) == Path("/lustre/sj/a/b")
    mapped = Settings(storage_root=Path("/data"), slurm_storage_root=Path("/lustre/sj"))
    assert mapped.cluster_storage_root == Path("/lustre/sj")
    assert mapped.to_cluster_path(Path("/data/a/b")) == Path("/lustre/sj/a/b")
    with pytest.raises(ValueError, match="not in the subpath"):
        mapped.to_cluster_path(Path("/elsewhere/a"))
