"""Several clusters and per-channel scope: two fake Kubernetes API servers (one per cluster) read
through the real kubernetes-asyncio client; channel scopes decide which cluster and namespaces an
answer reads, and the footer line says which."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fakes.kubernetes_server import FakeKubernetes, container_status, pod

from bot.config import ConfigError, Settings, load_settings
from bot.context.entities import extract
from bot.context.gatherer import ContextGatherer
from bot.context.scope import ChannelRef


def _shop_cluster() -> FakeKubernetes:
    """A second cluster: one crash-looping checkout pod in namespace shop."""
    fake = FakeKubernetes(namespaces=["shop"])
    fake.pods = [
        pod(
            "checkout-6c8d7b9f5-p4k2m",
            "shop",
            owner=("ReplicaSet", "checkout-6c8d7b9f5"),
            statuses=[
                container_status(
                    ready=False, restart_count=12, state={"waiting": {"reason": "CrashLoopBackOff"}}
                )
            ],
        )
    ]
    return fake


@pytest.fixture
async def us_k8s() -> AsyncIterator[FakeKubernetes]:
    fake = _shop_cluster()
    await fake.start()
    yield fake
    await fake.stop()


def _text(bundle: Any) -> str:
    return "\n".join(f"{s.source} {s.title}\n{s.body}" for s in bundle.sections)


def _two_clusters(kubeconfig: Path, us_kubeconfig: Path, **more: Any) -> Settings:
    return Settings(
        kubernetes={"enabled": True, "kubeconfig": kubeconfig, "timeout_s": 3.0},
        context={"default_cluster": "eu-west", "default_cluster_aliases": ["europe"], "timeout_s": 4.0},
        clusters={
            "us-east": {
                "aliases": ["america"],
                "kubernetes": {"enabled": True, "kubeconfig": us_kubeconfig, "timeout_s": 3.0},
            }
        },
        **more,
    )


@pytest.fixture
def us_kubeconfig(us_k8s: FakeKubernetes, tmp_path: Path) -> Path:
    return us_k8s.write_kubeconfig(tmp_path / "us-kubeconfig", context="us-east-1")


async def test_a_question_naming_a_cluster_reads_that_cluster_only(
    kubeconfig, us_kubeconfig, fake_k8s, us_k8s
):
    gatherer = ContextGatherer.from_settings(_two_clusters(kubeconfig, us_kubeconfig))
    try:
        bundle = await gatherer.gather("in us-east what is crash-looping?", scenario="root_cause")
    finally:
        await gatherer.close()
    assert "shop/checkout-6c8d7b9f5-p4k2m" in _text(bundle)
    assert "payments/" not in _text(bundle)
    assert fake_k8s.requests == [] and us_k8s.requests
    assert bundle.scope_text() == "cluster us-east, all namespaces"


async def test_without_a_named_cluster_the_default_cluster_answers_and_an_alias_picks_one(
    kubeconfig, us_kubeconfig, fake_k8s, us_k8s
):
    gatherer = ContextGatherer.from_settings(_two_clusters(kubeconfig, us_kubeconfig))
    try:
        default = await gatherer.gather("what is broken?", scenario="chat")
        assert us_k8s.requests == [] and "payments/api-7f9c8d6b5-x2x9q" in _text(default)
        assert default.scope_text() == "cluster eu-west, all namespaces"
        by_alias = await gatherer.gather("on the america cluster, what is broken?", scenario="chat")
        assert "checkout" in _text(by_alias) and by_alias.scope_text().startswith("cluster us-east")
    finally:
        await gatherer.close()


async def test_two_named_clusters_are_both_read_and_each_block_says_which(
    kubeconfig, us_kubeconfig, fake_k8s, us_k8s
):
    gatherer = ContextGatherer.from_settings(_two_clusters(kubeconfig, us_kubeconfig))
    try:
        bundle = await gatherer.gather("compare eu-west and us-east: what is failing?", scenario="root_cause")
    finally:
        await gatherer.close()
    sources = {s.source for s in bundle.sections}
    assert {"Kubernetes (eu-west)", "Kubernetes (us-east)"} <= sources
    assert {n.name for n in bundle.notes} == {"Kubernetes (eu-west)", "Kubernetes (us-east)"}
    assert bundle.scope_text() == "cluster eu-west, all namespaces; cluster us-east, all namespaces"


async def test_each_cluster_has_its_own_timeout(kubeconfig, us_kubeconfig, fake_k8s, us_k8s, tmp_path):
    us_k8s.delay(r"/pods$", 5.0)
    settings = _two_clusters(kubeconfig, us_kubeconfig)
    settings.clusters["us-east"].kubernetes.timeout_s = 0.3
    gatherer = ContextGatherer.from_settings(settings)
    try:
        slow = await gatherer.gather("eu-west and us-east: what is failing?", scenario="root_cause")
    finally:
        await gatherer.close()
    notes = {n.name: n for n in slow.notes}
    assert notes["Kubernetes (us-east)"].status == "timeout"
    assert notes["Kubernetes (us-east)"].detail == f"Kubernetes timed out after 0.3 s at {us_k8s.url}"
    assert notes["Kubernetes (eu-west)"].status == "ok"


async def test_each_cluster_has_its_own_cache(kubeconfig, us_kubeconfig, fake_k8s, us_k8s):
    settings = _two_clusters(kubeconfig, us_kubeconfig)
    settings.clusters["us-east"].cache_ttl_s = 0  # this cluster is asked every time
    gatherer = ContextGatherer.from_settings(settings)
    question = "what is failing in eu-west and us-east?"
    try:
        for _ in range(3):
            await gatherer.gather(question, scenario="root_cause")
    finally:
        await gatherer.close()

    def pod_lists(fake: FakeKubernetes) -> int:
        return sum(1 for r in fake.requests if r.startswith("GET /api/v1/pods"))

    assert pod_lists(fake_k8s) == 1
    assert pod_lists(us_k8s) == 3


# -- per-channel scope -------------------------------------------------------------------------


def _scoped(kubeconfig: Path, unmapped: str = "default") -> Settings:
    return Settings(
        kubernetes={"enabled": True, "kubeconfig": kubeconfig, "namespaces": ["payments", "web"]},
        scope={
            "unmapped": unmapped,
            "channels": [
                {"match": ["CPAYMENTS", "#inc-payments-*"], "namespaces": ["payments"]},
                {"match": ["CWEB"], "platform": "slack", "namespaces": ["web"]},
            ],
        },
    )


async def test_one_channel_never_sees_another_channels_namespaces(kubeconfig, fake_k8s):
    gatherer = ContextGatherer.from_settings(_scoped(kubeconfig))
    web = ChannelRef("slack", "CWEB")
    payments = ChannelRef("slack", "CPAYMENTS")
    question = "what is broken in namespace web and namespace payments?"
    try:
        # The web channel asks first, so its answer sits in the cache when payments asks the same.
        web_bundle = await gatherer.gather(question, scenario="root_cause", channel=web)
        fake_k8s.requests.clear()
        pay_bundle = await gatherer.gather(question, scenario="root_cause", channel=payments)
    finally:
        await gatherer.close()
    assert "web/frontend-84c6d9f7b-m4t8r" in _text(web_bundle) and "payments/" not in _text(web_bundle)
    text = _text(pay_bundle)
    assert "payments/api-7f9c8d6b5-x2x9q" in text
    assert "web/" not in text and "frontend" not in text and "cache-0" not in text
    assert fake_k8s.requests and not any("/namespaces/web/" in r for r in fake_k8s.requests)
    assert all("/api/v1/pods" not in r.split("?")[0] for r in fake_k8s.requests)  # no all-namespace lists
    assert "namespace(s) web outside opsbot's configured scope" in pay_bundle.notes[0].detail
    assert pay_bundle.scope_text() == "cluster default, namespaces payments"
    assert web_bundle.scope_text() == "cluster default, namespaces web"


async def test_a_channel_name_pattern_picks_the_scope_and_the_platform_field_is_honoured(
    kubeconfig, fake_k8s
):
    gatherer = ContextGatherer.from_settings(_scoped(kubeconfig))
    try:
        by_name = await gatherer.gather(
            "what is broken?", scenario="chat", channel=ChannelRef("mattermost", "x1y2", "inc-payments-db")
        )
        # CWEB's scope is for Slack only: the same id on Mattermost is an unmapped channel.
        other_platform = await gatherer.gather(
            "what is broken?", scenario="chat", channel=ChannelRef("mattermost", "CWEB")
        )
    finally:
        await gatherer.close()
    assert by_name.scope_text() == "cluster default, namespaces payments"
    assert other_platform.scope_text() == "cluster default, namespaces payments, web"


async def test_an_unmapped_channel_gets_no_cluster_context_when_so_configured(kubeconfig, fake_k8s):
    gatherer = ContextGatherer.from_settings(_scoped(kubeconfig, unmapped="none"))
    try:
        bundle = await gatherer.gather(
            "what is broken in payments?", scenario="chat", channel=ChannelRef("slack", "CRANDOM")
        )
    finally:
        await gatherer.close()
    assert bundle.sections == [] and bundle.notes == []
    assert fake_k8s.requests == []
    assert bundle.scope_text() == "no cluster (this channel has no cluster scope)"


async def test_a_cluster_outside_the_channels_scope_is_noted_and_not_read(
    kubeconfig, us_kubeconfig, fake_k8s, us_k8s
):
    settings = _two_clusters(
        kubeconfig, us_kubeconfig, scope={"channels": [{"match": ["CEU"], "clusters": ["eu-west"]}]}
    )
    gatherer = ContextGatherer.from_settings(settings)
    try:
        bundle = await gatherer.gather(
            "in us-east what is crash-looping?", scenario="root_cause", channel=ChannelRef("slack", "CEU")
        )
    finally:
        await gatherer.close()
    assert us_k8s.requests == [] and "checkout" not in _text(bundle)
    assert bundle.scope_text() == (
        "cluster eu-west, all namespaces "
        "(cluster us-east is outside this channel's scope (scope.channels[0]))"
    )


def test_a_scope_naming_an_unknown_cluster_or_foreign_namespaces_is_a_one_line_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"scope.channels\[0\]: unknown cluster 'mars' \(known: default\)"):
        load_settings(scope={"channels": [{"match": ["C1"], "clusters": ["mars"]}]})
    with pytest.raises(
        ConfigError, match="none of namespaces shop is in cluster default's kubernetes.namespaces"
    ):
        load_settings(
            kubernetes={"namespaces": ["payments"]},
            scope={"channels": [{"match": ["C1"], "namespaces": ["shop"]}]},
        )
    with pytest.raises(ConfigError, match="also a \\[clusters.default\\] entry"):
        load_settings(kubernetes={"enabled": True}, clusters={"default": {}})


# -- entity extraction -------------------------------------------------------------------------

WORDS = {"eu-west": "eu-west", "europe": "eu-west", "prod": "prod", "default": "default"}


@pytest.mark.parametrize(
    ("question", "clusters"),
    [
        ("in eu-west api-gateway is failing", ["eu-west"]),
        ("eu-west: why is checkout slow?", ["eu-west"]),
        ("is the europe cluster healthy?", ["eu-west"]),
        ("what broke on prod tonight?", ["prod"]),
        ("cluster=prod pods pending", ["prod"]),
        ("pods in default namespace are pending", []),
        ("the default timeout is too short", []),
        ("a product launch", []),
    ],
)
def test_entity_extraction_picks_a_configured_cluster_named_in_the_question(question, clusters):
    found = extract(question, known_clusters=WORDS)
    assert found.clusters == clusters
    assert "eu-west" not in found.names  # a cluster name is not taken for a workload


def test_an_alerts_cluster_label_names_its_cluster():
    payload = {"commonLabels": {"alertname": "X", "cluster": "us-east"}, "alerts": []}
    assert extract("alert", payload).clusters == ["us-east"]
