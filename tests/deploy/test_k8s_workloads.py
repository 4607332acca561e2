"""Kubernetes workloads: probes, resources, pod security, the shared configuration, and the
services and workers they run. The shared loading, validators and contracts are in
:mod:`tests.deploy.manifests`."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.deploy.manifests import (
    API_PORT,
    K8S,
    METRICS_PORT,
    MIGRATE_COMMAND,
    QUEUES,
    SECRET_KEYS,
    SERVE_COMMAND,
    SHARED_ENV,
    WORKER_GRACE_SECONDS,
    by_name,
    is_drcredit_image,
    iter_containers,
    k8s_resources,
    main_resources,
    of_kind,
    pod_spec,
    resolve_port,
    worker_command,
    worker_deployments,
)

# ---------------------------------------------------------------------------
# Kubernetes: workloads
# ---------------------------------------------------------------------------


def all_workloads() -> list[dict[str, Any]]:
    docs = k8s_resources()
    return of_kind(docs, "Deployment") + of_kind(docs, "StatefulSet")


@pytest.mark.parametrize("workload", all_workloads(), ids=lambda w: f"{w['kind']}/{w['metadata']['name']}")
def test_workload_has_probes_and_resource_requests(workload: dict[str, Any]) -> None:
    for c in pod_spec(workload)["containers"]:
        assert "readinessProbe" in c, f"{c['name']}: no readinessProbe"
        assert "livenessProbe" in c, f"{c['name']}: no livenessProbe"
        requests = c.get("resources", {}).get("requests", {})
        assert {"cpu", "memory"} <= requests.keys(), f"{c['name']}: cpu/memory requests"
        assert "memory" in c["resources"].get("limits", {}), f"{c['name']}: memory limit"
        for probe in ("readinessProbe", "livenessProbe"):
            http = c[probe].get("httpGet")
            if http:
                resolve_port(c, http["port"])  # named ports must exist


def test_namespace_enforces_restricted_pod_security() -> None:
    (ns,) = of_kind(main_resources(), "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


@pytest.mark.parametrize(
    "workload", all_workloads() + of_kind(k8s_resources(), "Job"), ids=lambda w: f"{w['kind']}/{w['metadata']['name']}"
)
def test_workload_meets_restricted_pod_security(workload: dict[str, Any]) -> None:
    """The fields the `restricted` Pod Security Standard requires (namespace.yaml enforces it)."""
    spec = pod_spec(workload)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
    for c in iter_containers(workload):
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
        assert not sc.get("capabilities", {}).get("add"), c["name"]
        assert not sc.get("privileged"), c["name"]
    allowed_volumes = {
        "configMap",
        "emptyDir",
        "persistentVolumeClaim",
        "secret",
        "projected",
        "downwardAPI",
        "csi",
        "ephemeral",
    }
    for volume in spec.get("volumes", []):
        assert set(volume) - {"name"} <= allowed_volumes, volume


def drcredit_workloads() -> list[dict[str, Any]]:
    docs = k8s_resources()
    wl = of_kind(docs, "Deployment") + of_kind(docs, "StatefulSet") + of_kind(docs, "Job")
    return [w for w in wl if any(is_drcredit_image(c["image"]) for c in iter_containers(w))]


@pytest.mark.parametrize("workload", drcredit_workloads(), ids=lambda w: f"{w['kind']}/{w['metadata']['name']}")
def test_drcredit_pods_share_image_config_and_uid(workload: dict[str, Any]) -> None:
    assert pod_spec(workload)["securityContext"]["runAsUser"] == 10001  # USER in deploy/Dockerfile
    for c in iter_containers(workload):
        assert c["image"].split(":")[0] == "drcredit", "image is set via kustomization `images`"
        refs = [(k, v["name"]) for e in c.get("envFrom", []) for k, v in e.items()]
        # Secret after ConfigMap: on a duplicate key the later envFrom source wins.
        assert refs == [("configMapRef", "drcredit-config"), ("secretRef", "drcredit-secrets")]
        assert c["command"][0] == "drcredit"


def test_env_sources_exist() -> None:
    docs = k8s_resources()
    configmaps, secrets = by_name(docs, "ConfigMap"), by_name(docs, "Secret")
    for w in all_workloads() + of_kind(docs, "Job"):
        for c in iter_containers(w):
            for e in c.get("envFrom", []):
                if "configMapRef" in e:
                    assert e["configMapRef"]["name"] in configmaps
                if "secretRef" in e:
                    assert e["secretRef"]["name"] in secrets


def test_config_and_secret_cover_the_shared_environment() -> None:
    docs = main_resources()
    config = by_name(docs, "ConfigMap")["drcredit-config"]["data"]
    secret = by_name(docs, "Secret")["drcredit-secrets"]["stringData"]
    assert set(secret) == SECRET_KEYS
    assert not set(config) & SECRET_KEYS, "credentials must not be in the ConfigMap"
    assert set(config) | set(secret) == set(SHARED_ENV)
    assert config["DRCREDIT_LOG_FORMAT"] == "json"
    assert urlsplit(secret["DRCREDIT_DATABASE_URL"]).scheme == "postgresql+psycopg"
    assert urlsplit(config["DRCREDIT_BROKER_URL"]).scheme == "redis"


def test_dev_database_url_matches_dependencies() -> None:
    """The Secret's (dev) DATABASE_URL must reach k8s/dependencies' Postgres."""
    url = urlsplit(by_name(main_resources(), "Secret")["drcredit-secrets"]["stringData"]["DRCREDIT_DATABASE_URL"])
    deps = k8s_resources(K8S / "dependencies")
    pg = by_name(deps, "Secret")["drcredit-postgres"]["stringData"]
    service = by_name(deps, "Service")[url.hostname]
    assert (url.username, url.password, url.path.lstrip("/")) == (
        pg["POSTGRES_USER"],
        pg["POSTGRES_PASSWORD"],
        pg["POSTGRES_DB"],
    )
    assert url.port in {p["port"] for p in service["spec"]["ports"]}


def test_broker_url_points_at_dependencies_redis() -> None:
    url = urlsplit(by_name(main_resources(), "ConfigMap")["drcredit-config"]["data"]["DRCREDIT_BROKER_URL"])
    service = by_name(k8s_resources(K8S / "dependencies"), "Service")[url.hostname]
    assert url.port in {p["port"] for p in service["spec"]["ports"]}


def test_services_select_existing_pods() -> None:
    workloads = all_workloads()
    for svc in of_kind(k8s_resources(), "Service"):
        selector = svc["spec"]["selector"]
        matches = [w for w in workloads if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(matches) == 1, f"Service {svc['metadata']['name']} selects {len(matches)} workloads"
        containers = pod_spec(matches[0])["containers"]
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            assert any(_has_port(c, target) for c in containers), f"{svc['metadata']['name']}: {target}"


def _has_port(container: dict[str, Any], port: int | str) -> bool:
    try:
        resolved = resolve_port(container, port)
    except AssertionError:
        return False
    return any(p["containerPort"] == resolved for p in container.get("ports", []))


def test_workload_selectors_match_their_templates() -> None:
    for w in all_workloads():
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert w["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_api_deployment_and_service() -> None:
    docs = main_resources()
    api = by_name(docs, "Deployment")["drcredit-api"]
    (c,) = pod_spec(api)["containers"]
    assert c["command"] == SERVE_COMMAND
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert resolve_port(c, c["readinessProbe"]["httpGet"]["port"]) == API_PORT
    assert resolve_port(c, c["livenessProbe"]["httpGet"]["port"]) == API_PORT
    assert {"cpu", "memory"} <= c["resources"]["limits"].keys()
    annotations = api["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(API_PORT)
    assert annotations["prometheus.io/path"] == "/metrics"
    svc = by_name(docs, "Service")["drcredit-api"]
    assert [p["port"] for p in svc["spec"]["ports"]] == [API_PORT]


def test_migration_job() -> None:
    (job,) = of_kind(main_resources(), "Job")
    (c,) = pod_spec(job)["containers"]
    assert c["command"] == MIGRATE_COMMAND
    assert pod_spec(job)["restartPolicy"] == "Never"
    assert job["spec"]["backoffLimit"] >= 1


def test_one_worker_deployment_per_queue() -> None:
    assert set(worker_deployments()) == set(QUEUES)


@pytest.mark.parametrize("queue", sorted(QUEUES))
def test_worker_deployment(queue: str) -> None:
    d = worker_deployments()[queue]
    spec = pod_spec(d)
    (c,) = spec["containers"]
    assert c["command"] == worker_command(queue)
    assert spec["terminationGracePeriodSeconds"] == WORKER_GRACE_SECONDS
    assert "replicas" not in d["spec"], "the autoscaler owns the replica count"
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    assert env["DRCREDIT_METRICS_PORT"] == str(METRICS_PORT)
    for probe in ("readinessProbe", "livenessProbe"):
        http = c[probe]["httpGet"]
        assert http["path"] == "/metrics"
        assert resolve_port(c, http["port"]) == METRICS_PORT
    annotations = d["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(METRICS_PORT)
