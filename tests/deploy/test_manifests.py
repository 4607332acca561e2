"""Offline validation of the deployment files.

Covers docker-compose.yml, deploy/Dockerfile, deploy/prometheus.yml and every
manifest under k8s/. Everything runs without network or a cluster:

* docker-compose.yml   -> the Compose Specification JSON schema vendored by
                          the check-jsonschema package;
* Kubernetes resources -> kubernetes-validate's packaged OpenAPI-derived
                          schemas, in *strict* mode (unknown fields fail);
* KEDA objects, kustomization.yaml, prometheus.yml -> hand-written JSON
                          schemas in tests/deploy/schemas/ (no packaged schema
                          exists for them);
* deploy/Dockerfile    -> parsed with BuildKit's own parser (`dockerfile`).

Beyond schema validity the tests pin the contracts between the files: queue
names, worker commands, the metrics port, the shared environment, and that
every reference (Service selector, ScaledObject target, Secret name...) points
at something that exists. The `*_rejects_*` tests tamper with a valid document
and prove each validator actually fails on bad input.
"""

from __future__ import annotations

import copy
import importlib
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import dockerfile
import jsonschema
import kubernetes_validate
import pytest
import yaml
from check_jsonschema.builtin_schemas import get_builtin_schema

from drcredit.broker.queues import WORKER_SERVICES as SERVICES_OF_QUEUES

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "deploy" / "Dockerfile"
PROMETHEUS_FILE = REPO / "deploy" / "prometheus.yml"
SCHEMAS = Path(__file__).resolve().parent / "schemas"

# Kubernetes version the manifests are validated against (kubernetes-validate
# ships schemas for 1.25 .. 1.37; pick the oldest version we support running on).
K8S_VERSION = "1.33"

# --- Contracts with the application code: CLI, queue names, ports ----------
#: Each service's queue and the --concurrency its manifests run it with: its config.py,
#: for every worker service of the one list of services (drcredit.broker.queues).
CONFIGS = {c.queue: c for c in (importlib.import_module(f"{s.package}.config").WORKER for s in SERVICES_OF_QUEUES)}
QUEUES = {queue: c.concurrency for queue, c in CONFIGS.items()}
#: compose service name of the worker consuming each queue
WORKER_SERVICES = {s.compose_name: s.queue for s in SERVICES_OF_QUEUES}
METRICS_PORT = 9100
API_PORT = 8000
WORKER_GRACE_SECONDS = 120
SERVE_COMMAND = ["drcredit", "serve", "--host", "0.0.0.0", "--port", str(API_PORT)]
MIGRATE_COMMAND = ["drcredit", "db", "upgrade"]
SHARED_ENV = {
    "DRCREDIT_DATABASE_URL": "postgresql+psycopg://drcredit:drcredit@postgres:5432/drcredit",
    "DRCREDIT_BROKER_URL": "redis://redis:6379/0",
    "DRCREDIT_JUDGE": "${DRCREDIT_JUDGE:-openai}",
    "DRCREDIT_JUDGE_BASE_URL": "${DRCREDIT_JUDGE_BASE_URL:-http://judge:8000/v1}",
    "DRCREDIT_JUDGE_MODEL": "${DRCREDIT_JUDGE_MODEL:-Qwen/Qwen3-8B}",
    "DRCREDIT_JUDGE_API_KEY": "${DRCREDIT_JUDGE_API_KEY:-EMPTY}",
    "DRCREDIT_API_KEYS": "${DRCREDIT_API_KEYS:-}",
    "DRCREDIT_LOG_FORMAT": "json",
}
# Keys that carry credentials: k8s puts them in the Secret, never the ConfigMap.
SECRET_KEYS = {"DRCREDIT_DATABASE_URL", "DRCREDIT_JUDGE_API_KEY", "DRCREDIT_API_KEYS"}


def worker_command(queue: str) -> list[str]:
    """A worker of ``queue`` as deployed: its threads pinned, unless its config says not."""
    command = ["drcredit", "worker", "--queues", queue]
    return command + (["--concurrency", str(QUEUES[queue])] if CONFIGS[queue].pin_concurrency else [])


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    with path.open() as fh:
        return [doc for doc in yaml.safe_load_all(fh) if doc is not None]


def k8s_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*") if p.suffix in {".yaml", ".yml"})


@cache
def k8s_documents() -> tuple[tuple[str, int, dict[str, Any]], ...]:
    """(path relative to the repo, index in file, document) for every YAML doc."""
    out = []
    for path in k8s_files():
        for i, doc in enumerate(load_yaml_docs(path)):
            out.append((str(path.relative_to(REPO)), i, doc))
    return tuple(out)


def k8s_resources(directory: Path = K8S, *, recursive: bool = True) -> list[dict[str, Any]]:
    """Kubernetes objects (not kustomizations) under a directory."""
    docs = []
    for rel, _, doc in k8s_documents():
        path = REPO / rel
        inside = path.is_relative_to(directory) if recursive else path.parent == directory
        if inside and doc.get("kind") != "Kustomization":
            docs.append(doc)
    return docs


def main_resources() -> list[dict[str, Any]]:
    """Objects deployed by k8s/kustomization.yaml (top-level k8s/ files)."""
    return k8s_resources(K8S, recursive=False)


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def by_name(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in of_kind(docs, kind)}


@cache
def compose() -> dict[str, Any]:
    # safe_load resolves the `<<: *anchor` merge keys, as Compose does.
    data: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return data


@cache
def prometheus_config() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(PROMETHEUS_FILE.read_text())
    return config


@cache
def local_schema(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((SCHEMAS / name).read_text())
    return schema


# ---------------------------------------------------------------------------
# Validators
# ---------------------------------------------------------------------------


def _validator(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


@cache
def compose_validator() -> jsonschema.protocols.Validator:
    return _validator(get_builtin_schema("vendor.compose-spec"))


@cache
def local_validator(name: str) -> jsonschema.protocols.Validator:
    return _validator(local_schema(name))


LOCAL_SCHEMA_BY_KIND = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda-scaledobject.schema.json",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "keda-triggerauthentication.schema.json",
    ("kustomize.config.k8s.io/v1beta1", "Kustomization"): "kustomization.schema.json",
}


def validate_k8s_document(doc: dict[str, Any]) -> None:
    """Raise if `doc` is not a valid object of its apiVersion/kind."""
    assert isinstance(doc, dict), "a manifest document must be a mapping"
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in LOCAL_SCHEMA_BY_KIND:
        local_validator(LOCAL_SCHEMA_BY_KIND[key]).validate(doc)
        return
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError as exc:
        # An unknown kind must not pass silently.
        pytest.fail(exc.message)


def iter_containers(workload: dict[str, Any]) -> Iterator[dict[str, Any]]:
    pod = workload["spec"]["template"]["spec"]
    yield from pod.get("initContainers", [])
    yield from pod["containers"]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def resolve_port(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    for p in container.get("ports", []):
        if p.get("name") == port:
            number: int = p["containerPort"]
            return number
    raise AssertionError(f"container {container['name']} has no port named {port!r}")


def is_drcredit_image(image: str) -> bool:
    return image.rsplit("/", 1)[-1].split(":")[0].split("@")[0] == "drcredit"


def compose_default(value: str) -> str:
    """Value of a Compose string with no variables set (${X:-d} -> d, ${X} -> '')."""
    value = re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:?-([^}]*)\}", r"\1", value)
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}", "", value)


def duration_seconds(value: str) -> float:
    """Compose/Go duration ('1m30s', '120s') -> seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", value)
    assert parts and "".join(n + u for n, u in parts) == value, f"bad duration {value!r}"
    return sum(float(n) * units[u] for n, u in parts)


# ---------------------------------------------------------------------------
# Kubernetes: schema validation
# ---------------------------------------------------------------------------


def _doc_id(item: tuple[str, int, dict[str, Any]]) -> str:
    rel, i, doc = item
    name = (doc.get("metadata") or {}).get("name", "")
    return f"{rel}#{i}:{doc.get('kind')}/{name}"


@pytest.mark.parametrize("item", k8s_documents(), ids=_doc_id)
def test_k8s_document_validates(item: tuple[str, int, dict[str, Any]]) -> None:
    validate_k8s_document(item[2])


def test_k8s_tree_is_not_empty() -> None:
    kinds = {d["kind"] for _, _, d in k8s_documents()}
    expected = "Namespace ConfigMap Secret Job Deployment Service ScaledObject HorizontalPodAutoscaler StatefulSet Kustomization"
    assert set(expected.split()) <= kinds


def test_k8s_objects_are_namespaced_and_unique() -> None:
    seen: set[tuple[str, str]] = set()
    for rel, _, doc in k8s_documents():
        kind = doc["kind"]
        if kind in {"Kustomization", "Namespace"}:
            continue
        assert doc["metadata"].get("namespace") == "drcredit", f"{rel}: {kind} outside drcredit"
        key = (kind, doc["metadata"]["name"])
        assert key not in seen, f"duplicate {key}"
        seen.add(key)


def test_k8s_rejects_unknown_deployment_field() -> None:
    api = by_name(main_resources(), "Deployment")["drcredit-api"]
    validate_k8s_document(api)  # sanity: the untouched object passes

    tampered = copy.deepcopy(api)
    tampered["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGett"] = {}
    with pytest.raises(jsonschema.ValidationError):
        validate_k8s_document(tampered)

    tampered = copy.deepcopy(api)
    tampered["spec"]["replicaz"] = 3
    with pytest.raises(jsonschema.ValidationError):
        validate_k8s_document(tampered)


def test_k8s_rejects_wrong_types() -> None:
    api = by_name(main_resources(), "Deployment")["drcredit-api"]
    tampered = copy.deepcopy(api)
    tampered["spec"]["replicas"] = "two"
    with pytest.raises(jsonschema.ValidationError):
        validate_k8s_document(tampered)

    tampered = copy.deepcopy(api)
    del tampered["spec"]["template"]["spec"]["containers"][0]["name"]
    with pytest.raises(jsonschema.ValidationError):
        validate_k8s_document(tampered)


def test_k8s_rejects_unknown_kind() -> None:
    with pytest.raises(pytest.fail.Exception):
        validate_k8s_document({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})


def test_keda_schema_rejects_tampered_scaledobject() -> None:
    so = of_kind(main_resources(), "ScaledObject")[0]
    validate_k8s_document(so)

    tampered = copy.deepcopy(so)
    tampered["spec"]["maxReplicas"] = 5  # HPA spelling, not KEDA's
    with pytest.raises(jsonschema.ValidationError):
        validate_k8s_document(tampered)

    tampered = copy.deepcopy(so)
    tampered["spec"]["triggers"][0]["metadata"]["listname"] = "visit_judge"  # case typo
    with pytest.raises(jsonschema.ValidationError):
        validate_k8s_document(tampered)

    tampered = copy.deepcopy(so)
    tampered["spec"]["triggers"][0]["metadata"]["listLength"] = 64  # must be a string
    with pytest.raises(jsonschema.ValidationError):
        validate_k8s_document(tampered)

    tampered = copy.deepcopy(so)
    del tampered["spec"]["scaleTargetRef"]
    with pytest.raises(jsonschema.ValidationError):
        validate_k8s_document(tampered)


def test_keda_schema_rejects_tampered_triggerauthentication() -> None:
    ta = of_kind(main_resources(), "TriggerAuthentication")[0]
    validate_k8s_document(ta)

    tampered = copy.deepcopy(ta)
    tampered["spec"]["secretRef"] = tampered["spec"].pop("secretTargetRef")
    with pytest.raises(jsonschema.ValidationError):
        validate_k8s_document(tampered)

    tampered = copy.deepcopy(ta)
    del tampered["spec"]["secretTargetRef"][0]["key"]
    with pytest.raises(jsonschema.ValidationError):
        validate_k8s_document(tampered)


def test_kustomization_schema_rejects_typo() -> None:
    kust = load_yaml_docs(K8S / "kustomization.yaml")[0]
    validate_k8s_document(kust)
    tampered = copy.deepcopy(kust)
    tampered["resource"] = tampered.pop("resources")
    with pytest.raises(jsonschema.ValidationError):
        validate_k8s_document(tampered)


# ---------------------------------------------------------------------------
# Kubernetes: kustomizations
# ---------------------------------------------------------------------------

KUSTOMIZATION_DIRS = [K8S, K8S / "hpa", K8S / "dependencies"]


@pytest.mark.parametrize("directory", KUSTOMIZATION_DIRS, ids=lambda p: str(p.relative_to(REPO)))
def test_kustomization_lists_every_manifest_of_its_directory(directory: Path) -> None:
    kust = load_yaml_docs(directory / "kustomization.yaml")[0]
    listed = kust["resources"]
    for entry in listed:
        assert (directory / entry).is_file(), f"{directory}/{entry} does not exist"
    on_disk = sorted(p.name for p in directory.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == on_disk, "every manifest file is listed exactly once (no orphans)"
    assert kust.get("namespace") == "drcredit"


def test_main_kustomization_excludes_alternatives() -> None:
    listed = load_yaml_docs(K8S / "kustomization.yaml")[0]["resources"]
    assert not any(e.startswith(("hpa", "dependencies", "./hpa", "./dependencies")) for e in listed)
    # HPA and KEDA must never manage the same Deployment in one apply.
    assert not of_kind(main_resources(), "HorizontalPodAutoscaler")


def test_every_k8s_yaml_belongs_to_a_kustomization() -> None:
    for path in k8s_files():
        assert (path.parent / "kustomization.yaml").is_file(), f"{path} is in no kustomization"


def test_main_kustomization_sets_the_drcredit_image() -> None:
    images = load_yaml_docs(K8S / "kustomization.yaml")[0]["images"]
    assert [i["name"] for i in images] == ["drcredit"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (built-in kustomize) not installed")
@pytest.mark.parametrize("directory", KUSTOMIZATION_DIRS, ids=lambda p: str(p.relative_to(REPO)))
def test_kustomize_build_output_validates(directory: Path) -> None:
    proc = subprocess.run(
        ["kubectl", "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    built = [d for d in yaml.safe_load_all(proc.stdout) if d]
    source = k8s_resources(directory, recursive=False)
    assert len(built) == len(source)
    for doc in built:
        validate_k8s_document(doc)
        assert doc["metadata"].get("namespace", "drcredit") == "drcredit"


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


def worker_deployments() -> dict[str, dict[str, Any]]:
    """queue -> the Deployment whose container runs `drcredit worker --queues <queue>`."""
    out: dict[str, dict[str, Any]] = {}
    for d in of_kind(main_resources(), "Deployment"):
        cmd = pod_spec(d)["containers"][0]["command"]
        if cmd[:2] == ["drcredit", "worker"]:
            queue = cmd[cmd.index("--queues") + 1]
            assert queue not in out, f"two Deployments consume {queue}"
            out[queue] = d
    return out


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


# ---------------------------------------------------------------------------
# docker-compose.yml
# ---------------------------------------------------------------------------

DRCREDIT_COMPOSE_SERVICES = {"migrate", "api", *WORKER_SERVICES}


def test_compose_validates_against_compose_spec() -> None:
    compose_validator().validate(compose())


def test_compose_schema_rejects_invalid_service_key() -> None:
    tampered = copy.deepcopy(compose())
    tampered["services"]["api"]["helthcheck"] = tampered["services"]["api"].pop("healthcheck")
    with pytest.raises(jsonschema.ValidationError):
        compose_validator().validate(tampered)

    tampered = copy.deepcopy(compose())
    tampered["services"]["api"]["depends_on"]["migrate"]["condition"] = "service_finished"
    with pytest.raises(jsonschema.ValidationError):
        compose_validator().validate(tampered)

    tampered = copy.deepcopy(compose())
    tampered["services"]["redis"]["healthcheck"]["retry"] = 3
    with pytest.raises(jsonschema.ValidationError):
        compose_validator().validate(tampered)


def test_compose_services() -> None:
    assert set(compose()["services"]) == {
        "postgres",
        "redis",
        "prometheus",
        "grafana",
        "judge",
        *DRCREDIT_COMPOSE_SERVICES,
    }


def test_compose_shared_env_anchor() -> None:
    assert compose()["x-drcredit-env"] == SHARED_ENV


@pytest.mark.parametrize("name", sorted(DRCREDIT_COMPOSE_SERVICES))
def test_compose_drcredit_service_uses_shared_env_and_image(name: str) -> None:
    svc = compose()["services"][name]
    env = svc["environment"]
    assert isinstance(env, dict)
    assert {k: env.get(k) for k in SHARED_ENV} == SHARED_ENV
    assert svc["build"]["dockerfile"] == "deploy/Dockerfile"
    assert (REPO / svc["build"]["context"] / svc["build"]["dockerfile"]).is_file()
    assert compose_default(svc["image"]).split(":")[0] == "drcredit"


def test_compose_only_drcredit_services_build_the_image() -> None:
    builders = {n for n, s in compose()["services"].items() if "build" in s}
    assert builders == DRCREDIT_COMPOSE_SERVICES


def test_compose_dependencies_are_satisfiable() -> None:
    services = compose()["services"]
    for name, svc in services.items():
        deps = svc.get("depends_on", {})
        if isinstance(deps, list):  # short form: condition service_started
            deps = {d: {"condition": "service_started"} for d in deps}
        for dep, cond in deps.items():
            assert dep in services, f"{name} depends on unknown {dep}"
            assert "judge" not in services[dep].get("profiles", []), "judge is optional"
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], f"{dep} has no healthcheck"
            if cond["condition"] == "service_completed_successfully":
                assert services[dep].get("restart") == "no", f"{dep} must be one-shot"


def test_compose_backing_services() -> None:
    services = compose()["services"]
    pg, redis = services["postgres"], services["redis"]
    assert pg["image"] == "postgres:16"
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])
    assert any(v.endswith(":/var/lib/postgresql/data") for v in pg["volumes"])
    assert redis["image"] == "redis:7"
    assert "ping" in " ".join(redis["healthcheck"]["test"])
    # The shared DATABASE_URL must match the postgres container's credentials.
    url = urlsplit(SHARED_ENV["DRCREDIT_DATABASE_URL"])
    assert url.hostname == "postgres" and url.port == 5432
    assert (url.username, url.password, url.path.lstrip("/")) == (
        pg["environment"]["POSTGRES_USER"],
        pg["environment"]["POSTGRES_PASSWORD"],
        pg["environment"]["POSTGRES_DB"],
    )
    assert urlsplit(SHARED_ENV["DRCREDIT_BROKER_URL"]).hostname == "redis"


def test_compose_migrate() -> None:
    svc = compose()["services"]["migrate"]
    assert svc["command"] == MIGRATE_COMMAND
    assert svc["restart"] == "no"
    assert svc["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_compose_api() -> None:
    svc = compose()["services"]["api"]
    assert svc["command"] == SERVE_COMMAND
    assert f"{API_PORT}:{API_PORT}" in svc["ports"]
    assert svc["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert svc["depends_on"]["redis"]["condition"] == "service_healthy"
    assert f"http://localhost:{API_PORT}/healthz" in " ".join(svc["healthcheck"]["test"])


@pytest.mark.parametrize("name", sorted(WORKER_SERVICES))
def test_compose_worker(name: str) -> None:
    svc = compose()["services"][name]
    queue = WORKER_SERVICES[name]
    assert svc["command"] == worker_command(queue)
    assert svc["environment"]["DRCREDIT_METRICS_PORT"] == str(METRICS_PORT)
    assert str(METRICS_PORT) in [str(p) for p in svc["expose"]]
    assert svc["stop_signal"] == "SIGTERM"
    assert duration_seconds(svc["stop_grace_period"]) >= WORKER_GRACE_SECONDS
    assert svc["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert svc["depends_on"]["redis"]["condition"] == "service_healthy"


def test_compose_judge_is_optional_and_consistent() -> None:
    services = compose()["services"]
    judge = services["judge"]
    assert judge["profiles"] == ["judge"]
    assert compose_default(judge["image"]).split(":")[0] == "vllm/vllm-openai"
    args = [compose_default(str(a)) for a in judge["command"]]
    model = args[args.index("--model") + 1]
    port = args[args.index("--port") + 1]
    # With no variables set, the drcredit services ask the judge for the very
    # model it serves, at the address it listens on.
    assert model == compose_default(SHARED_ENV["DRCREDIT_JUDGE_MODEL"]) == "Qwen/Qwen3-8B"
    base = urlsplit(compose_default(SHARED_ENV["DRCREDIT_JUDGE_BASE_URL"]))
    assert base.hostname == "judge" and str(base.port) == port and base.path == "/v1"


def test_compose_prometheus() -> None:
    svc = compose()["services"]["prometheus"]
    assert svc["image"].split(":")[0] == "prom/prometheus"
    mounts = [v.split(":") for v in svc["volumes"]]
    assert any(src == "./deploy/prometheus.yml" and dst == "/etc/prometheus/prometheus.yml" for src, dst, *_ in mounts)
    # Every rule file the configuration loads is mounted where it looks for it, from deploy/.
    mounted = {dst: src for src, dst, *_ in mounts}
    for rule_file in prometheus_config().get("rule_files", []):
        assert rule_file in mounted, f"{rule_file} is not mounted into the prometheus service"
        assert (REPO / mounted[rule_file]).is_file()
    assert "/etc/prometheus/alerts.yml" in prometheus_config()["rule_files"]


def test_compose_grafana() -> None:
    svc = compose()["services"]["grafana"]
    assert svc["image"].split(":")[0] == "grafana/grafana"
    assert "prometheus" in svc["depends_on"]
    for volume in svc["volumes"]:
        src = volume.split(":")[0]
        assert not src.startswith("./") or (REPO / src).exists(), f"{src} does not exist"


# ---------------------------------------------------------------------------
# deploy/prometheus.yml
# ---------------------------------------------------------------------------


def prometheus_targets() -> dict[str, set[str]]:
    """host:port scraped -> metrics paths, from static and DNS service discovery."""
    out: dict[str, set[str]] = {}
    for job in prometheus_config()["scrape_configs"]:
        path = job.get("metrics_path", "/metrics")
        for sc in job.get("static_configs", []):
            for target in sc["targets"]:
                out.setdefault(target, set()).add(path)
        for dns in job.get("dns_sd_configs", []):
            for name in dns["names"]:
                out.setdefault(f"{name}:{dns['port']}", set()).add(path)
    return out


def test_prometheus_config_validates() -> None:
    local_validator("prometheus-config.schema.json").validate(prometheus_config())


def test_prometheus_schema_rejects_typo() -> None:
    tampered = copy.deepcopy(prometheus_config())
    tampered["scrape_config"] = tampered.pop("scrape_configs")
    with pytest.raises(jsonschema.ValidationError):
        local_validator("prometheus-config.schema.json").validate(tampered)

    tampered = copy.deepcopy(prometheus_config())
    tampered["scrape_configs"][0]["metric_path"] = "/metrics"
    with pytest.raises(jsonschema.ValidationError):
        local_validator("prometheus-config.schema.json").validate(tampered)


def test_prometheus_scrapes_api_and_every_worker() -> None:
    targets = prometheus_targets()
    assert "/metrics" in targets[f"api:{API_PORT}"]
    for name in WORKER_SERVICES:
        assert "/metrics" in targets.get(f"{name}:{METRICS_PORT}", set()), f"{name} not scraped"
    services = compose()["services"]
    for target in targets:
        host = target.rsplit(":", 1)[0]
        assert host == "localhost" or host in services, f"{target}: no such compose service"


def test_prometheus_job_names_unique() -> None:
    names = [j["job_name"] for j in prometheus_config()["scrape_configs"]]
    assert len(names) == len(set(names))


# ---------------------------------------------------------------------------
# deploy/Dockerfile
# ---------------------------------------------------------------------------


DOCKERFILE_INSTRUCTIONS = frozenset(
    {"FROM", "RUN", "CMD", "LABEL", "MAINTAINER", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME", "USER"}
    | {"WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}
)


def parse_dockerfile(text: str) -> tuple[dockerfile.Command, ...]:
    # BuildKit's own parser (Go, via the `dockerfile` package). It is lenient
    # (unknown instructions and malformed JSON arrays still parse), hence the
    # explicit checks in dockerfile_problems().
    commands: tuple[dockerfile.Command, ...] = dockerfile.parse_string(text)
    return commands


@cache
def dockerfile_commands() -> tuple[dockerfile.Command, ...]:
    return parse_dockerfile(DOCKERFILE.read_text())


def final_stage(cmds: tuple[dockerfile.Command, ...]) -> list[dockerfile.Command]:
    last_from = max(i for i, c in enumerate(cmds) if c.cmd == "FROM")
    return list(cmds[last_from:])


def dockerfile_problems(cmds: tuple[dockerfile.Command, ...]) -> list[str]:
    """Everything wrong with a parsed Dockerfile w.r.t. the image contract."""
    problems = []
    unknown = [c.cmd for c in cmds if c.cmd not in DOCKERFILE_INSTRUCTIONS]
    if unknown:
        problems.append(f"unknown instructions {unknown}")
    if cmds[0].cmd not in {"FROM", "ARG"}:
        problems.append("must start with FROM (or ARG)")
    if not any(c.cmd == "FROM" for c in cmds):
        return [*problems, "no FROM"]

    stage = final_stage(cmds)
    users = [c.value[0] for c in stage if c.cmd == "USER"]
    uid = users[-1].split(":")[0] if users else "root"
    if uid != "10001":  # k8s securityContext.runAsUser expects 10001
        problems.append(f"final stage runs as {uid!r}, expected non-root 10001")

    entrypoint = [c for c in stage if c.cmd == "ENTRYPOINT"]
    if entrypoint:
        # Compose/k8s override the command with a full `drcredit ...` argv,
        # which only works without an ENTRYPOINT.
        problems.append("ENTRYPOINT set")
    cmd = [c for c in stage if c.cmd == "CMD"]
    if len(cmd) != 1:
        problems.append(f"{len(cmd)} CMD instructions in the final stage")
    elif not cmd[0].json:
        problems.append("CMD not in exec (JSON) form: drcredit would not get SIGTERM")
    elif list(cmd[0].value) != SERVE_COMMAND:
        problems.append(f"CMD is {list(cmd[0].value)}")
    return problems


def test_dockerfile_meets_the_image_contract() -> None:
    assert dockerfile_problems(dockerfile_commands()) == []


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (
            'CMD ["drcredit", "serve", "--host", "0.0.0.0", "--port", "8000"]',
            'CMD ["drcredit", "serve", "--host", "0.0.0.0", "--port", "8000"',
        ),  # broken JSON
        (
            'CMD ["drcredit", "serve", "--host", "0.0.0.0", "--port", "8000"]',
            "CMD drcredit serve --host 0.0.0.0 --port 8000",
        ),  # shell form
        ("USER 10001:10001", "USER root"),
        ("USER 10001:10001", "USRE 10001:10001"),
        ("EXPOSE 8000 9100", 'EXPOSE 8000 9100\nENTRYPOINT ["python"]'),
    ],
    ids=["broken-json-cmd", "shell-form-cmd", "root-user", "unknown-instruction", "entrypoint"],
)
def test_dockerfile_checks_reject_tampering(old: str, new: str) -> None:
    text = DOCKERFILE.read_text()
    assert old in text
    assert dockerfile_problems(parse_dockerfile(text.replace(old, new))) != []


def test_dockerfile_parser_rejects_syntax_errors() -> None:
    with pytest.raises(dockerfile.GoParseError):
        parse_dockerfile("# no instructions at all\n")
    with pytest.raises(dockerfile.GoParseError):
        parse_dockerfile("FROM python:3.11-slim\nRUN <<EOF\necho unterminated heredoc\n")


def test_dockerfile_base_image_is_python_311_slim() -> None:
    cmds = dockerfile_commands()
    args: dict[str, str] = {}
    for c in cmds:
        if c.cmd == "ARG" and "=" in c.value[0]:
            k, v = c.value[0].split("=", 1)
            args.setdefault(k, v)
    froms = [c for c in cmds if c.cmd == "FROM"]
    assert froms
    for c in froms:
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], c.value[0])
        assert image == "python:3.11-slim"


def test_dockerfile_installs_the_repo() -> None:
    cmds = dockerfile_commands()
    copied = {src for c in cmds if c.cmd == "COPY" and not c.flags for src in c.value[:-1]}
    assert {"pyproject.toml", "shared/", "services/"} <= copied
    assert any("alembic.ini" in src for src in copied), "alembic.ini copied when present"
    assert any(c.cmd == "RUN" and re.search(r"\bpip install \.(\s|$)", c.value[0]) for c in cmds)


def test_dockerfile_exposes_api_and_metrics_ports() -> None:
    exposed = {p for c in final_stage(dockerfile_commands()) if c.cmd == "EXPOSE" for p in c.value}
    assert {str(API_PORT), str(METRICS_PORT)} <= exposed
