"""Prometheus provider against a real Prometheus (Debian package), plus its summaries and templates."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prom_fixtures import ALERT_NAME, PromStack, series_present, start_stack, wait_until

from bot.config import PrometheusSettings
from bot.context.base import ContextRequest, ProviderStatus
from bot.context.entities import extract
from bot.context.prometheus import PrometheusProvider, fill, format_value, placeholder_values, summarise


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromStack]:
    """Real Prometheus + Alertmanager with the test alert firing and a few minutes of no history."""
    stack = start_stack(tmp_path_factory.mktemp("prom"))
    stack.exporter.trigger = 1
    try:
        wait_until(
            lambda: series_present(stack, f'ALERTS{{alertname="{ALERT_NAME}",alertstate="firing"}}'),
            30,
            "the test alert to fire",
        )
        # Range summaries need a few samples of the counters.
        wait_until(
            lambda: series_present(stack, "rate(container_cpu_usage_seconds_total[5s])"), 30, "cpu samples"
        )
        yield stack
    finally:
        stack.stop()


def _request(question: str) -> ContextRequest:
    return ContextRequest(question=question, scenario="root_cause", entities=extract(question))


async def test_firing_alerts_and_summarised_range_queries_come_from_the_real_prometheus(prom):
    provider = PrometheusProvider(PrometheusSettings(enabled=True, url=prom.prometheus_url, range_minutes=5))
    try:
        result = await provider.fetch(_request("why is api-7f9c8d6b5-x2x9q slow in namespace payments?"))
    finally:
        await provider.close()
    assert result.status is ProviderStatus.OK, result.error
    alerts = next(s for s in result.sections if s.title.startswith("Firing alerts"))
    assert alerts.body.startswith("firing since ") and ALERT_NAME in alerts.body
    assert "api in payments is crash-looping" in alerts.body
    metrics = next(s for s in result.sections if s.title.startswith("Metrics"))
    cpu = next(line for line in metrics.body.splitlines() if line.startswith("cpu "))
    assert 'pod="api-7f9c8d6b5-x2x9q"' in cpu and "cores" in cpu
    memory = next(line for line in metrics.body.splitlines() if line.startswith("memory "))
    assert "MiB" in memory and "min " in memory and "max " in memory and "last " in memory
    # Queries the exporter has no series for are simply absent, not errors.
    assert not any(line.startswith("error_rate") for line in metrics.body.splitlines())
    assert 'container_cpu_usage_seconds_total{namespace=~"payments"' in result.query


async def test_a_plain_question_runs_only_the_templates_without_placeholders(prom):
    provider = PrometheusProvider(PrometheusSettings(enabled=True, url=prom.prometheus_url))
    try:
        result = await provider.fetch(_request("how is everything?"))
    finally:
        await provider.close()
    assert "up == 0" in result.query and "container_cpu_usage_seconds_total" not in result.query


async def test_a_bad_custom_query_returns_prometheus_error_text_and_the_query(prom):
    settings = PrometheusSettings(
        enabled=True, url=prom.prometheus_url, instant_queries={"broken": "sum(rate(x[5m]) by"}
    )
    provider = PrometheusProvider(settings)
    try:
        result = await provider.fetch(_request("how is everything?"))
    finally:
        await provider.close()
    assert result.status is ProviderStatus.OK  # the alerts still came back
    assert "broken: HTTP 400 bad_data" in (result.error or "")
    assert "sum(rate(x[5m]) by" in result.query


async def test_a_bearer_token_is_sent_and_a_dead_address_fails_with_the_url():
    provider = PrometheusProvider(PrometheusSettings(enabled=True, url="http://127.0.0.1:9", timeout_s=1))
    try:
        result = await provider.fetch(_request("how is everything?"))
    finally:
        await provider.close()
    assert result.status is ProviderStatus.FAILED
    assert "cannot reach http://127.0.0.1:9/api/v1/" in (result.error or "")


def test_range_series_are_summarised_with_units_and_trend():
    rising = [100 * 1024**2 + i * 10 * 1024**2 for i in range(20)]
    assert summarise(rising, "bytes") == "min 100.0 MiB, max 290.0 MiB, last 290.0 MiB, rising (20 points)"
    assert "flat" in summarise([0.2] * 10, "seconds")
    assert "falling" in summarise([0.9, 0.8, 0.5, 0.1], "ratio")
    assert format_value(0.25, "seconds") == "250 ms"
    assert format_value(0.042, "ratio") == "4.2%"
    assert format_value(0.35, "cores") == "0.35 cores"


def test_templates_run_only_when_every_placeholder_is_filled_and_values_are_escaped():
    values = placeholder_values(extract("deployment api in namespace pay-ments"))
    assert fill('x{pod=~"{pod_regex}"}', values) == 'x{pod=~"api-.*"}'
    assert fill('ALERTS{alertname="{alertname}"}', {"alertname": 'a"b'}) == 'ALERTS{alertname="a\\"b"}'
    assert fill('x{node=~"{node}"}', values) is None
    assert fill('x{namespace=~"{namespace}"}', placeholder_values(extract("hi"))) == 'x{namespace=~".+"}'
