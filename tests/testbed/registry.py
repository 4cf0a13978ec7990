"""The test bed's OCI registries: distribution's ``registry`` on 127.0.0.1 with TLS, and the
test bed's job image pushed to them with ``crane`` (both built from Go modules by
tests/k8s/build.sh).

Two registries, each a ``registry serve`` of its own with its own storage:

* ``open``: ``https://127.0.0.1:25000``, anonymous pull and push;
* ``private``: ``https://127.0.0.1:25001``, HTTP Basic authentication from an htpasswd file
  (one user, ``USER``; a random password made once and kept). Enroot 4.1.2 answers a
  ``WWW-Authenticate: Basic`` challenge itself (src/docker.sh: the credentials from a
  ``machine 127.0.0.1 login USER password PW`` line in ``$ENROOT_CONFIG_PATH/.credentials``,
  or ``docker://USER@...``), over HTTP/1.1 only (see ``_config``), and Apptainer with
  ``APPTAINER_DOCKER_USERNAME`` and ``APPTAINER_DOCKER_PASSWORD``: no token server is needed.

The ports follow the test bed's scheme (a "2" before the daemon's usual port: 6443 -> 22443
for kube-apiserver, 5000 -> 25000 here). Both serve a certificate for IP 127.0.0.1 signed by
a CA of the registries' own (made with ``openssl`` as tests/k8s/pki.py makes kube's, kept
across restarts). ``ca-bundle.crt`` is Debian's CA bundle plus that CA: Enroot reads it
through ``SSL_CERT_FILE`` in the enroot.conf that tests/testbed/runtimes.sh writes (host and
chroot; ``/srv/slurmjob-testbed`` is the same directory in both), Apptainer and crane (Go)
through ``SSL_CERT_FILE`` in their environment (``Registries.tls_env``).

The images, made from the test bed's base image (tests/testbed/images.sh) and pushed as
Docker v2 schema 2 (Enroot's manifest probe needs it), one gzip layer each:

* ``base``: ``127.0.0.1:25000/slurmjob/base:1``, the base image's tree;
* ``private``: ``127.0.0.1:25001/slurmjob/base:1``, the same;
* ``corruptible``: ``127.0.0.1:25000/slurmjob/corruptible:1``, that tree plus
  ``CORRUPTIBLE_MARKER``: a layer no other image shares, which ``Registries.corrupted``
  damages on disk for a while (one byte; the registry serves it as it is).

The layer is the base image's squashfs unpacked and tarred (sorted, owner 0, mtime 0) once
per image content; the image is written as an OCI layout holding the Docker media types and
pushed with ``crane push``, so its manifest (and digest) is known before the push, and a push
whose tag already names that digest is skipped.

Everything is under ``/srv/slurmjob-testbed/registry``: ``<name>/data`` (the storage),
``run/``, ``log/``, ``pki/``, ``auth/``, ``layers/``.

CLI::

    python -m tests.testbed.registry up | down | status
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import dataclasses
import fcntl
import functools
import gzip
import hashlib
import json
import os
import secrets
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.k8s import pki
from tests.testbed import images, procs

REPO = Path(__file__).resolve().parents[2]
GOMOD_DIR = REPO / "tests" / "k8s" / "gomod"
CACHE_DIR = Path(os.environ.get("SLURMJOB_TESTBED_K8S_CACHE", "/var/cache/slurmjob-testbed/k8s"))
BASE = Path("/srv/slurmjob-testbed/registry")
PKI = pki.Pki(BASE / "pki")
CA_FILE = BASE / "ca.crt"
#: Debian's CA bundle plus the registries' CA; runtimes.sh names it in enroot.conf.
CA_BUNDLE = BASE / "ca-bundle.crt"
SYSTEM_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
AUTH_DIR = BASE / "auth"
RUN_DIR = BASE / "run"
LOG_DIR = BASE / "log"
LAYERS_DIR = BASE / "layers"
KEEP_ENV = "SLURMJOB_TESTBED_KEEP"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

HOST = "127.0.0.1"
PORTS = {"open": 25000, "private": 25001}
USER = "slurmjob-pull"
REALM = "slurmjob-testbed-registry"
REGISTRY_MODULE = "github.com/distribution/distribution/v3"
CRANE_MODULE = "github.com/google/go-containerregistry"

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
#: In the corruptible image only (its layer is its own).
CORRUPTIBLE_MARKER = "etc/slurmjob-testbed-registry-corruptible"
#: Bump when the layers or configs made below change (new layers, new digests).
LAYER_RECIPE = 1
IMAGE_ENV = [f"PATH={SYSTEM_PATH}"]

_CHILDREN: dict[str, subprocess.Popen[bytes]] = {}


class RegistryError(RuntimeError):
    """A registry could not be built, started, filled or stopped."""


def _log(msg: str) -> None:
    procs.log("registry", msg)


# --------------------------------------------------------------------------- the images


@dataclasses.dataclass(frozen=True)
class Image:
    """One pushed image: where it is and what it is."""

    name: str
    registry: str  # "open" or "private"
    repository: str
    tag: str
    digest: str  # the manifest's, sha256:...
    layer_digest: str  # its one layer's (gzip), sha256:...

    @property
    def host(self) -> str:
        return f"{HOST}:{PORTS[self.registry]}"

    @property
    def ref(self) -> str:
        """``127.0.0.1:25000/slurmjob/base:1`` (crane, Apptainer after ``docker://``)."""
        return f"{self.host}/{self.repository}:{self.tag}"

    @property
    def digest_ref(self) -> str:
        """``127.0.0.1:25000/slurmjob/base@sha256:...``."""
        return f"{self.host}/{self.repository}@{self.digest}"

    def enroot_uri(self, by_digest: bool = False) -> str:
        """Enroot's form: ``docker://127.0.0.1:25000#slurmjob/base:1`` (or ``@sha256:...``)."""
        tail = f"@{self.digest}" if by_digest else f":{self.tag}"
        return f"docker://{self.host}#{self.repository}{tail}"

    def docker_uri(self, by_digest: bool = False) -> str:
        """``docker://`` + the reference (Apptainer; Enroot 4.1.2 reads it too)."""
        return f"docker://{self.digest_ref if by_digest else self.ref}"

    def blob_path(self) -> Path:
        """The layer's file in the registry's storage (distribution's filesystem driver)."""
        hexd = self.layer_digest.removeprefix("sha256:")
        return (
            BASE / self.registry / "data" / "docker/registry/v2/blobs/sha256" / hexd[:2] / hexd
        ) / "data"

    def blob_intact(self) -> bool:
        """The layer's file on disk hashes to its digest."""
        path = self.blob_path()
        return path.is_file() and _sha256_file(path) == self.layer_digest


@dataclasses.dataclass(frozen=True)
class _Spec:
    name: str
    registry: str
    repository: str
    tag: str
    layer: str  # the file name under the layer directory


SPECS = (
    _Spec("base", "open", "slurmjob/base", "1", "base.tar.gz"),
    _Spec("private", "private", "slurmjob/base", "1", "base.tar.gz"),
    _Spec("corruptible", "open", "slurmjob/corruptible", "1", "corruptible.tar.gz"),
)


def _run(argv: Sequence[str], what: str, timeout: float = 300) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RegistryError(f"{what} failed (rc {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def _layer_dir() -> Path:
    """The layers of the current base image (its cache key in images.sh is its directory's
    name), made once: ``base.tar.gz``, ``corruptible.tar.gz`` and ``layers.json`` (their
    digests, sizes and diff ids)."""
    try:
        sqsh = images.image("base", "sqsh")
    except images.ImagesMissing as exc:
        raise RegistryError(str(exc)) from None
    out = LAYERS_DIR / f"{sqsh.parent.name}-r{LAYER_RECIPE}"
    if (out / "layers.json").is_file():
        return out
    LAYERS_DIR.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=".tmp-", dir=LAYERS_DIR))
    try:
        tree = work / "tree"
        _run(["unsquashfs", "-no-progress", "-d", str(tree), str(sqsh)], "unsquashfs")
        meta: dict[str, dict[str, str | int]] = {}
        meta["base.tar.gz"] = _tar_gz(tree, work / "base.tar.gz")
        (tree / CORRUPTIBLE_MARKER).write_text("slurmjob-testbed-registry corruptible\n")
        meta["corruptible.tar.gz"] = _tar_gz(tree, work / "corruptible.tar.gz")
        shutil.rmtree(tree)
        (work / "layers.json").write_text(json.dumps(meta, indent=1) + "\n")
        work.chmod(0o755)
        shutil.rmtree(out, ignore_errors=True)
        work.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _log(f"layers of {sqsh.parent.name} made in {time.monotonic() - t0:.1f} s")
    for stale in LAYERS_DIR.iterdir():  # earlier images' layers
        if stale != out and not stale.name.startswith(".tmp-"):
            shutil.rmtree(stale, ignore_errors=True)
    return out


def _tar_gz(tree: Path, out: Path) -> dict[str, str | int]:
    """``tree`` as a layer: a tar (names sorted, owner 0, mtime 0, no ``./`` prefix)
    gzip-compressed (no name, mtime 0); its digest, size and diff id (the tar's sha256)."""
    names = sorted(p.name for p in tree.iterdir())
    argv = ["tar", "--create", "--file=-", f"--directory={tree}", "--sort=name", "--mtime=@0"]
    argv += ["--owner=0", "--group=0", "--numeric-owner", "--format=gnu", "--", *names]
    diff = hashlib.sha256()
    with (
        tempfile.TemporaryFile() as err,
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err) as proc,
    ):
        assert proc.stdout is not None
        with out.open("wb") as raw, gzip.GzipFile("", "wb", 6, raw, mtime=0) as gz:
            while chunk := proc.stdout.read(1 << 20):
                diff.update(chunk)
                gz.write(chunk)
        proc.wait()
        err.seek(0)
        if proc.returncode != 0:
            text = err.read().decode(errors="replace")
            raise RegistryError(f"tar of {tree} failed (rc {proc.returncode}): {text}")
    return {
        "digest": _sha256_file(out),
        "size": out.stat().st_size,
        "diff_id": "sha256:" + diff.hexdigest(),
    }


def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def _image_blobs(layer: dict[str, str | int], source: str) -> tuple[bytes, bytes]:
    """(config, manifest) of a one-layer image, Docker v2 schema 2, canonical JSON."""
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"Env": IMAGE_ENV, "Cmd": ["/bin/bash"]},
        "rootfs": {"type": "layers", "diff_ids": [layer["diff_id"]]},
        "history": [
            {"created": "1970-01-01T00:00:00Z", "created_by": f"tests/testbed/registry.py {source}"}
        ],
    }
    config_digest, config_bytes = _blob(json.dumps(config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": DOCKER_MANIFEST,
        "config": {"mediaType": DOCKER_CONFIG, "size": len(config_bytes), "digest": config_digest},
        "layers": [{"mediaType": DOCKER_LAYER, "size": layer["size"], "digest": layer["digest"]}],
    }
    return config_bytes, json.dumps(manifest, indent=3).encode()


# --------------------------------------------------------------------------- binaries


def _require_version(wrapper: str, module: str) -> str:
    """The version ``module`` is required at in ``tests/k8s/gomod/<wrapper>/go.mod``."""
    go_mod = GOMOD_DIR / wrapper / "go.mod"
    for line in go_mod.read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["require"]:
            parts = parts[1:]
        if len(parts) >= 2 and parts[0] == module:
            return parts[1]
    raise RegistryError(f"no require line for {module} in {go_mod}")


def binaries() -> dict[str, Path]:
    """``registry`` and ``crane`` as tests/k8s/build.sh caches them; raises when missing."""
    found = {
        "registry": CACHE_DIR / f"registry-{_require_version('registry', REGISTRY_MODULE)}",
        "crane": CACHE_DIR / f"crane-{_require_version('crane', CRANE_MODULE)}",
    }
    found = {name: d / name for name, d in found.items()}
    missing = [str(p) for p in found.values() if not os.access(p, os.X_OK)]
    if missing:
        raise RegistryError(
            f"missing: {', '.join(missing)}; run `bash tests/k8s/build.sh registry crane` "
            "(make testbed does)"
        )
    return found


# --------------------------------------------------------------------------- the handle


@dataclasses.dataclass(frozen=True)
class Registries:
    """What a test needs: the images, the CA, the credentials and crane."""

    images: dict[str, Image]
    ca_file: Path
    ca_bundle: Path
    user: str
    password: str
    crane_bin: Path

    def image(self, name: str) -> Image:
        return self.images[name]

    def tls_env(self) -> dict[str, str]:
        """How a Go program (Apptainer, crane) trusts the registries: the bundle."""
        return {"SSL_CERT_FILE": str(self.ca_bundle)}

    def apptainer_credentials(self) -> dict[str, str]:
        return {"APPTAINER_DOCKER_USERNAME": self.user, "APPTAINER_DOCKER_PASSWORD": self.password}

    def enroot_credentials(self) -> str:
        """The line of ``$ENROOT_CONFIG_PATH/.credentials`` (netrc) for the private registry
        (Enroot matches the host without the port)."""
        return f"machine {HOST} login {self.user} password {self.password}\n"

    def crane(
        self, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """crane with the registries' CA and the private registry's credentials."""
        proc = subprocess.run(
            [str(self.crane_bin), *args],
            capture_output=True,
            text=True,
            env=_crane_env(),
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            out = proc.stdout + proc.stderr
            raise RegistryError(f"crane {' '.join(args)} failed (rc {proc.returncode}):\n{out}")
        return proc

    @contextlib.contextmanager
    def corrupted(self, name: str = "corruptible") -> Iterator[Path]:
        """Image ``name``'s layer damaged on disk (one byte flipped, same size) while the
        block runs, restored after; yields the blob's path. Holds a lock: two modules that
        corrupt it take turns. A runtime's own layer cache (Enroot's ENROOT_CACHE_PATH,
        Apptainer's cache) must not hold that layer already."""
        image = self.images[name]
        sharing = [
            i.name
            for i in self.images.values()
            if i.name != name
            and (i.registry, i.layer_digest) == (image.registry, image.layer_digest)
        ]
        if sharing:
            raise RegistryError(f"{name}'s layer is also {', '.join(sharing)}'s in its registry")
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        with (RUN_DIR / "corrupt.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                corrupt_blob(image)
                yield image.blob_path()
            finally:
                restore_blob(image)


def _pristine(image: Image) -> Path:
    """The layer file as it was pushed (the registry stores the bytes crane sent)."""
    spec = next(s for s in SPECS if s.name == image.name)
    return _layer_dir() / spec.layer


def _write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.unlink(missing_ok=True)
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as fh:
        fh.write(data)
    tmp.chmod(mode)
    tmp.replace(path)


def corrupt_blob(image: Image) -> Path:
    """Flip one byte in the middle of ``image``'s layer in the registry's storage."""
    path = image.blob_path()
    data = bytearray(_pristine(image).read_bytes())
    data[len(data) // 2] ^= 0xFF
    _write_atomic(path, bytes(data))
    _log(f"corrupted {path} ({image.ref})")
    return path


def restore_blob(image: Image) -> None:
    """Put ``image``'s layer back as pushed (a no-op when it is intact)."""
    path = image.blob_path()
    if image.blob_intact():
        return
    pristine = _pristine(image)
    _write_atomic(path, pristine.read_bytes())
    if _sha256_file(path) != image.layer_digest:
        raise RegistryError(f"{path} does not hash to {image.layer_digest} after restoring")
    _log(f"restored {path} ({image.ref})")


# --------------------------------------------------------------------------- credentials, TLS


def _password() -> str:
    path = AUTH_DIR / "password"
    if not path.is_file():
        pki.write_private(path, secrets.token_urlsafe(18) + "\n")
    return path.read_text().strip()


def _crypt(password: str, setting: bytes | None = None) -> str:
    """crypt(3) of glibc's libcrypt (libxcrypt): with no ``setting``, a new bcrypt hash (what
    distribution's htpasswd accepts; Python's own crypt module is deprecated)."""
    lib = ctypes.CDLL("libcrypt.so.1")
    lib.crypt_gensalt.restype = ctypes.c_char_p
    lib.crypt_gensalt.argtypes = [ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_int]
    lib.crypt.restype = ctypes.c_char_p
    lib.crypt.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    if setting is None:
        setting = lib.crypt_gensalt(b"$2b$", 10, None, 0)
    hashed: bytes | None = lib.crypt(password.encode(), setting) if setting else None
    if not hashed or not hashed.startswith(b"$2b$"):
        raise RegistryError("libcrypt.so.1 made no bcrypt hash (needs libxcrypt's bcrypt)")
    return hashed.decode()


def _ensure_auth() -> str:
    """The password; the htpasswd file and crane's Docker config match it."""
    AUTH_DIR.mkdir(parents=True, exist_ok=True)
    AUTH_DIR.chmod(0o700)
    password = _password()
    htpasswd = AUTH_DIR / "htpasswd"
    current = htpasswd.read_text().strip() if htpasswd.is_file() else ""
    user, _, hashed = current.partition(":")
    if user != USER or not hashed.startswith("$2b$") or _crypt(password, hashed.encode()) != hashed:
        pki.write_private(htpasswd, f"{USER}:{_crypt(password)}\n")
    auth = base64.b64encode(f"{USER}:{password}".encode()).decode()
    docker = {"auths": {f"{HOST}:{PORTS['private']}": {"auth": auth}}}
    (AUTH_DIR / "docker").mkdir(exist_ok=True)
    _write_if_changed(AUTH_DIR / "docker" / "config.json", json.dumps(docker) + "\n", 0o600)
    return password


def _write_if_changed(path: Path, text: str, mode: int = 0o644) -> bool:
    if path.is_file() and path.read_text() == text:
        return False
    _write_atomic(path, text.encode(), mode)
    return True


def _ensure_tls() -> bool:
    """The CA, the serving certificate, the public CA copy and the bundle; True when the
    CA or the certificate was made now (a running registry must be restarted)."""
    made = False
    PKI.directory.mkdir(parents=True, exist_ok=True)
    PKI.directory.chmod(0o700)
    if not PKI.has("ca"):
        for f in PKI.directory.iterdir():
            f.unlink()
        PKI._make_ca("ca", "slurmjob-testbed-registry-ca")
        made = True
    if not PKI.has("server"):
        PKI.sign(
            "server",
            "/CN=slurmjob-testbed-registry",
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            f"extendedKeyUsage=serverAuth\nsubjectAltName=IP:{HOST},DNS:localhost\n",
        )
        made = True
    ca = PKI.crt("ca").read_text()
    _write_if_changed(CA_FILE, ca)
    system = SYSTEM_BUNDLE.read_text() if SYSTEM_BUNDLE.is_file() else ""
    _write_if_changed(CA_BUNDLE, system.rstrip("\n") + "\n" + ca if system else ca)
    return made


def _crane_env() -> dict[str, str]:
    return {
        "PATH": SYSTEM_PATH,
        "HOME": str(BASE / "home"),
        "DOCKER_CONFIG": str(AUTH_DIR / "docker"),
        "SSL_CERT_FILE": str(CA_BUNDLE),
    }


# --------------------------------------------------------------------------- the daemons


def _config(name: str) -> str:
    """The registry's configuration (JSON, which is YAML)."""
    secret_file = AUTH_DIR / "http-secret"
    if not secret_file.is_file():
        pki.write_private(secret_file, secrets.token_hex(16) + "\n")
    http: dict[str, object] = {
        "addr": f"{HOST}:{PORTS[name]}",
        "secret": secret_file.read_text().strip(),
        "tls": {"certificate": str(PKI.crt("server")), "key": str(PKI.key("server"))},
        "headers": {"X-Content-Type-Options": ["nosniff"]},
    }
    config: dict[str, object] = {
        "version": "0.1",
        "log": {"level": "info", "formatter": "text", "accesslog": {"disabled": False}},
        "storage": {
            "filesystem": {"rootdirectory": str(BASE / name / "data")},
            "delete": {"enabled": True},
            "maintenance": {"uploadpurging": {"enabled": False}},
        },
        "http": http,
    }
    if name == "private":
        config["auth"] = {"htpasswd": {"realm": REALM, "path": str(AUTH_DIR / "htpasswd")}}
        # HTTP/1.1 only: Enroot 4.1.2 takes the Basic credentials it sends from `curl -v`'s
        # "Authorization: Basic" line, which HTTP/2 prints in lower case ("authorization:"):
        # it then finds none, sends none, and every request after the challenge gets 401.
        http["http2"] = {"disabled": True}
    return json.dumps(config, indent=2) + "\n"


def _config_path(name: str) -> Path:
    return BASE / name / "config.yml"


def _pid_file(name: str) -> Path:
    return RUN_DIR / f"{name}.pid"


def _argv(binary: Path, name: str) -> list[str]:
    return [str(binary), "serve", str(_config_path(name))]


def _ssl_context() -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(CA_FILE))


def _request(
    url: str, method: str = "GET", headers: dict[str, str] | None = None, timeout: float = 5
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body); status 0 with the error text when it did not connect."""
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=_ssl_context()) as resp:
            return resp.status, dict(resp.headers.items()), resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, dict(exc.headers.items()), exc.read()
    except (urllib.error.URLError, OSError, ssl.SSLError) as exc:
        return 0, {}, str(exc).encode()


def _auth_header(name: str) -> dict[str, str]:
    if name != "private":
        return {}
    token = base64.b64encode(f"{USER}:{_password()}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def _ok(name: str) -> tuple[bool, str]:
    """GET /v2/ answers 200 (with the credentials for the private one)."""
    status, _, body = _request(f"https://{HOST}:{PORTS[name]}/v2/", headers=_auth_header(name))
    return status == 200, f"HTTP {status}: {body[:200].decode(errors='replace')}"


def _healthy(name: str) -> bool:
    return procs.running("registry", _pid_file(name)) and _ok(name)[0]


def _running_argv(name: str) -> list[str] | None:
    pid = procs.read_pid(_pid_file(name))
    if pid is None or not procs.pid_alive(pid, "registry"):
        return None
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _start(name: str, binary: Path) -> None:
    t0 = time.monotonic()
    log = LOG_DIR / f"{name}.log"
    (BASE / name / "data").mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            _argv(binary, name),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            cwd=BASE / name,
            # No OpenTelemetry exporter (distribution v3 traces to localhost:4318 otherwise).
            env={
                "PATH": SYSTEM_PATH,
                "HOME": str(BASE / "home"),
                "OTEL_TRACES_EXPORTER": "none",
                "OTEL_METRICS_EXPORTER": "none",
                "OTEL_LOGS_EXPORTER": "none",
            },
            start_new_session=True,
        )
    _CHILDREN[name] = proc
    _pid_file(name).write_text(f"{proc.pid}\n")
    last = [""]

    def check() -> bool:
        if proc.poll() is not None:
            tail = procs.tail(log, 40)
            raise RegistryError(f"registry {name} exited with rc {proc.returncode}\n{tail}")
        good, last[0] = _ok(name)
        return good

    procs.wait(
        f"registry {name} on {PORTS[name]}",
        check,
        20,
        [log],
        error=RegistryError,
        detail=lambda: last[0],
    )
    _log(f"{name} registry up on https://{HOST}:{PORTS[name]} in {time.monotonic() - t0:.2f} s")


def _manifest_digest(name: str, repository: str, tag: str) -> str | None:
    url = f"https://{HOST}:{PORTS[name]}/v2/{repository}/manifests/{tag}"
    headers = {"Accept": DOCKER_MANIFEST, **_auth_header(name)}
    status, got, body = _request(url, "HEAD", headers)
    if status == 200:
        return {k.lower(): v for k, v in got.items()}.get("docker-content-digest")
    if status == 404:
        return None
    raise RegistryError(f"HEAD {url}: HTTP {status} {body[:200].decode(errors='replace')}")


def _push_all(crane: Path) -> dict[str, Image]:
    """Every image of SPECS in its registry: pushed unless its tag names it already."""
    layers = _layer_dir()
    meta = json.loads((layers / "layers.json").read_text())
    source = layers.name
    out: dict[str, Image] = {}
    for spec in SPECS:
        layer = meta[spec.layer]
        config, manifest = _image_blobs(layer, source)
        digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
        image = Image(
            spec.name, spec.registry, spec.repository, spec.tag, digest, str(layer["digest"])
        )
        out[spec.name] = image
        if _manifest_digest(spec.registry, spec.repository, spec.tag) == digest:
            restore_blob(image)  # a run that died corrupted may have left it so
            continue
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=".layout-", dir=BASE) as tmp:
            root = Path(tmp)
            blobs = root / "blobs" / "sha256"
            blobs.mkdir(parents=True)
            os.link(layers / spec.layer, blobs / str(layer["digest"]).removeprefix("sha256:"))
            for data in (config, manifest):
                (blobs / hashlib.sha256(data).hexdigest()).write_bytes(data)
            (root / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
            index = {
                "schemaVersion": 2,
                "manifests": [
                    {"mediaType": DOCKER_MANIFEST, "size": len(manifest), "digest": digest}
                ],
            }
            (root / "index.json").write_text(json.dumps(index))
            proc = subprocess.run(
                [str(crane), "push", str(root), image.ref],
                capture_output=True,
                text=True,
                env=_crane_env(),
                timeout=300,
                check=False,
            )
        if proc.returncode != 0 or digest not in proc.stdout:
            raise RegistryError(
                f"crane push {image.ref} failed (rc {proc.returncode}):\n{proc.stdout}{proc.stderr}"
            )
        restore_blob(image)  # a blob left corrupted is not uploaded again
        _log(f"pushed {image.ref} ({digest[:19]}...) in {time.monotonic() - t0:.1f} s")
    return out


def _images_from_registry() -> dict[str, Image]:
    """The images as the running registries hold them (a lane attaching: no pushes)."""
    layers = _layer_dir()
    meta = json.loads((layers / "layers.json").read_text())
    out: dict[str, Image] = {}
    for spec in SPECS:
        layer = meta[spec.layer]
        _, manifest = _image_blobs(layer, layers.name)
        digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
        if _manifest_digest(spec.registry, spec.repository, spec.tag) != digest:
            where = f"{spec.repository}:{spec.tag} in the {spec.registry} registry"
            raise RegistryError(f"{where} is not the current image (tests/lanes.py pushes it)")
        out[spec.name] = Image(
            spec.name, spec.registry, spec.repository, spec.tag, digest, str(layer["digest"])
        )
    return out


# --------------------------------------------------------------------------- public API


def keep_requested() -> bool:
    return os.environ.get(KEEP_ENV, "") not in ("", "0", "false", "no")


def start_registries(reuse: bool | None = None) -> Registries:
    """Both registries up and the images in them.

    With ``reuse`` (default: $SLURMJOB_TESTBED_KEEP is set) a running, answering registry
    with the same command line, configuration and certificate is used as is; otherwise it is
    restarted (its storage is kept: a push of what is there is skipped). In a lane of
    tests/lanes.py it only waits for the runner's registries."""
    if os.geteuid() != 0:
        raise RegistryError("the registries of the test bed must be started as root")
    bins = binaries()
    if procs.shared_requested():
        for name in PORTS:
            procs.attach(f"{name} registry", functools.partial(_healthy, name), error=RegistryError)
        return _handle(bins, _images_from_registry())
    if reuse is None:
        reuse = keep_requested()
    for d in (BASE, RUN_DIR, LOG_DIR, BASE / "home", *(BASE / n for n in PORTS)):
        d.mkdir(mode=0o755, parents=True, exist_ok=True)
    try:
        made = _ensure_tls()
    except pki.PkiError as exc:
        raise RegistryError(str(exc)) from None
    _ensure_auth()
    for name in PORTS:
        changed = _write_if_changed(_config_path(name), _config(name), 0o600)
        if reuse and _healthy(name):
            if not (made or changed) and _running_argv(name) == _argv(bins["registry"], name):
                _log(f"re-using the running {name} registry")
                continue
            _log(f"the running {name} registry has another configuration: restarting it")
        _stop(name)
        if not procs.port_free(HOST, PORTS[name]):
            owner = procs.port_owner(PORTS[name])
            raise RegistryError(f"port {PORTS[name]} of the {name} registry is taken: {owner}")
        try:
            _start(name, bins["registry"])
        except BaseException:
            _stop(name)
            raise
    return _handle(bins, _push_all(bins["crane"]))


def _handle(bins: dict[str, Path], pushed: dict[str, Image]) -> Registries:
    return Registries(
        images=pushed,
        ca_file=CA_FILE,
        ca_bundle=CA_BUNDLE,
        user=USER,
        password=_password(),
        crane_bin=bins["crane"],
    )


def _stop(name: str) -> None:
    procs.stop_pid("registry", _pid_file(name), log=_log, timeout=10)
    procs.reap_child(_CHILDREN.pop(name, None))


def stop_registries() -> None:
    """Stop both registries through their pid files (storage, certificates kept)."""
    for name in PORTS:
        _stop(name)


def status() -> str:
    parts = [f"{n}={'up' if _healthy(n) else 'down'}" for n in PORTS]
    return " ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0] not in ("up", "down", "status"):
        print("usage: python -m tests.testbed.registry up|down|status")
        return 2
    try:
        if args[0] == "up":
            regs = start_registries(reuse=True)
            for image in regs.images.values():
                print(f"{image.name}={image.ref} {image.digest}")
            print(f"SSL_CERT_FILE={regs.ca_bundle}")
        elif args[0] == "down":
            stop_registries()
        else:
            print(f"registries: {status()}")
    except RegistryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
