"""Kubernetes provider against the fake API server, through the real kubernetes-asyncio client."""

from __future__ import annotations

from pathlib import Path

from bot.config import KubernetesSettings
from bot.context.base import ContextRequest, ProviderStatus
from bot.context.entities import extract
from bot.context.kubernetes import KubernetesProvider


def _request(question: str, scenario: str = "root_cause") -> ContextRequest:
    return ContextRequest(question=question, scenario=scenario, entities=extract(question))


def _by_title(result, prefix: str):
    matches = [s for s in result.sections if s.title.startswith(prefix)]
    assert matches, f"no section starting {prefix!r} in {[s.title for s in result.sections]}"
    return matches[0]


async def test_a_crash_looping_pod_yields_its_status_events_and_both_log_tails(k8s_settings, fake_k8s):
    provider = KubernetesProvider(k8s_settings)
    try:
        result = await provider.fetch(
            _request("why is api-7f9c8d6b5-x2x9q crash-looping in namespace payments?")
        )
    finally:
        await provider.close()
    assert result.status is ProviderStatus.OK, result.error
    assert result.target == fake_k8s.url
    pods = _by_title(result, "Pods in question")
    first = pods.body.splitlines()[0]
    assert first.startswith("payments/api-7f9c8d6b5-x2x9q")
    assert (
        "CrashLoopBackOff" in first and "restarts 7" in first and "last terminated Error exit code 1" in first
    )
    events = _by_title(result, "Warning events")
    assert "BackOff x31" in events.body and events.drop_from == "start"
    # The whole log is read and condensed: 200 alike request lines are one, the errors stay whole.
    previous = _by_title(result, "Log of payments/api-7f9c8d6b5-x2x9q/app (previous")
    lines = previous.body.splitlines()
    assert lines[-1].endswith("exiting (exit code 1)") and "connection refused" in lines[-2]
    assert len(lines) == 3 and "[x200 similar, last 2026-11-29T19:59:09Z]" in lines[0]
    assert previous.ranks is not None and previous.ranks[-2] == 0
    current = _by_title(result, "Log of payments/api-7f9c8d6b5-x2x9q/app (current")
    assert "starting api 2.4.1" in current.body
    tail = f"tailLines={k8s_settings.log_tail_lines}"
    assert any("previous=true" in r.lower() and tail in r for r in fake_k8s.requests)
    details = _by_title(result, "Pod details")
    assert "DB_PASSWORD=<from secret api-db key password>" in details.body


async def test_every_failure_state_is_reported_with_its_reason(k8s_settings):
    provider = KubernetesProvider(k8s_settings)
    try:
        result = await provider.fetch(_request("what is broken?"))
    finally:
        await provider.close()
    body = _by_title(result, "Pods that are not healthy").body
    lines = {line.split(" | ")[0]: line for line in body.splitlines()}
    assert "OOMKilled exit code 137" in lines["payments/worker-6d5f7c9b8-kq2lp"]
    assert "Unschedulable: 0/3 nodes are available" in lines["payments/reports-5c4b8d7f9-zz8mn"]
    assert "ImagePullBackOff" in lines["web/frontend-84c6d9f7b-m4t8r"]
    assert "not Ready" in lines["web/cache-0"]
    assert "kube-system/coredns-5d78c9869d-7xk2p" not in lines
    nodes = _by_title(result, "Nodes: 3 total, 2 Ready")
    assert "worker-2 | MemoryPressure" in nodes.body and "worker-3 | NotReady" in nodes.body
    assert "cordoned" in nodes.body


async def test_a_plain_question_gets_a_cluster_overview(k8s_settings):
    provider = KubernetesProvider(k8s_settings)
    try:
        result = await provider.fetch(_request("how is the cluster doing?", "chat"))
    finally:
        await provider.close()
    overview = _by_title(result, "Cluster overview (all namespaces): 7 pods, 5 not healthy")
    assert overview.body.splitlines()[0].startswith("payments: 3 pods")
    workloads = _by_title(result, "Workloads: rollout")
    assert "deployment payments/api" in workloads.body and "statefulset web/cache" in workloads.body
    assert "deployment payments/worker" not in workloads.body  # healthy ones are not listed


async def test_change_review_lists_rollout_status_and_recent_revisions_first(k8s_settings):
    provider = KubernetesProvider(k8s_settings)
    try:
        result = await provider.fetch(_request("what changed in deployment api?", "change_review"))
    finally:
        await provider.close()
    workloads = min(result.sections, key=lambda s: s.priority)
    assert workloads.title.startswith("Workloads: rollout")
    lines = workloads.body.splitlines()
    assert "ProgressDeadlineExceeded" in lines[0] and "rollout NOT complete" in lines[0]
    assert "revision 7" in lines[1] and "change-cause: deploy api 2.4.1" in lines[1]
    assert "revision 6" in lines[2] and "api:2.4.0" in lines[2]


async def test_configured_namespaces_and_label_selector_scope_the_api_calls(kubeconfig, fake_k8s):
    settings = KubernetesSettings(
        enabled=True, kubeconfig=kubeconfig, namespaces=["web"], label_selector="tier in (frontend,cache)"
    )
    provider = KubernetesProvider(settings)
    try:
        result = await provider.fetch(_request("anything wrong in namespace payments?"))
    finally:
        await provider.close()
    pod_calls = [r for r in fake_k8s.requests if "/pods?" in r or r.endswith("/pods")]
    assert pod_calls and all("/namespaces/web/pods" in r for r in pod_calls)
    assert all("labelSelector=tier" in r for r in pod_calls)
    assert "payments outside opsbot's configured scope" in (result.error or "")


async def test_a_forbidden_node_list_leaves_a_partial_note_not_a_failure(k8s_settings, fake_k8s):
    fake_k8s.fail(
        r"^/api/v1/nodes$", 403, 'nodes is forbidden: User "system:serviceaccount:ops:opsbot" cannot list'
    )
    provider = KubernetesProvider(k8s_settings)
    try:
        result = await provider.fetch(_request("what is broken?"))
    finally:
        await provider.close()
    assert result.status is ProviderStatus.OK
    assert "nodes: HTTP 403 Forbidden" in (result.error or "")
    assert not any(s.title.startswith("Nodes") for s in result.sections)


async def test_an_api_server_at_a_dead_address_is_a_failed_result(tmp_path: Path, fake_k8s):
    url = fake_k8s.url
    await fake_k8s.stop()  # nothing listens there any more
    fake_k8s.url = url
    settings = KubernetesSettings(
        enabled=True, kubeconfig=fake_k8s.write_kubeconfig(tmp_path / "dead"), timeout_s=2.0
    )
    provider = KubernetesProvider(settings)
    try:
        result = await provider.fetch(_request("what is broken?"))
    finally:
        await provider.close()
    assert result.status is ProviderStatus.FAILED
    assert result.target == url
    assert "list pods" in result.query and result.error


async def test_a_wrong_token_is_reported_with_the_servers_answer(tmp_path: Path, fake_k8s):
    settings = KubernetesSettings(
        enabled=True, kubeconfig=fake_k8s.write_kubeconfig(tmp_path / "bad", token="wrong-token")
    )
    provider = KubernetesProvider(settings)
    try:
        result = await provider.fetch(_request("what is broken?"))
    finally:
        await provider.close()
    assert result.status is ProviderStatus.FAILED
    assert "HTTP 401" in (result.error or "")


async def test_the_configured_kubeconfig_context_is_used_rather_than_the_current_one(
    tmp_path: Path, fake_k8s
):
    import json

    config = json.loads(fake_k8s.write_kubeconfig(tmp_path / "one").read_text())
    config["clusters"].append({"name": "elsewhere", "cluster": {"server": "http://127.0.0.1:9"}})
    config["contexts"].append({"name": "prod", "context": {"cluster": "elsewhere", "user": "opsbot"}})
    config["current-context"] = "prod"  # kubectl's current context points at nothing
    path = tmp_path / "two"
    path.write_text(json.dumps(config))
    provider = KubernetesProvider(KubernetesSettings(enabled=True, kubeconfig=path, context="fake-cluster"))
    try:
        result = await provider.fetch(_request("what is broken?"))
    finally:
        await provider.close()
    assert result.status is ProviderStatus.OK and result.target == fake_k8s.url


async def test_a_list_cut_by_the_page_limit_is_noted(kubeconfig, fake_k8s):
    settings = KubernetesSettings(enabled=True, kubeconfig=kubeconfig, list_limit=2)
    provider = KubernetesProvider(settings)
    try:
        result = await provider.fetch(_request("how is the cluster?"))
    finally:
        await provider.close()
    assert result.status is ProviderStatus.OK
    assert "pods: only the first 2 per namespace were read" in (result.error or "")
    assert any("limit=2" in r for r in fake_k8s.requests)
