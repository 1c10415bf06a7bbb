"""deploy/monitoring: the alert rules (promtool, and a real Prometheus), the Grafana dashboard (every
query returns a series from a real Prometheus scraping a running opsbot that answered questions),
and the KEDA autoscaler's queries."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from fakes.slack_harness import SHORT, answers, slack_settings
from fakes.slack_server import FakeSlack, FaultRule
from prometheus_client import Counter, Gauge, Histogram

from bot import metrics
from bot.adapters.registry import build_adapters
from bot.app import OpsBot
from bot.config import Settings

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "deploy" / "monitoring"
RULES = MONITORING / "opsbot-alerts.rules.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
SCALER = MONITORING / "keda-scaledobject.yaml"
RATE_INTERVAL = "5m"
"""What Grafana's ``$__rate_interval`` stands for when the test runs a panel's query itself."""


def binary(name: str) -> str:
    """A Debian ``prometheus`` package binary, or skip (fail under CI=true: CI must install it)."""
    path = shutil.which(name)
    if path is None:
        message = f"missing {name}: apt-get install -y prometheus"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def dashboard_targets() -> list[tuple[str, str]]:
    """(panel title, PromQL with Grafana's interval variable filled in) of every panel target."""
    board = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"].replace("$__rate_interval", RATE_INTERVAL))
        for panel in board["panels"]
        for target in panel["targets"]
    ]


def scaler_queries() -> dict[str, str]:
    (scaler,) = [d for d in yaml.safe_load_all(SCALER.read_text()) if d]
    return {t["name"]: t["metadata"]["query"] for t in scaler["spec"]["triggers"]}


def exported_names() -> set[str]:
    """Every sample name bot/metrics.py exposes on /metrics (and a histogram's own name)."""
    names: set[str] = set()
    for value in vars(metrics).values():
        if isinstance(value, Histogram):
            base = value._name
            names |= {base, f"{base}_bucket", f"{base}_sum", f"{base}_count"}
        elif isinstance(value, Counter):
            names.add(f"{value._name}_total")
        elif isinstance(value, Gauge):
            names.add(value._name)
    return names


# -- static checks ----------------------------------------------------------------------------------
def test_promtool_accepts_the_alert_rules() -> None:
    proc = subprocess.run(
        [binary("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 4 rules found" in proc.stdout


def test_promtool_unit_tests_of_every_alert_pass() -> None:
    proc = subprocess.run(
        [binary("promtool"), "test", "rules", "opsbot-alerts.test.yml"],
        cwd=MONITORING,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tested = set(re.findall(r"alertname: (\w+)", (MONITORING / "opsbot-alerts.test.yml").read_text()))
    rules = {
        r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r
    }
    assert (
        tested
        == rules
        == {
            "OpsbotTTFTP99High",
            "OpsbotEngineNotReady",
            "OpsbotStoreRowsDropped",
            "OpsbotPlatformCallsFailing",
        }
    )


def test_every_metric_the_dashboard_the_rules_and_the_autoscaler_name_is_one_opsbot_exports() -> None:
    exported = exported_names()
    for path in (DASHBOARD, RULES, SCALER):
        named = set(re.findall(r"\bopsbot_[a-z0-9_]+", path.read_text()))
        assert named, path
        assert named <= exported, (
            f"{path.name} names metrics opsbot does not export: {sorted(named - exported)}"
        )


def test_the_dashboard_is_grafana_json_with_a_datasource_variable_unique_ids_and_panels_in_the_grid() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    (variable,) = board["templating"]["list"]
    assert (variable["name"], variable["type"], variable["query"]) == (
        "datasource",
        "datasource",
        "prometheus",
    )
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    titles = " | ".join(p["title"] for p in board["panels"])
    for needed in ("TTFT P50 / P90 / P99", "TPOT P50 / P90 / P99", "Queue by lane", "KV-cache use"):
        assert needed in titles
    for needed in ("Prefix-cache", "Error rate", "Platform 429s"):
        assert needed in titles
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]  # every number has a unit
        assert panel["targets"] and all(t["refId"] and t["expr"] for t in panel["targets"])


def test_the_autoscaler_scales_the_opsbot_deployment_on_p99_ttft_and_queue_depth() -> None:
    (scaler,) = [d for d in yaml.safe_load_all(SCALER.read_text()) if d]
    base = REPO / "deploy" / "base" / "deployment.yaml"
    (deployment,) = [d for d in yaml.safe_load_all(base.read_text()) if d]
    spec = scaler["spec"]
    assert (scaler["apiVersion"], scaler["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    assert spec["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert scaler["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert 1 <= spec["minReplicaCount"] < spec["maxReplicaCount"]
    triggers = {t["name"]: t for t in spec["triggers"]}
    assert triggers["ttft-p99"]["metricType"] == "Value"  # a latency does not add up over replicas
    assert triggers["queue-depth"]["metricType"] == "AverageValue"  # a queue does
    assert float(triggers["ttft-p99"]["metadata"]["threshold"]) < 2.0  # scale before the alert fires


# -- a real Prometheus scraping a running opsbot ----------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    http: aiohttp.ClientSession

    async def api(self, path: str, **params: str) -> Any:
        async with self.http.get(f"{self.url}/api/v1/{path}", params=params) as resp:
            body = await resp.json()
        assert body["status"] == "success", body
        return body["data"]

    async def query(self, promql: str) -> list[dict[str, Any]]:
        data = await self.api("query", query=promql)
        result: list[dict[str, Any]] = data["result"]
        return result

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    """Poll ``check`` (never blocking the event loop opsbot's server runs on) until true, or fail."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(aiohttp.ClientError, AssertionError):
            if await check():
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.25)


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as fake:
        yield fake


@pytest.fixture
async def stack(
    slack: FakeSlack, tiny_model: Path, tmp_path: Path
) -> AsyncIterator[tuple[OpsBot, Prometheus]]:
    """opsbot (Slack, HTTP, the Prometheus context provider, the SLO guard) and a Prometheus that
    scrapes it every second and evaluates the deploy rules plus a copy whose ``for`` is 0 s."""
    prometheus_bin = binary("prometheus")
    prom_port = free_port()
    settings = Settings(
        data_dir=tmp_path,
        engine={"backend": "cpu", "model": str(tiny_model), "max_model_len": 2048, "drain_timeout_s": 2},
        store={"url": f"sqlite+aiosqlite:///{tmp_path / 'opsbot.db'}"},
        scenarios=dict.fromkeys(("chat", "root_cause", "change_review", "alert_summary"), SHORT),
        http={"host": "127.0.0.1", "port": 0},
        slack=slack_settings(slack).model_dump(mode="python"),
        prometheus={"enabled": True, "url": f"http://127.0.0.1:{prom_port}", "timeout_s": 5},
        context={"cache_ttl_s": 0},  # every answer asks the provider: its histogram moves each round
        slo={"evaluate_interval_s": 0.2},
    )
    bot = OpsBot(settings)
    await bot.start_core()
    assert bot.store is not None
    await bot.start_service(build_adapters(settings, bot.store))
    fast = yaml.safe_load(RULES.read_text())
    for group in fast["groups"]:
        group["name"] += "-fast"
        group["interval"] = "1s"
        for rule in group["rules"]:
            rule["for"] = "0s"
    (tmp_path / "fast.rules.yml").write_text(json.dumps(fast))  # JSON is YAML
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES), str(tmp_path / "fast.rules.yml")],
        "scrape_configs": [
            {"job_name": "opsbot", "static_configs": [{"targets": [f"127.0.0.1:{bot.http_port}"]}]}
        ],
    }
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                prometheus_bin,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'prom-data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
    prom = Prometheus(f"http://127.0.0.1:{prom_port}", process, log, http)
    try:

        async def ready() -> bool:
            async with http.get(f"{prom.url}/-/ready") as resp:
                return resp.status == 200

        await eventually(ready, 30, "Prometheus /-/ready")
        yield bot, prom
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        await http.close()
        await bot.shutdown()


@pytest.mark.timeout(240)
async def test_a_real_prometheus_scraping_opsbot_finds_every_dashboard_series_and_fires_the_alerts(
    slack: FakeSlack, stack: tuple[OpsBot, Prometheus]
) -> None:
    bot, prom = stack

    async def ask_one_per_lane(round_: int) -> None:
        """A mention (normal), /rca (urgent), a change review (normal) and a follow-up in the bot's
        thread (background)."""
        done = len(answers(slack))
        mention = slack.user_message("C1", "U1", f"<@{slack.bot_user_id}> why is checkout returning 502?")
        await slack.deliver_event(slack.mention_events(mention)[0])
        await slack.deliver(
            "slash_commands", slack.slash_command("C2", "U7", f"payments-api 5xx spike #{round_}")
        )
        review = slack.user_message("C3", "U2", f"<@{slack.bot_user_id}> review the rollout of api v{round_}")
        await slack.deliver_event(slack.mention_events(review)[0])
        await slack.wait_for(lambda: len(answers(slack)) == done + 3, timeout_s=90)
        await slack.deliver_event(slack.user_message("C1", "U1", "and the memory?", thread_ts=mention["ts"]))
        await slack.wait_for(lambda: len(answers(slack)) == done + 4, timeout_s=90)

    async def scraped(requests: int) -> bool:
        result = await prom.query("sum(opsbot_requests_total)")
        return bool(result) and float(result[0]["value"][1]) >= requests

    # Two rounds: rate() sees an increase only in a series Prometheus had already scraped once.
    await ask_one_per_lane(1)
    await eventually(lambda: scraped(4), 30, "a scrape after the first four answers")
    # Then one 429 (Retry-After 1 s) and a few 5xx: the dashboard's 429 panel and the failing-calls
    # alert see real ones. Every answer still arrives (the adapter retries).
    slack.rules.append(FaultRule(methods=frozenset({"chat.postMessage"}), ratelimited=1.0, times=1))
    slack.rules.append(FaultRule(server_error=0.3, times=6, seed=3))
    await ask_one_per_lane(2)
    await eventually(lambda: scraped(8), 30, "a scrape after the next four answers")

    async def dashboard_complete() -> bool:
        missing = [title for title, expr in dashboard_targets() if not await finite_series(prom, expr)]
        return not missing

    try:
        await eventually(dashboard_complete, 30, "a finite series for every dashboard query")
    except AssertionError:
        missing = [
            f"{title}: {expr}" for title, expr in dashboard_targets() if not await finite_series(prom, expr)
        ]
        raise AssertionError(
            "dashboard queries without a series:\n" + "\n".join(missing) + prom.logs()
        ) from None

    lanes = {
        r["metric"]["lane"] for r in await prom.query(dict(dashboard_targets())["Queue wait P99 by lane"])
    }
    assert lanes >= {"urgent", "normal", "background"}
    ratelimited = await prom.query(dict(dashboard_targets())["Platform 429s"])
    assert [float(r["value"][1]) > 0 for r in ratelimited if r["metric"].get("platform") == "slack"] == [True]

    for name, query in scaler_queries().items():  # KEDA needs exactly one element
        result = await prom.query(query)
        assert len(result) == 1 and math.isfinite(float(result[0]["value"][1])), (name, result)

    rules = await prom.api("rules")
    loaded = {(g["name"], r["name"]): r for g in rules["groups"] for r in g["rules"]}
    assert {name for group, name in loaded if group == "opsbot"} == {
        "OpsbotTTFTP99High",
        "OpsbotEngineNotReady",
        "OpsbotStoreRowsDropped",
        "OpsbotPlatformCallsFailing",
    }
    assert all(r["health"] in ("ok", "unknown") and not r.get("lastError") for r in loaded.values()), loaded

    async def firing(alert: str, **labels: str) -> bool:
        data = await prom.api("alerts")
        return any(
            a["labels"]["alertname"] == alert
            and a["state"] == "firing"
            and all(a["labels"].get(k) == v for k, v in labels.items())
            for a in data["alerts"]
        )

    # 6 of the Slack calls answered 5xx: over 5 % of them failed.
    await eventually(
        lambda: firing("OpsbotPlatformCallsFailing", platform="slack"), 30, "OpsbotPlatformCallsFailing"
    )
    assert not await firing("OpsbotEngineNotReady")
    assert bot.engine is not None
    await bot.engine.shutdown(1.0)
    await eventually(lambda: firing("OpsbotEngineNotReady"), 30, "OpsbotEngineNotReady")


async def finite_series(prom: Prometheus, expr: str) -> bool:
    """Whether ``expr`` returns at least one series with a finite value now."""
    result = await prom.query(expr)
    return any(math.isfinite(float(r["value"][1])) for r in result)
