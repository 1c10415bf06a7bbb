"""deploy/components/actions grants exactly what the write client sends, to its own account, and
mounts that account's token beside the pod's read-only one."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from bot.actions.catalog import ActionSpec, resource_path

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _docs() -> list[dict]:
    return [
        d
        for d in yaml.safe_load_all((DEPLOY / "components" / "actions" / "rbac-actions.yaml").read_text())
        if d
    ]


def test_the_actions_role_holds_exactly_the_verbs_of_the_catalog_and_nothing_else() -> None:
    role = next(d for d in _docs() if d["kind"] == "ClusterRole")
    granted = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    wanted = (
        {
            ("apps", kind, verb)
            for kind in ("deployments", "statefulsets", "daemonsets")
            for verb in ("get", "patch")
        }
        | {("apps", "replicasets", "get"), ("apps", "replicasets", "list")}
        | {
            ("apps", f"{kind}/scale", verb)
            for kind in ("deployments", "statefulsets")
            for verb in ("get", "patch")
        }
        | {("", "pods", "get"), ("", "pods", "delete"), ("", "nodes", "get"), ("", "nodes", "patch")}
    )
    assert granted == wanted
    assert not any("*" in str(rule) or "secrets" in str(rule) for rule in role["rules"])


def test_every_kubernetes_action_targets_a_resource_the_role_names() -> None:
    role = next(d for d in _docs() if d["kind"] == "ClusterRole")
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    specs = [
        ActionSpec("rollout_restart", {"kind": "daemonset", "namespace": "a", "name": "b"}),
        ActionSpec("scale", {"kind": "statefulset", "namespace": "a", "name": "b", "replicas": 1}),
        ActionSpec("delete_pod", {"kind": "pod", "namespace": "a", "name": "b"}),
        ActionSpec("cordon", {"kind": "node", "name": "b"}),
    ]
    for spec in specs:
        plural = resource_path(spec).split("/")[-2]
        assert plural in resources, spec


def test_the_write_account_is_not_the_pods_own_and_is_bound_alone() -> None:
    docs = {d["kind"]: d for d in _docs()}
    assert docs["ServiceAccount"]["metadata"]["name"] == "opsbot-actions"
    assert docs["ServiceAccount"]["automountServiceAccountToken"] is False
    assert docs["ClusterRoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "opsbot-actions", "namespace": "opsbot"}
    ]
    read_only = (DEPLOY / "base" / "rbac.yaml").read_text()
    assert "opsbot-actions" not in read_only and "patch" not in read_only


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl renders the kustomization")
def test_the_component_mounts_the_write_token_where_the_setting_points_and_keeps_the_pods_account(
    tmp_path: Path,
) -> None:
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    overlay = tmp_path / "deploy" / "overlays" / "actions-test"
    overlay.mkdir(parents=True)
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources: [../../base]\ncomponents: [../../components/actions]\n"
    )
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(overlay)], capture_output=True, text=True, timeout=60
    )
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod.get("serviceAccountName", "opsbot") == "opsbot"
    container = next(c for c in pod["containers"] if c["name"] == "opsbot")
    env = {e["name"]: e.get("value") for e in container["env"]}
    token = env["OPSBOT_ACTIONS__SERVICE_ACCOUNT_TOKEN"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "actions-token")
    assert token == mount["mountPath"] + "/token" and mount["readOnly"] is True
    volume = next(v for v in pod["volumes"] if v["name"] == "actions-token")
    assert volume["secret"]["secretName"] == "opsbot-actions-token"
