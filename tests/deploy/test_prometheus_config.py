"""deploy/prometheus.yml: its schema, and what it scrapes. The shared loading, validators
and contracts are in
:mod:`tests.deploy.manifests`."""

from __future__ import annotations

import copy

import jsonschema
import pytest

from tests.deploy.manifests import (
    API_PORT,
    METRICS_PORT,
    WORKER_SERVICES,
    compose,
    local_validator,
    prometheus_config,
)

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
