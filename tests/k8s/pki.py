"""The test bed's certificates, made with the ``openssl`` CLI and kept across restarts.

Two certificate authorities, as a kubeadm cluster has:

* ``ca``: signs the apiserver's serving certificate and every client certificate the test
  bed hands out (the admin, ``kubeconfig_for`` users); ``--client-ca-file``.
* ``front-proxy-ca``: signs only ``front-proxy-client``, the certificate the aggregator
  presents to an aggregated API server (``--proxy-client-cert-file``), which trusts the
  ``X-Remote-*`` headers of a client that CA signed (``--requestheader-client-ca-file``).
  A CA of its own, since with one CA any user's client certificate would be a front proxy
  able to claim to be anyone.

``ensure`` makes what is missing and says whether it made anything (a running apiserver
loaded the old files, so it must be restarted).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

CERT_DAYS = 3650
FRONT_PROXY_CA = "front-proxy-ca"
FRONT_PROXY_CLIENT = "front-proxy-client"

CLIENT_EXT = (
    "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
    "extendedKeyUsage=clientAuth\n"
)


class PkiError(RuntimeError):
    """openssl failed."""


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise PkiError(f"openssl {' '.join(args)} failed (rc {proc.returncode}):\n{proc.stderr}")


def write_private(path: Path, text: str) -> None:
    """``text`` into ``path``, mode 0600, atomically."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.chmod(0o600)
    tmp.replace(path)


@dataclass(frozen=True)
class Pki:
    directory: Path

    def crt(self, name: str) -> Path:
        return self.directory / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.directory / f"{name}.key"

    def has(self, name: str) -> bool:
        return self.crt(name).is_file() and self.key(name).is_file()

    def _make_ca(self, name: str, common_name: str) -> None:
        tmp_key = self.directory / f"{name}.key.tmp"
        _openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(tmp_key),
            "-out", str(self.crt(name)), "-days", str(CERT_DAYS), "-sha256",
            "-subj", f"/CN={common_name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        )  # fmt: skip
        tmp_key.chmod(0o600)
        tmp_key.replace(self.key(name))

    def sign(self, name: str, subject: str, extensions: str, ca: str = "ca") -> None:
        """<name>.key + <name>.crt signed by ``ca`` (written atomically)."""
        d = self.directory
        csr, ext_file = d / f"{name}.csr", d / f"{name}.ext"
        tmp_key, tmp_crt = d / f"{name}.key.tmp", d / f"{name}.crt.tmp"
        ext_file.write_text(extensions)
        _openssl(
            "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(tmp_key)
        )
        _openssl("req", "-new", "-key", str(tmp_key), "-subj", subject, "-out", str(csr))
        _openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(self.crt(ca)), "-CAkey", str(self.key(ca)),
            "-set_serial", str(int.from_bytes(os.urandom(8), "big")),
            "-days", str(CERT_DAYS), "-sha256", "-extfile", str(ext_file), "-out", str(tmp_crt),
        )  # fmt: skip
        tmp_key.chmod(0o600)
        tmp_key.replace(self.key(name))
        tmp_crt.replace(self.crt(name))
        csr.unlink(missing_ok=True)
        ext_file.unlink(missing_ok=True)

    def ensure(self, sans: list[str], admin_subject: str) -> bool:
        """Both CAs, the apiserver's serving certificate, the admin's client certificate, the
        front proxy's and the service-account key pair; True when any was made now."""
        d = self.directory
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o700)
        made = False
        if not self.has("ca"):
            for f in d.iterdir():  # everything else was signed by the old CA
                f.unlink()
            self._make_ca("ca", "slurmjob-testbed-ca")
            made = True
        if not self.has("apiserver"):
            self.sign(
                "apiserver",
                "/CN=kube-apiserver",
                "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                f"extendedKeyUsage=serverAuth\nsubjectAltName={','.join(sans)}\n",
            )
            made = True
        if not self.has("admin"):
            self.sign("admin", admin_subject, CLIENT_EXT)
            made = True
        if not self.has(FRONT_PROXY_CA):
            for f in (self.crt(FRONT_PROXY_CLIENT), self.key(FRONT_PROXY_CLIENT)):
                f.unlink(missing_ok=True)
            self._make_ca(FRONT_PROXY_CA, "slurmjob-testbed-front-proxy-ca")
            made = True
        if not self.has(FRONT_PROXY_CLIENT):
            self.sign(FRONT_PROXY_CLIENT, f"/CN={FRONT_PROXY_CLIENT}", CLIENT_EXT, FRONT_PROXY_CA)
            made = True
        if not (d / "sa.key").is_file() or not (d / "sa.pub").is_file():
            tmp = d / "sa.key.tmp"
            _openssl(
                "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(tmp)
            )
            _openssl("pkey", "-in", str(tmp), "-pubout", "-out", str(d / "sa.pub"))
            tmp.chmod(0o600)
            tmp.replace(d / "sa.key")
            made = True
        return made
