"""The Alertmanager tools against a real Alertmanager (the Debian package's binary on a free port):
active alerts with their silenced state, active silences, both kept to the channel's namespaces."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.config import AlertmanagerSettings
from bot.context.alertmanager_api import AlertmanagerApi
from bot.context.gatherer import ContextGatherer
from bot.tools.base import ClusterTools, ToolScope
from bot.tools.registry import ToolBox, ToolRegistry
from inference.tool_calls import ToolCall

BINARY = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


def post(url: str, body: object) -> None:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    if BINARY is None:
        if os.environ.get("CI") == "true":
            raise AssertionError(
                "prometheus-alertmanager missing: apt-get install -y prometheus-alertmanager"
            )
        pytest.skip("prometheus-alertmanager is not installed")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = tmp_path / "alertmanager.yml"
    config.write_text(json.dumps({"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}))
    with (tmp_path / "am.log").open("wb") as log:
        process = subprocess.Popen(
            [
                BINARY,
                f"--config.file={config}",
                f"--storage.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        assert time.monotonic() < deadline, (tmp_path / "am.log").read_text()
        time.sleep(0.1)
    now = datetime.now(UTC)
    post(
        f"{url}/api/v2/alerts",
        [
            {"labels": {"alertname": "KubePodCrashLooping", "namespace": "shop", "pod": "api-1"},
             "annotations": {"summary": "api-1 is crash-looping"}},
            {"labels": {"alertname": "DiskFull", "namespace": "data", "pod": "postgres-0"}},
        ],
    )  # fmt: skip
    window = {"startsAt": now.isoformat(), "endsAt": (now + timedelta(hours=1)).isoformat()}
    post(
        f"{url}/api/v2/silences",
        {"matchers": [{"name": "namespace", "value": "shop", "isRegex": False, "isEqual": True},
                      {"name": "alertname", "value": "KubePodCrashLooping", "isRegex": False,
                       "isEqual": True}],
         "createdBy": "alice", "comment": "deploy in progress", **window},
    )  # fmt: skip
    post(
        f"{url}/api/v2/silences",
        {"matchers": [{"name": "namespace", "value": "data", "isRegex": False, "isEqual": True}],
         "createdBy": "bob", "comment": "db maintenance", **window},
    )  # fmt: skip
    yield url
    process.terminate()
    process.wait(10)


@pytest.fixture
async def tools(alertmanager: str) -> AsyncIterator[ToolBox]:
    """The tool box of a channel that may read namespace ``shop``."""
    api = AlertmanagerApi(AlertmanagerSettings(api_url=alertmanager))
    registry = ToolRegistry(ContextGatherer(), alertmanager=api)
    scope = ToolScope(clusters=[ClusterTools("default", ("shop",))], alertmanager=api)
    yield registry.box(scope, max_output_tokens=400, count=lambda t: len(t.split()))
    await registry.close()


async def test_active_alerts_say_they_are_silenced_and_other_namespaces_stay_out(tools: ToolBox) -> None:
    assert {"am_alerts", "am_silences"} <= set(tools.tools)
    result = await tools.call(ToolCall("am_alerts", {"alertname": ""}))
    assert result.status == "ok", result.text
    first, dropped = result.text.splitlines()
    assert (
        first.startswith("suppressed (silenced by ")
        and "KubePodCrashLooping namespace=shop pod=api-1" in first
    )
    assert first.endswith("- api-1 is crash-looping")
    assert dropped == "[1 alerts of namespaces outside this channel's scope dropped]"
    assert "postgres-0" not in result.text


async def test_active_silences_show_who_and_why_within_scope(tools: ToolBox) -> None:
    result = await tools.call(ToolCall("am_silences", {}))
    assert result.status == "ok", result.text
    line, dropped = result.text.splitlines()
    assert line.startswith("active until ") and 'namespace="shop"' in line
    assert line.endswith("by alice: deploy in progress")
    assert dropped == "[1 silences of namespaces outside this channel's scope dropped]"
    assert "db maintenance" not in result.text
