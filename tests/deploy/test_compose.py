"""docker-compose.yml: its schema, and the contracts it keeps with the code and the
Kubernetes manifests. The shared loading, validators and contracts are in
:mod:`tests.deploy.manifests`."""

from __future__ import annotations

import copy
from urllib.parse import urlsplit

import jsonschema
import pytest

from tests.deploy.manifests import (
    API_PORT,
    METRICS_PORT,
    MIGRATE_COMMAND,
    REPO,
    SERVE_COMMAND,
    SHARED_ENV,
    WORKER_GRACE_SECONDS,
    WORKER_SERVICES,
    compose,
    compose_default,
    compose_validator,
    duration_seconds,
    prometheus_config,
    worker_command,
)

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
