"""deploy/base: read-only RBAC that covers every read the Kubernetes provider makes and never touches
Secrets; the Deployment's health probes and settings. The rendered overlays (GPU, platforms,
database) are tests/deploy/test_kustomize.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.config import Settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "base"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


@pytest.mark.parametrize("name", ["rbac.yaml", "rbac-namespaced.yaml"])
def test_rbac_is_read_only_includes_pod_logs_and_never_secrets(name):
    rules = [rule for doc in _docs(name) if doc["kind"] in ("ClusterRole", "Role") for rule in doc["rules"]]
    assert rules
    for rule in rules:
        assert set(rule["verbs"]) <= {"get", "list", "watch"}
        assert "secrets" not in rule["resources"] and "*" not in rule["resources"]
        assert "configmaps" not in rule["resources"]
    resources = {r for rule in rules for r in rule["resources"]}
    assert "pods/log" in resources


def test_cluster_role_covers_every_call_the_kubernetes_provider_makes():
    from bot.context.kube_read import RESOURCES

    (role,) = [d for d in _docs("rbac.yaml") if d["kind"] == "ClusterRole"]
    granted = {(g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    # Every resource the provider's reader knows (it reads no other), by API group, and pod logs.
    needed = {("", "pods/log")}
    for resource, (prefix, _) in RESOURCES.items():
        group = "" if prefix == "/api/v1" else prefix.removeprefix("/apis/").split("/")[0]
        needed.add((group, resource))
    assert needed <= granted
    assert "secrets" not in RESOURCES and "configmaps" not in RESOURCES


def test_the_deployment_probes_healthz_and_readyz():
    (deployment,) = _docs("deployment.yaml")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "opsbot"
    # Every OPSBOT_ variable names a real setting.
    names = {e["name"] for e in container["env"]}
    sections = set(Settings.model_fields)
    for name in names:
        section, _, field = name.removeprefix("OPSBOT_").lower().partition("__")
        assert section in sections, name
        assert field in type(getattr(Settings(), section)).model_fields, name


def test_the_service_exposes_the_http_port_and_kustomize_lists_every_file():
    (service,) = _docs("service.yaml")
    assert service["spec"]["ports"][0]["port"] == 8080
    (kustomization,) = _docs("kustomization.yaml")
    for resource in kustomization["resources"]:
        assert (DEPLOY / resource).is_file()
