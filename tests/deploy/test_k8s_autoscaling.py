"""Kubernetes autoscaling: the KEDA objects, and the HPA alternative. The shared loading,
validators and contracts are in
:mod:`tests.deploy.manifests`."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.deploy.manifests import (
    K8S,
    QUEUES,
    by_name,
    k8s_resources,
    main_resources,
    of_kind,
    pod_spec,
    worker_deployments,
)

# ---------------------------------------------------------------------------
# Kubernetes: autoscaling (KEDA, and the HPA alternative)
# ---------------------------------------------------------------------------


def redis_trigger(so: dict[str, Any]) -> dict[str, Any]:
    triggers: list[dict[str, Any]] = [t for t in so["spec"]["triggers"] if t["type"] == "redis"]
    (trigger,) = triggers
    return trigger


@pytest.mark.parametrize("queue", sorted(QUEUES))
def test_every_queue_has_a_scaledobject(queue: str) -> None:
    docs = main_resources()
    matching = [so for so in of_kind(docs, "ScaledObject") if redis_trigger(so)["metadata"]["listName"] == queue]
    assert len(matching) == 1, f"exactly one ScaledObject watches {queue}"
    so = matching[0]
    target = so["spec"]["scaleTargetRef"]
    assert target.get("kind", "Deployment") == "Deployment"
    deployments = by_name(docs, "Deployment")
    assert target["name"] in deployments, "scaleTargetRef names an existing Deployment"
    # ...and that Deployment consumes the very queue the trigger watches.
    assert deployments[target["name"]] is worker_deployments()[queue]
    assert 1 <= so["spec"]["minReplicaCount"] <= so["spec"]["maxReplicaCount"]
    assert int(redis_trigger(so)["metadata"]["listLength"]) > 0


def test_scaledobjects_watch_the_broker_redis() -> None:
    """KEDA's address/db must be the Redis and db of DRCREDIT_BROKER_URL."""
    docs = main_resources()
    broker = urlsplit(by_name(docs, "ConfigMap")["drcredit-config"]["data"]["DRCREDIT_BROKER_URL"])
    broker_db = broker.path.lstrip("/") or "0"
    for so in of_kind(docs, "ScaledObject"):
        meta = redis_trigger(so)["metadata"]
        host, port = meta["address"].rsplit(":", 1)
        # KEDA runs in its own namespace, so the address is the FQDN of the
        # same Service the pods reach by its short name.
        assert host.split(".")[0] == broker.hostname.split(".")[0]
        if host != broker.hostname:
            assert host.split(".")[1] == so["metadata"]["namespace"]
        assert int(port) == broker.port
        assert meta.get("databaseIndex", "0") == broker_db


def test_scaledobject_authentication_refs_resolve() -> None:
    docs = main_resources()
    auths = by_name(docs, "TriggerAuthentication")
    secrets = by_name(docs, "Secret")
    for so in of_kind(docs, "ScaledObject"):
        for trigger in so["spec"]["triggers"]:
            if "authenticationRef" in trigger:
                assert trigger["authenticationRef"]["name"] in auths
    for ta in auths.values():
        for ref in ta["spec"].get("secretTargetRef", []):
            assert ref["key"] in secrets[ref["name"]].get("stringData", {})


def test_hpa_alternative_covers_every_worker() -> None:
    hpas = of_kind(k8s_resources(K8S / "hpa"), "HorizontalPodAutoscaler")
    workers = {d["metadata"]["name"] for d in worker_deployments().values()}
    targets = [h["spec"]["scaleTargetRef"] for h in hpas]
    assert sorted(t["name"] for t in targets) == sorted(workers)
    for hpa in hpas:
        assert hpa["apiVersion"] == "autoscaling/v2"
        assert hpa["spec"]["scaleTargetRef"]["kind"] == "Deployment"
        (metric,) = hpa["spec"]["metrics"]
        assert metric["type"] == "Resource"
        assert metric["resource"]["name"] == "cpu"
        assert metric["resource"]["target"]["type"] == "Utilization"
        assert hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    # CPU utilization is relative to the request: every target must set one.
    for d in worker_deployments().values():
        assert "cpu" in pod_spec(d)["containers"][0]["resources"]["requests"]
