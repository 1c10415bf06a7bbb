"""Silences against the real Alertmanager binary: the dry run lists the alerts a silence would
mute, the silence is created and verified active, and its inverse expires it."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.actions.catalog import ActionSpec, parse_command
from bot.actions.kube_apply import ApplyError, KubeApply
from bot.actions.silences import Silences
from bot.actions.verify import alerts_after, verify
from bot.config import ActionsSettings

sys.path.insert(0, str(Path(__file__).parents[1] / "context"))
from prom_fixtures import ALERTMANAGER_BIN, free_port, http_ok, wait_until  # noqa: E402

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(ALERTMANAGER_BIN is None, reason="apt-get install -y prometheus-alertmanager"),
]


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    config = tmp_path / "am.yml"
    config.write_text(json.dumps({"route": {"receiver": "none"}, "receivers": [{"name": "none"}]}))
    with (tmp_path / "am.log").open("wb") as log:
        process = subprocess.Popen(
            [
                str(ALERTMANAGER_BIN),
                f"--config.file={config}",
                f"--storage.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_ok(f"{url}/-/ready"), 30, "Alertmanager ready")
        now = datetime.now(UTC)
        alerts = [
            {
                "labels": {"alertname": "KubePodCrashLooping", "namespace": "shop", "pod": f"api-{i}"},
                "startsAt": now.isoformat(),
                "endsAt": (now + timedelta(hours=1)).isoformat(),
            }
            for i in range(2)
        ] + [{"labels": {"alertname": "NodeDiskPressure", "node": "worker-1"}, "startsAt": now.isoformat()}]
        request = urllib.request.Request(
            f"{url}/api/v2/alerts", json.dumps(alerts).encode(), {"Content-Type": "application/json"}
        )
        urllib.request.urlopen(request, timeout=5).read()
        yield url
    finally:
        process.terminate()
        process.wait(10)


async def test_a_silence_dry_run_lists_what_it_mutes_then_it_is_created_verified_and_expired(
    alertmanager: str,
) -> None:
    settings = ActionsSettings(enabled=True, alertmanager_url=alertmanager, secret="s", verify_poll_s=0.05)
    silences, kube = Silences(settings), KubeApply(settings)
    try:
        spec = parse_command(
            'silence alertname=KubePodCrashLooping namespace=shop --for 30m --comment "rolling back"'
        )
        dry = await silences.run(spec, dry_run=True)
        assert dry.summary == "would mute 2 alert(s)"
        assert dry.diff.count("~ mutes KubePodCrashLooping") == 2 and "NodeDiskPressure" not in dry.diff
        assert await silences.call("GET", "/silences") == []
        done = await silences.run(spec, dry_run=False, created_by="U0APPROVER")
        silence_id = str((done.after or {})["silenceID"])
        outcome = await verify(spec, kube, silences, window_s=5, poll_s=0.05, silence_id=silence_id)
        assert outcome.ok and "active" in outcome.text
        stored = await silences.call("GET", f"/silence/{silence_id}")
        assert stored["createdBy"] == "U0APPROVER" and stored["comment"] == "rolling back"
        assert done.inverse == ActionSpec("expire_silence", {"silence_id": silence_id})
        expire_dry = await silences.run(done.inverse, dry_run=True)
        assert "active" in expire_dry.diff
        await silences.run(done.inverse, dry_run=False)
        outcome = await verify(done.inverse, kube, silences, window_s=5, poll_s=0.05)
        assert outcome.ok and "expired" in outcome.text
        with pytest.raises(ApplyError, match="already expired"):
            await silences.run(done.inverse, dry_run=True)
    finally:
        await silences.close()
        await kube.close()


async def test_after_a_restart_the_alerts_still_firing_for_the_workload_are_named(
    alertmanager: str, tmp_path: Path
) -> None:
    settings = ActionsSettings(enabled=True, alertmanager_url=alertmanager, secret="s")
    silences = Silences(settings)
    try:
        api = ActionSpec("rollout_restart", {"kind": "deployment", "namespace": "shop", "name": "api"})
        line = await alerts_after(api, silences)
        assert line == "2 alert(s) still firing for deployment/api -n shop: KubePodCrashLooping"
        web = ActionSpec("rollout_restart", {"kind": "deployment", "namespace": "shop", "name": "web"})
        assert await alerts_after(web, silences) == "no alert is firing for deployment/web -n shop"
        node = ActionSpec("cordon", {"kind": "node", "name": "worker-1"})
        assert (
            await alerts_after(node, silences)
            == "1 alert(s) still firing for node/worker-1: NodeDiskPressure"
        )
        # silenced alerts no longer count
        await silences.run(parse_command("silence alertname=KubePodCrashLooping --for 5m"), dry_run=False)
        assert await alerts_after(api, silences) == "no alert is firing for deployment/api -n shop"
    finally:
        await silences.close()
