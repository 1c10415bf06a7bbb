"""The Kubernetes provider follows the cluster's own links from what a question names to what broke:
each test serves one of the eval's incident cases from the fake API and reads it with the real client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.config import KubernetesSettings
from bot.context.base import ContextRequest, ContextSection, ProviderResult
from bot.context.entities import extract
from bot.context.kubernetes import KubernetesProvider
from bot.eval.cases import BUILTIN_CASES, load_cases
from bot.eval.kube_api import KubernetesSnapshotServer

CASES = {c.id: c for c in load_cases([BUILTIN_CASES])}


@pytest.fixture
async def ask(tmp_path: Path) -> AsyncIterator:
    servers: list[KubernetesSnapshotServer] = []
    providers: list[KubernetesProvider] = []

    async def run(
        case_id: str, question: str | None = None
    ) -> tuple[ProviderResult, KubernetesSnapshotServer]:
        case = CASES[case_id]
        server = case.kubernetes_server()
        assert server is not None
        await server.start()
        servers.append(server)
        config = server.write_kubeconfig(tmp_path / f"{case_id}.kubeconfig")
        provider = KubernetesProvider(KubernetesSettings(enabled=True, kubeconfig=config, timeout_s=10))
        providers.append(provider)
        text = question or case.question or ""
        result = await provider.fetch(ContextRequest(text, "root_cause", extract(text, case.alert)))
        assert result.status.value == "ok", result.error
        return result, server

    yield run
    for provider in providers:
        await provider.close()
    for server in servers:
        await server.stop()


def _section(result: ProviderResult, prefix: str) -> ContextSection:
    found = [s for s in result.sections if s.title.startswith(prefix)]
    assert found, f"no section {prefix!r} in {[s.title for s in result.sections]}"
    return found[0]


def _decisive(section: ContextSection) -> list[str]:
    return [line for line, rank in zip(section.lines(), section.line_ranks(), strict=True) if rank == 0]


async def test_a_database_in_another_namespace_found_through_the_env_is_shown_broken_with_its_log(ask):
    result, _ = await ask("hop-db-disk-full")
    deps = _section(result, "Dependencies")
    first = _decisive(deps)[0]
    assert first.startswith("service data/orders-db (env DATABASE_URL of checkout-")
    assert "endpoints 0/1 ready, 1 of 1 pods not healthy" in first
    assert any("data/orders-db-0 | Running" in line and "restarts 12" in line for line in _decisive(deps))
    log = _section(result, "Log of data/orders-db-0/postgres (previous container")
    assert "service data/orders-db" in log.title
    assert any("No space left on device" in line for line in _decisive(log))
    assert result.findings is not None
    assert {(w.namespace, w.name, w.role) for w in result.findings.workloads} >= {
        ("shop", "checkout", "asked"),
        ("data", "orders-db", "dependency"),
    }


async def test_no_such_host_in_a_log_leads_to_coredns_and_its_forbidden_error(ask):
    result, _ = await ask("hop-coredns-no-such-host")
    deps = _section(result, "Dependencies")
    assert any(line.startswith("cluster DNS (DNS failure in the log of billing-") for line in _decisive(deps))
    coredns = _section(result, "Log of kube-system/coredns-6f9c7d8b4-")
    assert "same in 2 of 2 replicas" in coredns.title
    assert any("endpointslices.discovery.k8s.io is forbidden" in line for line in _decisive(coredns))


async def test_a_rollout_that_cut_the_memory_limit_shows_for_a_question_about_one_pod(ask):
    result, _ = await ask("hop-rollout-memory-limit")
    workloads = _decisive(_section(result, "Workloads"))
    assert any("change-cause: tune resources: memory limit 2Gi -> 512Mi" in line for line in workloads)
    diff = next(line for line in workloads if "changes from revision 13 to 14" in line)
    assert "app memory limit: 2Gi -> 512Mi" in diff and "app memory request: 1Gi -> 512Mi" in diff


async def test_the_pod_template_diff_names_a_changed_env_value_when_there_is_no_change_cause(ask):
    result, _ = await ask("hop-rollout-env-diff")
    diff = next(
        line for line in _section(result, "Workloads").lines() if "changes from revision 4 to 5" in line
    )
    assert (
        "worker env QUEUE_URL: amqp://rabbitmq.messaging.svc:5672 -> amqp://rabbitmq.messaging.svc:5673"
        in diff
    )


async def test_a_pending_pod_leads_to_its_claim_the_storage_class_and_the_provisioning_event(ask):
    result, server = await ask("hop-pvc-provisioning-failed")
    volumes = _decisive(_section(result, "Volumes"))
    assert volumes[0].startswith("pvc search/data-es-data-2 Pending | storageClass gp3-encrypted")
    assert any("kmsKeyId=alias/search-data-2025" in line for line in volumes)
    events = _decisive(_section(result, "Warning events"))
    assert any("persistentvolumeclaim/data-es-data-2 ProvisioningFailed" in line for line in events)
    assert any(
        r.startswith("GET /apis/storage.k8s.io/v1/storageclasses/gp3-encrypted") for r in server.requests
    )


async def test_the_neighbour_without_a_cpu_limit_is_listed_beside_the_pods_in_question(ask):
    result, _ = await ask("hop-noisy-neighbour-cpu")
    nodes = _section(result, "Nodes:")
    lines = nodes.lines()
    at = lines.index(next(line for line in lines if line.startswith("node worker-4")))
    assert "batch/reindex-7f8e9d0c1-zz9xk" in lines[at + 1] and "limits cpu none" in lines[at + 1]
    assert result.findings is not None and "worker-4" in result.findings.nodes
    assert ("worker-4", "batch", "reindex-7f8e9d0c1-zz9xk") in result.findings.node_pods


async def test_logs_are_read_by_signature_even_without_restarts_and_identical_replicas_are_shown_once(ask):
    result, _ = await ask("logs-expired-client-cert")
    log = _section(result, "Log of payments/refunds-6b7c8d9e0-")
    assert "current container, 380 lines read; same in 2 of 2 replicas" in log.title
    decisive = _decisive(log)
    assert len(decisive) == 1 and "is after 2026-11-29T12:00:00Z [x20 similar" in decisive[0]


async def test_the_root_caused_by_above_a_long_stack_is_decisive_and_the_frames_are_filler(ask):
    result, _ = await ask("logs-java-caused-by")
    log = _section(result, "Log of shop/inventory-7e8f9a0b1-")
    assert "same in 3 of 3 replicas" in log.title
    assert any('database "inventory_v2" does not exist' in line for line in _decisive(log))
    frames = [r for line, r in zip(log.lines(), log.line_ranks(), strict=True) if line.startswith("\tat ")]
    assert frames and max(frames) == 3


@pytest.mark.parametrize(
    ("case_id", "first_pod"),
    [
        ("vague-typo-name", "payments/payments-api-64d5c8b7f9-"),  # "paymnets-api"
        (
            "vague-one-word-namespace",
            "payments/payments-processor-7d6c5b4a3-p0o9i",
        ),  # a namespace from the API
        ("vague-bare-ordinal", "messaging/kafka-2 "),
        ("vague-app-label", "storefront/shop-cart-service-7c8d9e0f1a-k7l8z"),  # app.kubernetes.io/name=cart
        ("vague-misspelt-short", "storefront/checkout-4d5e6f7a8-"),  # "chekout"
        ("vague-bare-node-name", "web/web-5d6e7f8a9-b1n2m"),  # on ip-10-0-7-21.eu-west-1...
    ],
)
async def test_with_no_exact_name_the_closest_then_most_broken_pod_leads_never_api_order(
    ask, case_id, first_pod
):
    result, _ = await ask(case_id)
    pods = _section(result, "Pods in question first")
    assert pods.lines()[0].startswith(first_pod), pods.lines()[:3]


async def test_what_a_question_was_matched_to_is_said(ask):
    result, _ = await ask("vague-typo-name")
    assert (
        "'paymnets-api' -> deployment payments/payments-api (closest name)" in _section(result, "Names").body
    )


async def test_a_job_named_in_an_init_containers_log_is_followed_to_its_failed_pod(ask):
    result, _ = await ask("hop-init-waits-for-migration")
    assert any(
        line.startswith("job shop/orders-migrate-42 (pod orders-migrate-42-x7z8q) (the log of orders-api-")
        for line in _decisive(_section(result, "Dependencies"))
    )
    log = _section(result, "Log of shop/orders-migrate-42-x7z8q/migrate")
    assert "Key (ref)=(A-1009) is duplicated." in log.body


async def test_secrets_are_never_read_and_a_configmap_only_by_name_when_the_pod_references_it(ask):
    result, server = await ask("hop-configmap-key-typo")
    refs = _section(result, "ConfigMaps the pods reference")
    # The mounted ConfigMap's keys show the typo: the app opens rules.yaml, the ConfigMap has rule.yaml.
    assert "configmap shop/pricing-rules: keys currency.yaml, rule.yaml" in refs.body
    result2, server2 = await ask("hop-db-disk-full")
    assert (
        "secret shop/checkout-db: keys password (values are never read)"
        in _section(result2, "ConfigMap").body
    )
    assert [r for r in server.requests if "/configmaps" in r] == [
        "GET /api/v1/namespaces/shop/configmaps/pricing-rules"
    ]
    for srv in (server, server2):
        assert not any("/secrets" in r for r in srv.requests)
        assert all(r.startswith("GET ") for r in srv.requests)
    assert not any("SECRET-VALUE" in s.body for s in [*result.sections, *result2.sections])


async def test_the_api_calls_of_one_question_are_bounded_and_counted(ask):
    result, server = await ask("hop-probe-kafka-broker")
    calls = int(result.query.split(" API calls", 1)[0])
    assert calls == len(server.requests) and calls <= 30
