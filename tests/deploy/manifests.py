"""What the deployment files' tests share: where the files are, how they are loaded and
validated, and the contracts they must keep with the application code (the CLI, the
queue names, the ports, the shared environment).

The tests (``test_k8s_*.py``, ``test_compose.py``, ``test_prometheus_config.py``,
``test_dockerfile.py``) run without network or a cluster:

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

import importlib
import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

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
