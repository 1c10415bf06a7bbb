"""``opsbot analyze --post slack:CHANNEL``: the summary lands in a thread of the fake Slack, posted by
the real Slack adapter (slack-sdk pointed at the fake), a 429 on the way honoured."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest
from fakes.slack_server import FakeSlack, FaultRule
from rich.console import Console

from bot.analyze.command import run_analyze
from bot.config import Settings

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from gen_alerts import generate_alerts  # noqa: E402


@pytest.fixture
async def slack():
    async with FakeSlack() as fake:
        yield fake


def args(shift: Path, out: Path, **overrides: object) -> argparse.Namespace:
    values: dict[str, object] = {
        "input": shift,
        "scenario": "alert_summary",
        "out": out,
        "since": None,
        "until": None,
        "post": "slack:C0SHIFT",
        "format": "auto",
        "max_tokens": 8,
        "max_groups": None,
    }
    values.update(overrides)
    return argparse.Namespace(**values)


def settings(slack: FakeSlack, tiny_model: Path, tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path,
        engine={"backend": "cpu", "model": str(tiny_model), "max_model_len": 2048},
        slack={"bot_token": slack.bot_token, "api_base_url": slack.api_url, "retry": {"initial_s": 0.05}},
    )


async def test_the_summary_is_posted_into_a_thread_through_the_real_adapter(
    slack: FakeSlack, tiny_model: Path, tmp_path: Path
) -> None:
    shift = tmp_path / "shift.json"
    shift.write_text(json.dumps(generate_alerts(120, seed=2)))
    slack.rules.append(FaultRule(ratelimited=1.0, retry_after_s=1, times=1))  # the first post is told to wait
    console = Console(file=open(tmp_path / "console.txt", "w"), width=200)  # noqa: SIM115
    try:
        status = await run_analyze(
            settings(slack, tiny_model, tmp_path), args(shift, tmp_path / "out"), out=console, err=console
        )
    finally:
        console.file.close()
    assert status == 0, (tmp_path / "console.txt").read_text()
    header, *replies = slack.bot_messages("C0SHIFT")
    assert header.thread_ts is None and "opsbot analyze" in header.text and "120 alert firings" in header.text
    assert replies and all(r.thread_ts == header.ts for r in replies)
    thread = "\n".join(r.text for r in replies)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["groups"][0]["name"] in thread and "What changed" in thread
    assert str(tmp_path / "out" / "report.md") in thread
    retried = [c for c in slack.calls if c.method == "chat.postMessage" and c.fault == "ratelimited"]
    assert len(retried) == 1  # 429 once, then posted after its Retry-After


async def test_a_post_target_that_is_not_a_platform_is_refused_before_any_work(
    slack: FakeSlack, tiny_model: Path, tmp_path: Path
) -> None:
    shift = tmp_path / "shift.json"
    shift.write_text(json.dumps(generate_alerts(5)))
    console = Console(file=open(tmp_path / "console.txt", "w"))  # noqa: SIM115
    try:
        with pytest.raises(ValueError, match="expected slack:CHANNEL or mattermost:CHANNEL"):
            await run_analyze(
                settings(slack, tiny_model, tmp_path),
                args(shift, tmp_path / "out", post="irc:#ops"),
                out=console,
                err=console,
            )
    finally:
        console.file.close()
    assert not (tmp_path / "out").exists() and slack.calls == []
