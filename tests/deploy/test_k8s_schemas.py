"""Kubernetes manifests against their schemas, and the kustomizations that list them. The
shared loading, validators and contracts are in
:mod:`tests.deploy.manifests`."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.deploy.manifests import (
    K8S,
    REPO,
    by_name,
    k8s_documents,
    k8s_files,
    k8s_resources,
    load_yaml_docs,
    main_resources,
    of_kind,
    validate_k8s_document,
)

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
