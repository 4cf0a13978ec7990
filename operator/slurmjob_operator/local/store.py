"""`submit`'s state: each SlurmJob a JSON file `<state dir>/<namespace>/<name>.json` (the whole
object, status included, rewritten atomically), status writes as RFC 7386 merge patches as on
the API server, Events as lines on a stream, Secrets from a YAML file `{secretName: {key:
value}}`; and the manifest checks and metadata the API server would apply."""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TextIO

import yaml

from slurmjob_operator import GROUP, KIND, VERSION
from slurmjob_operator.api import patch as merge_patch
from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.kube import SecretError
from slurmjob_operator.storage.files import write_atomically
from slurmjob_operator.times import rfc3339

APP_DIR = "slurmjob-operator"
DEFAULT_NAMESPACE = "default"
#: Kubernetes' rules for a custom resource's name (DNS subdomain) and a namespace (DNS label).
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_NAME_RE = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
_NAMESPACE_RE = re.compile(rf"^{_LABEL}$")


class LocalInputError(ValueError):
    """Invalid input to `submit` (a name, a file, a conflict): exit code 2."""


# -- files ------------------------------------------------------------------------------


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """`$XDG_STATE_HOME/slurmjob-operator`, else `~/.local/state/slurmjob-operator`."""
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_STATE_HOME", "")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / APP_DIR
    home = env.get("HOME") or str(Path.home())
    return Path(home) / ".local" / "state" / APP_DIR


def load_secrets_file(path: Path) -> dict[str, dict[str, str]]:
    """`{secretName: {key: value}}` from YAML; every value a string (as in `stringData`)."""
    label = f"--secrets-file {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise LocalInputError(f"{label}: cannot read: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise LocalInputError(f"{label}: not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise LocalInputError(f"{label}: expected a mapping {{secretName: {{key: value}}}}")
    secrets: dict[str, dict[str, str]] = {}
    for name, keys in data.items():
        if not isinstance(name, str) or not isinstance(keys, dict):
            raise LocalInputError(f"{label}: {name}: expected a mapping of keys to values")
        values: dict[str, str] = {}
        for key, value in keys.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise LocalInputError(
                    f"{label}: {name}.{key}: expected a string value (quote numbers and booleans)"
                )
            values[key] = value
        secrets[name] = values
    return secrets


# -- the store --------------------------------------------------------------------------


class LocalStore:
    """The controller's `ResourceStore` on local files (see the module docstring)."""

    # Its files stay after a cancel and their final status is printed (`KeepsDeleted`): a
    # deletion writes the last tails there, as it does where another finalizer holds one.
    keeps_deleted: Literal[True] = True

    def __init__(
        self,
        state_dir: Path,
        *,
        secrets_file: Path | None = None,
        events: TextIO | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.secrets_file = secrets_file
        self._events = events

    def path(self, namespace: str, name: str) -> Path:
        _check_names(namespace, name)
        return self.state_dir / namespace / f"{name}.json"

    # -- synchronous helpers (small files) --------------------------------------------------

    def load(self, namespace: str, name: str) -> dict[str, Any] | None:
        path = self.path(namespace, name)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            body = json.loads(text)
        except ValueError as exc:
            raise OSError(f"{path}: not a SlurmJob state file: {exc}") from exc
        if not isinstance(body, dict):
            raise OSError(f"{path}: not a SlurmJob state file")
        return body

    def save(self, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        path = self.path(str(meta.get("namespace")), str(meta.get("name")))
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, (json.dumps(body, indent=2) + "\n").encode())

    def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Store a new object; FileExistsError when one of that name exists."""
        meta = body.get("metadata") or {}
        path = self.path(str(meta.get("namespace")), str(meta.get("name")))
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, (json.dumps(body, indent=2) + "\n").encode(), exclusive=True)
        return dict(body)

    def remove(self, namespace: str, name: str) -> bool:
        try:
            self.path(namespace, name).unlink()
        except FileNotFoundError:
            return False
        return True

    def _secrets(self) -> dict[str, dict[str, str]]:
        if self.secrets_file is None:
            return {}
        try:
            return load_secrets_file(self.secrets_file)
        except LocalInputError as exc:
            raise SecretError(str(exc)) from exc

    def emit(self, line: str) -> None:
        if self._events is not None:
            self._events.write(line + "\n")
            self._events.flush()

    # -- ResourceStore ------------------------------------------------------------------------

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.load(namespace, name)

    async def patch_status(
        self, ref: ObjectRef, patch: Mapping[str, Any], resource_version: str | None = None
    ) -> dict[str, Any] | None:
        """Merge-patch the status; None when the object is gone or is another one (uid).
        Local files have no versions: one process writes them, so the condition always holds."""
        body = self.load(ref.namespace, ref.name)
        if body is None or (body.get("metadata") or {}).get("uid") != ref.uid:
            return None
        before = (body.get("status") or {}).get("phase")
        body["status"] = merge_patch.apply(body.get("status") or {}, dict(patch))
        self.save(body)
        after = body["status"].get("phase") if isinstance(body["status"], dict) else None
        if after != before and after is not None:
            self.emit(f"phase: {after}")
        return body

    async def read_secret_value(self, namespace: str, name: str, key: str) -> str:
        secrets = self._secrets()
        where = f" in {self.secrets_file}" if self.secrets_file else " (no --secrets-file given)"
        if name not in secrets:
            raise SecretError(f"Secret {namespace}/{name} does not exist{where}")
        if key not in secrets[name]:
            raise SecretError(f"Secret {namespace}/{name} has no key {key!r}{where}")
        return secrets[name][key]

    async def post_event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        self.emit(f"{type_} {reason}: {message}")

    async def close(self) -> None:
        return None


# -- objects ----------------------------------------------------------------------------


def _check_names(namespace: str, name: str) -> None:
    if not _NAMESPACE_RE.match(namespace) or len(namespace) > 63:
        raise LocalInputError(
            f"metadata.namespace: {namespace!r} is not a valid namespace "
            "(lowercase letters, digits and '-', at most 63)"
        )
    if not _NAME_RE.match(name) or len(name) > 253:
        raise LocalInputError(
            f"metadata.name: {name!r} is not a valid name "
            "(lowercase letters, digits, '-' and '.', at most 253)"
        )


def object_key(manifest: Mapping[str, Any], namespace: str | None = None) -> tuple[str, str]:
    """(namespace, name) of a manifest; `namespace` (the -n option) must agree with it."""
    meta = manifest.get("metadata") or {}
    if not isinstance(meta, Mapping):
        raise LocalInputError("metadata: expected an object")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise LocalInputError("metadata.name: required")
    own = meta.get("namespace")
    if own is not None and not isinstance(own, str):
        raise LocalInputError("metadata.namespace: expected a string")
    if own and namespace and own != namespace:
        raise LocalInputError(
            f"metadata.namespace: {own!r} does not match the namespace {namespace!r} given by -n"
        )
    ns = own or namespace or DEFAULT_NAMESPACE
    _check_names(ns, name)
    return ns, name


def new_object(manifest: Mapping[str, Any], namespace: str, name: str) -> dict[str, Any]:
    """The stored object: the manifest's spec with the metadata the API server would add."""
    meta = dict(manifest.get("metadata") or {})
    labels = meta.get("labels")
    annotations = meta.get("annotations")
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": str(uuid.uuid4()),
        "generation": 1,
        "creationTimestamp": rfc3339(datetime.now(tz=UTC)),
    }
    if isinstance(labels, dict):
        metadata["labels"] = labels
    if isinstance(annotations, dict):
        metadata["annotations"] = annotations
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": metadata,
        "spec": manifest.get("spec"),
    }
