"""Helpers of the reliability tests: Alertmanager payloads and polling with a deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest


def alert_payload(
    status: str = "firing",
    fingerprints: tuple[str, ...] = ("aaa",),
    group: str = "g1",
    name: str = "KubePodCrashLooping",
) -> dict[str, Any]:
    """An Alertmanager (webhook version 4) notification of one group."""
    alerts = [
        {
            "status": status,
            "labels": {"alertname": name, "namespace": "payments", "pod": f"api-{fp}"},
            "annotations": {"summary": f"{name} in payments"},
            "startsAt": "2026-11-29T19:50:00Z",
            "endsAt": "2026-11-29T20:00:00Z" if status == "resolved" else "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus/graph",
            "fingerprint": fp,
        }
        for fp in fingerprints
    ]
    return {
        "version": "4",
        "groupKey": f'{{}}:{{alertname="{name}", group="{group}"}}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "opsbot",
        "groupLabels": {"alertname": name, "group": group},
        "commonLabels": {"alertname": name, "namespace": "payments", "severity": "critical"},
        "commonAnnotations": {"summary": f"{name} in payments"},
        "externalURL": "http://alertmanager:9093",
        "alerts": alerts,
    }


async def poll(check: Callable[[], Any], timeout_s: float = 60.0, what: str = "") -> None:
    """Poll ``check`` (sync or async) until it is truthy; fail after ``timeout_s``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = check()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what or check}")
        await asyncio.sleep(0.05)
