"""A SlurmJob as the operator reads it: parsed once, where the body comes in, and passed
down frozen (the raw mapping never travels further than this module)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any

from slurmjob_operator.api.errors import SpecError, parse_spec
from slurmjob_operator.api.spec import SlurmJobSpec
from slurmjob_operator.api.status import SlurmJobStatus


@dataclass(frozen=True)
class ObjectRef:
    namespace: str
    name: str
    uid: str

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> ObjectRef:
        meta = body.get("metadata") or {}
        return cls(str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid")))


@dataclass(frozen=True)
class SecretRef:
    """One env var of the spec taken from a Secret key of the resource's own namespace."""

    env: str
    secret: str
    key: str


@dataclass(frozen=True)
class ResourceView:
    ref: ObjectRef
    generation: int | None
    annotations: Mapping[str, str]
    deleting: bool
    status: SlurmJobStatus
    # Kept for the spec's lazy parse only: most reads (the poller's) never need the spec.
    _raw_spec: Any = field(repr=False, compare=False)
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # The version a status write from this view is conditioned on (a 409 when the resource
    # changed since), the one its last write returned; None: on the uid only.
    resource_version: str | None = None
    # metadata.finalizers: whether anyone besides the operator keeps the resource once it lets
    # go decides what a deletion still writes into it.
    finalizers: tuple[str, ...] = ()

    @classmethod
    def of(cls, body: Mapping[str, Any], *, conditioned: bool = False) -> ResourceView:
        """`conditioned`: status writes made from this view carry its resourceVersion, so a
        copy older than the apiserver's (the watch's, say) writes nothing and is read again."""
        meta = body.get("metadata") or {}
        version = meta.get("resourceVersion") if conditioned else None
        generation = meta.get("generation")
        annotations = meta.get("annotations") or {}
        return cls(
            ref=ObjectRef.of(body),
            generation=int(generation) if generation is not None else None,
            annotations=MappingProxyType({str(k): str(v) for k, v in annotations.items()}),
            deleting=bool(meta.get("deletionTimestamp")),
            status=SlurmJobStatus.parse(body.get("status")),
            _raw_spec=body.get("spec"),
            labels=MappingProxyType(
                {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
            ),
            resource_version=str(version) if version else None,
            finalizers=_names(meta.get("finalizers")),
        )

    @cached_property
    def _parsed(self) -> SlurmJobSpec | SpecError:
        try:
            return parse_spec(self._raw_spec)
        except SpecError as exc:
            return exc

    @property
    def spec(self) -> SlurmJobSpec | None:
        """The validated spec, None when it is invalid (`spec_error` says why)."""
        parsed = self._parsed
        return parsed if isinstance(parsed, SlurmJobSpec) else None

    @property
    def spec_cluster(self) -> str | None:
        """spec.cluster as written: where to route the resource needs no parse of the spec
        (a name that is no cluster's is refused by the submission it is routed to)."""
        raw = self._raw_spec.get("cluster") if isinstance(self._raw_spec, Mapping) else None
        return raw if isinstance(raw, str) else None

    @property
    def spec_error(self) -> SpecError | None:
        parsed = self._parsed
        return parsed if isinstance(parsed, SpecError) else None

    @property
    def secret_refs(self) -> tuple[SecretRef, ...]:
        """The spec's secret env vars. For a spec that does not validate (one a newer release
        refuses, say) they are read from the raw spec all the same: its running job may print
        those values, and they must still be hidden in its log tails."""
        spec = self.spec
        if spec is not None:
            return tuple(
                SecretRef(e.name, e.value_from.secret_key_ref.name, e.value_from.secret_key_ref.key)
                for e in spec.secret_env
                if e.value_from is not None
            )
        raw = self._raw_spec if isinstance(self._raw_spec, Mapping) else {}
        env = raw.get("env")
        refs: list[SecretRef] = []
        for item in env if isinstance(env, list) else []:
            source = item.get("valueFrom") if isinstance(item, Mapping) else None
            ref = source.get("secretKeyRef") if isinstance(source, Mapping) else None
            if isinstance(ref, Mapping):
                env_name, secret, key = item.get("name"), ref.get("name"), ref.get("key")
                if all(isinstance(n, str) and n for n in (env_name, secret, key)):
                    refs.append(SecretRef(str(env_name), str(secret), str(key)))
        return tuple(refs)

    @property
    def suspend(self) -> bool:
        """spec.suspend; for a spec that does not validate, the field as written (a user who
        suspends a broken spec still sees it suspended, not failed)."""
        spec = self.spec
        if spec is not None:
            return spec.suspend
        raw = self._raw_spec if isinstance(self._raw_spec, Mapping) else {}
        return bool(raw.get("suspend", False))

    @property
    def depends_on(self) -> tuple[str, ...]:
        """The names in spec.dependsOn, read from the raw spec without a parse (every watch
        event asks; at most 16 are taken, as the schema allows)."""
        raw = self._raw_spec.get("dependsOn") if isinstance(self._raw_spec, Mapping) else None
        if not isinstance(raw, list):
            return ()
        names = [d.get("name") for d in raw[:16] if isinstance(d, Mapping)]
        return tuple(n for n in names if isinstance(n, str) and 0 < len(n) <= 253)

    def with_status(
        self, status: SlurmJobStatus, resource_version: str | None = None
    ) -> ResourceView:
        """The same resource after a status write (the spec parse is not repeated); a
        conditioned view takes the version that write returned."""
        new = ResourceView(
            ref=self.ref,
            generation=self.generation,
            annotations=self.annotations,
            deleting=self.deleting,
            status=status,
            _raw_spec=self._raw_spec,
            labels=self.labels,
            resource_version=resource_version if self.resource_version is not None else None,
            finalizers=self.finalizers,
        )
        if "_parsed" in self.__dict__:
            new.__dict__["_parsed"] = self.__dict__["_parsed"]
        return new


def _names(raw: Any) -> tuple[str, ...]:
    """metadata.finalizers as a tuple of names: anything but a list of strings (the apiserver
    never sends one) counts as none, rather than a string read letter by letter."""
    if not isinstance(raw, list):
        return ()
    return tuple(name for name in raw if isinstance(name, str))
