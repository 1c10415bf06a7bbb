"""``prom_rules`` against a real Prometheus: the rule behind an alert (expression, ``for``, state,
health and its evaluation error), its instances in the channel's scope only, and by default only
the rules that need a look (firing, pending or failing)."""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "context"))
from prom_fixtures import ALERT_NAME, PromStack, start_stack, wait_until  # noqa: E402

from bot.config import PrometheusSettings  # noqa: E402
from bot.context.prometheus import PrometheusProvider  # noqa: E402
from bot.tools.base import ClusterTools, ToolScope  # noqa: E402
from bot.tools.prometheus import PromRules  # noqa: E402

RULES = [
    {
        "alert": "MemoryHigh",
        "expr": "container_memory_working_set_bytes > 1",
        "for": "0s",
        "labels": {"severity": "warning"},
        "annotations": {"summary": "{{ $labels.pod }} uses {{ $value }} bytes"},
    },
    {"alert": "QuietAlert", "expr": "opsbot_test_trigger > 100", "for": "5m"},
    {
        # Two series renamed alike: Prometheus fails the evaluation ("same labelset").
        "alert": "BrokenRule",
        "expr": 'label_replace({__name__=~"container_.*"}, "__name__", "same", "", "") > 0',
    },
]


def _rules(url: str) -> dict[str, dict[str, object]]:
    with urllib.request.urlopen(f"{url}/api/v1/rules?type=alert", timeout=2) as response:
        data = json.load(response)["data"]
    return {r["name"]: r for g in data["groups"] for r in g["rules"]}


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromStack]:
    stack = start_stack(tmp_path_factory.mktemp("prom-rules"), extra_rules=RULES)
    stack.exporter.trigger = 1
    try:
        wait_until(
            lambda: (
                _rules(stack.prometheus_url)["MemoryHigh"]["state"] == "firing"
                and _rules(stack.prometheus_url)["BrokenRule"]["health"] == "err"
            ),
            30,
            "MemoryHigh firing and BrokenRule failing",
        )
        yield stack
    finally:
        stack.stop()


@pytest.fixture
async def provider(prom: PromStack) -> AsyncIterator[PrometheusProvider]:
    opened = PrometheusProvider(PrometheusSettings(enabled=True, url=prom.prometheus_url))
    yield opened
    await opened.close()


def scope(provider: PrometheusProvider, *namespaces: str) -> ToolScope:
    return ToolScope(clusters=[ClusterTools("c", tuple(namespaces) or None, [provider])])


async def test_a_named_rule_shows_its_expression_threshold_and_instances_in_scope(
    provider: PrometheusProvider,
) -> None:
    out = await PromRules().run({"alertname": "MemoryHigh"}, scope(provider, "payments"))
    text = out.text
    assert text.startswith("rule MemoryHigh (group opsbot-test): firing, for 0 s, health ok")
    assert "  expr: container_memory_working_set_bytes > 1" in text
    assert "  severity: warning" in text
    assert "firing since" in text and "pod=api-7f9c8d6b5-x2x9q" in text and "namespace=payments" in text
    # the same rule read from a channel of another namespace: the instance is counted, not shown
    hidden = (await PromRules().run({"alertname": "MemoryHigh"}, scope(provider, "shop"))).text
    assert "api-7f9c8d6b5" not in hidden
    assert "[1 instances of namespaces outside this channel's scope dropped]" in hidden


async def test_without_a_name_only_the_rules_firing_pending_or_failing_are_listed(
    provider: PrometheusProvider,
) -> None:
    out = await PromRules().run({"alertname": ""}, scope(provider, "payments"))
    names = [line.split()[1] for line in out.text.splitlines() if line.startswith("rule ")]
    assert sorted(names) == sorted(["MemoryHigh", "BrokenRule", ALERT_NAME])  # not QuietAlert
    broken = next(line for line in out.text.splitlines() if line.startswith("rule BrokenRule"))
    assert "health err, last error:" in broken and "same labelset" in broken
    assert out.summary == "3 rules" and out.queries == ["GET /api/v1/rules?type=alert"]
    quiet = await PromRules().run({"alertname": "QuietAlert"}, scope(provider))
    assert quiet.text.startswith("rule QuietAlert (group opsbot-test): inactive, for 300 s, health ok")
    missing = await PromRules().run({"alertname": "NoSuchAlert"}, scope(provider))
    assert missing.text == "no alerting rule named NoSuchAlert"


async def test_the_eval_snapshot_serves_each_alerts_rule_in_prometheus_shape() -> None:
    """``opsbot eval``'s Prometheus answers ``/api/v1/rules`` from its alerts, as a real one would."""
    from bot.eval.prom_api import Alert, PrometheusSnapshotServer

    server = PrometheusSnapshotServer(
        alerts=[
            Alert(
                {
                    "alertname": "KubePodCrashLooping",
                    "severity": "warning",
                    "namespace": "shop",
                    "pod": "api-1",
                },
                expr="rate(kube_pod_container_status_restarts_total[5m]) * 60 * 5 > 0",
                for_s=900,
            ),
            Alert(
                {
                    "alertname": "KubePodCrashLooping",
                    "severity": "warning",
                    "namespace": "data",
                    "pod": "db-0",
                }
            ),
        ]
    )
    await server.start()
    provider = PrometheusProvider(PrometheusSettings(enabled=True, url=server.url))
    try:
        out = await PromRules().run({"alertname": ""}, scope(provider, "shop"))
    finally:
        await provider.close()
        await server.stop()
    assert out.text.splitlines() == [
        "rule KubePodCrashLooping (group snapshot): firing, for 900 s, health ok",
        "  expr: rate(kube_pod_container_status_restarts_total[5m]) * 60 * 5 > 0",
        "  severity: warning",
        out.text.splitlines()[3],
        "  [1 instances of namespaces outside this channel's scope dropped]",
    ]
    assert "pod=api-1" in out.text and "db-0" not in out.text
