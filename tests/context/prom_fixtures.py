"""A real Prometheus and a real Alertmanager (Debian packages ``prometheus`` and
``prometheus-alertmanager``), started from their binaries on free ports with temp storage.

Prometheus scrapes a tiny exporter run by the test (:class:`Exporter`): ``opsbot_test_trigger``
switches the alert ``OpsbotTestAlert`` on and off (``for: 0s``, 1 s evaluation), and a few
container metrics of the sample cluster's crash-looping pod give range queries something to
summarise. Alertmanager groups by ``alertname`` with 1 s ``group_wait`` / ``group_interval`` and
sends to opsbot's receiver URL with a bearer token.

Missing binaries skip the tests, except with ``CI=true`` (then they fail: CI must install them,
see ``.ci/apt-packages.txt``). The Debian services are never used: their default ports stay free.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

PROMETHEUS_BIN = shutil.which("prometheus")
ALERTMANAGER_BIN = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
ALERT_NAME = "OpsbotTestAlert"
TOKEN = "am-webhook-token-for-tests"


def require_binaries() -> tuple[str, str]:
    """Both binaries, or skip (fail under CI=true) naming what is missing."""
    missing = [
        name
        for name, path in (("prometheus", PROMETHEUS_BIN), ("prometheus-alertmanager", ALERTMANAGER_BIN))
        if path is None
    ]
    if missing:
        message = f"missing {', '.join(missing)}: apt-get install -y prometheus prometheus-alertmanager"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    assert PROMETHEUS_BIN is not None and ALERTMANAGER_BIN is not None
    return PROMETHEUS_BIN, ALERTMANAGER_BIN


def free_port() -> int:
    """A port that was free a moment ago (the binaries need a port number on their command line)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(check: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.1) -> None:
    """Poll ``check`` until true; fail with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class Exporter:
    """A Prometheus exporter whose values the test sets."""

    trigger: float = 0.0
    started: float = field(default_factory=time.time)
    _server: ThreadingHTTPServer | None = None
    port: int = 0

    def render(self) -> str:
        elapsed = time.time() - self.started
        pod = 'namespace="payments",pod="api-7f9c8d6b5-x2x9q",container="app"'
        return (
            "# TYPE opsbot_test_trigger gauge\n"
            f"opsbot_test_trigger {self.trigger}\n"
            "# TYPE container_cpu_usage_seconds_total counter\n"
            f"container_cpu_usage_seconds_total{{{pod}}} {0.5 * elapsed:.3f}\n"
            "# TYPE container_memory_working_set_bytes gauge\n"
            f"container_memory_working_set_bytes{{{pod}}} {200 * 1024 * 1024 + 1024 * 1024 * elapsed:.0f}\n"
        )

    def start(self) -> None:
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                body = exporter.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


@dataclass
class PromStack:
    """Running Prometheus + Alertmanager + exporter."""

    prometheus_url: str
    alertmanager_url: str
    receiver_port: int
    exporter: Exporter
    workdir: Path
    processes: list[subprocess.Popen[bytes]]

    def logs(self) -> str:
        """Both servers' logs (for failure messages)."""
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
            for p in sorted(self.workdir.glob("*.log"))
        )

    def active_alerts(self) -> list[dict[str, object]]:
        with urllib.request.urlopen(f"{self.alertmanager_url}/api/v2/alerts", timeout=2) as response:
            alerts: list[dict[str, object]] = json.load(response)
            return alerts

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.exporter.stop()


def _write(path: Path, data: object) -> Path:
    # JSON is YAML: no YAML writer needed.
    path.write_text(json.dumps(data, indent=2))
    return path


def start_stack(
    workdir: Path,
    receiver_path: str = "/alertmanager",
    *,
    rule_labels: dict[str, str] | None = None,
    rule_annotations: dict[str, str] | None = None,
    extra_rules: list[dict[str, object]] | None = None,
) -> PromStack:
    """Start the exporter, Alertmanager (sending to 127.0.0.1:<receiver_port><receiver_path>) and
    Prometheus; return once both report ready. ``rule_labels`` / ``rule_annotations`` replace the
    test alert's (a second cluster's stack), ``extra_rules`` are added to its rule group."""
    prometheus_bin, alertmanager_bin = require_binaries()
    workdir.mkdir(parents=True, exist_ok=True)
    exporter = Exporter()
    exporter.start()
    receiver_port, am_port, prom_port = free_port(), free_port(), free_port()
    am_config = _write(
        workdir / "alertmanager.yml",
        {
            "global": {"resolve_timeout": "10s"},
            "route": {
                "receiver": "opsbot",
                "group_by": ["alertname"],
                "group_wait": "1s",
                "group_interval": "1s",
                "repeat_interval": "1h",
            },
            "receivers": [
                {
                    "name": "opsbot",
                    "webhook_configs": [
                        {
                            "url": f"http://127.0.0.1:{receiver_port}{receiver_path}",
                            "send_resolved": True,
                            "http_config": {"authorization": {"type": "Bearer", "credentials": TOKEN}},
                        }
                    ],
                }
            ],
        },
    )
    rules = _write(
        workdir / "rules.yml",
        {
            "groups": [
                {
                    "name": "opsbot-test",
                    "interval": "1s",
                    "rules": [
                        {
                            "alert": ALERT_NAME,
                            "expr": "opsbot_test_trigger > 0",
                            "for": "0s",
                            "labels": rule_labels
                            or {"severity": "critical", "namespace": "payments", "deployment": "api"},
                            "annotations": rule_annotations
                            or {
                                "summary": "api in payments is crash-looping",
                                "description": "Pod api-7f9c8d6b5-x2x9q restarted 7 times in 10 minutes.",
                            },
                        },
                        *(extra_rules or []),
                    ],
                }
            ]
        },
    )
    prom_config = _write(
        workdir / "prometheus.yml",
        {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
            "scrape_configs": [
                {"job_name": "opsbot-test", "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}]}
            ],
        },
    )
    processes: list[subprocess.Popen[bytes]] = []
    with (workdir / "alertmanager.log").open("wb") as am_log:
        processes.append(
            subprocess.Popen(
                [
                    alertmanager_bin,
                    f"--config.file={am_config}",
                    f"--storage.path={workdir / 'am-data'}",
                    f"--web.listen-address=127.0.0.1:{am_port}",
                    "--cluster.listen-address=",
                    "--log.level=info",
                ],
                stdout=am_log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        )
    with (workdir / "prometheus.log").open("wb") as prom_log:
        processes.append(
            subprocess.Popen(
                [
                    prometheus_bin,
                    f"--config.file={prom_config}",
                    f"--storage.tsdb.path={workdir / 'prom-data'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                    "--rules.alert.resend-delay=1s",
                    "--storage.tsdb.retention.time=1h",
                    "--log.level=info",
                ],
                stdout=prom_log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        )
    stack = PromStack(
        prometheus_url=f"http://127.0.0.1:{prom_port}",
        alertmanager_url=f"http://127.0.0.1:{am_port}",
        receiver_port=receiver_port,
        exporter=exporter,
        workdir=workdir,
        processes=processes,
    )
    try:
        for process in processes:
            if process.poll() is not None:
                raise AssertionError(f"a server exited at start:\n{stack.logs()}")
        wait_until(lambda: http_ok(f"{stack.alertmanager_url}/-/ready"), 30, "Alertmanager /-/ready")
        wait_until(lambda: http_ok(f"{stack.prometheus_url}/-/ready"), 30, "Prometheus /-/ready")
    except AssertionError as exc:
        stack.stop()
        raise AssertionError(f"{exc}\n{stack.logs()}") from None
    return stack


def series_present(stack: PromStack, promql: str) -> bool:
    """True when ``promql`` returns at least one series now."""
    query = urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(f"{stack.prometheus_url}/api/v1/query?{query}", timeout=2) as response:
        body = json.load(response)
    return bool(body.get("data", {}).get("result"))
