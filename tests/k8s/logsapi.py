"""The operator's aggregated log API on the test bed: what a cluster would route to a pod.

The kube-aggregator with ``--enable-aggregator-routing=true`` resolves an APIService's
Service to one of its EndpointSlices' ready addresses (``k8s.io/apiserver`` v0.36.3,
``pkg/util/proxy/proxy.go`` ``ResolveEndpoint``: the slices labelled
``kubernetes.io/service-name``, the slice port whose name is the Service port's; no Pod, no
Endpoints object). Its availability controller (``kube-aggregator``
``controllers/status/remote``) wants that Service with the APIService's port, a slice with a
ready address on that port name, and a 2xx from ``GET /apis/<group>/<version>`` over TLS
verified against ``spec.caBundle`` for ``<service>.<namespace>.svc``, as the front proxy;
until then the apiserver answers 503 for the group.

The address is the network namespace's (``tests/k8s/netns.py``), where a relay takes each
connection on to the operator on 127.0.0.1. The operator keeps its own serving certificate
in a Secret and patches the APIService's ``caBundle`` (``SLURMJOB_LOGS_CERT_SECRET``,
``SLURMJOB_LOGS_APISERVICE``), so the APIService is made without one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import yaml
from tests.k8s import netns
from tests.k8s.kube import KubeTestbed, TestbedError

from slurmjob_operator.api.logs import API_GROUP, API_SERVICE_NAME, API_VERSION

GROUP, VERSION, APISERVICE = API_GROUP, API_VERSION, API_SERVICE_NAME

SERVICE_PORT = 443
PORT_NAME = "https"


@dataclass
class LogsBackend:
    kube: KubeTestbed
    namespace: str
    service: str
    relay: netns.Relay

    def condition(self) -> dict[str, Any]:
        """The APIService's Available condition ({} while it has none)."""
        proc = self.kube.kubectl("get", "apiservice", APISERVICE, "-o", "json", check=False)
        if proc.returncode != 0:
            return {}
        conditions = (json.loads(proc.stdout).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c.get("type") == "Available"), {})

    def wait_available(self, timeout: float = 60) -> None:
        """Until the aggregator finds the operator's discovery answer good. A failed check
        is retried with a back-off of up to 30 s; an annotation touched every few seconds
        makes it look again at once."""
        deadline = time.monotonic() + timeout
        poked = time.monotonic()
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            last = self.condition()
            if last.get("status") == "True":
                return
            if time.monotonic() - poked > 3:
                self.kube.kubectl(
                    "annotate", "apiservice", APISERVICE, "--overwrite",
                    f"slurmjob-testbed/poked={time.monotonic_ns()}",
                    check=False,
                )  # fmt: skip
                poked = time.monotonic()
            time.sleep(0.25)
        raise TestbedError(f"APIService {APISERVICE} not Available within {timeout:.0f} s: {last}")

    def remove_apiservice(self) -> None:
        """Delete the APIService (an unavailable one would fail every client's discovery)."""
        self.kube.kubectl("delete", "apiservice", APISERVICE, "--ignore-not-found", check=False)


def objects(namespace: str, service: str, port: int) -> list[dict[str, Any]]:
    """The selector-less Service, its EndpointSlice at the namespace's address and the
    APIService pointing at it (no caBundle: the operator patches it in)."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": service, "namespace": namespace},
            "spec": {
                "type": "ClusterIP",
                "ports": [{"name": PORT_NAME, "port": SERVICE_PORT, "targetPort": port}],
            },
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{service}-testbed",
                "namespace": namespace,
                "labels": {
                    "kubernetes.io/service-name": service,
                    "endpointslice.kubernetes.io/managed-by": "slurmjob-testbed",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [netns.NS_ADDRESS], "conditions": {"ready": True}}],
            "ports": [{"name": PORT_NAME, "port": port, "protocol": "TCP"}],
        },
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": APISERVICE},
            "spec": {
                "group": GROUP,
                "version": VERSION,
                "groupPriorityMinimum": 1000,
                "versionPriority": 15,
                "service": {"namespace": namespace, "name": service, "port": SERVICE_PORT},
            },
        },
    ]


@contextmanager
def logs_backend(
    kube: KubeTestbed, namespace: str, service: str, operator_port: int
) -> Iterator[LogsBackend]:
    """The namespace and its relay to 127.0.0.1:``operator_port``, and the objects that
    route the log API there; all removed on the way out (the APIService first)."""
    netns.ensure()
    relay = netns.Relay(netns.listen(), ("127.0.0.1", operator_port)).start()
    backend = LogsBackend(kube, namespace, service, relay)
    try:
        backend.remove_apiservice()  # a previous run's, with another caBundle
        docs = objects(namespace, service, relay.address[1])
        kube.apply("\n---\n".join(yaml.safe_dump(d) for d in docs) + "\n")
        yield backend
    finally:
        backend.remove_apiservice()
        relay.close()
        netns.remove()
