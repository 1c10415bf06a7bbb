"""The report files: Markdown with its sections, JSON with the numbers, and a real PNG chart."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path

import pytest
from PIL import Image

from bot.analyze.job import JobSpec, prepare
from bot.analyze.readers import read_bytes
from bot.analyze.report import PNG_SIZE, bucket_seconds, build_report, chat_summary, write_report
from bot.analyze.results import ItemResult
from bot.analyze.runner import RunSummary
from bot.prompts import DEFAULT_SYSTEM_PROMPT, PromptBuilder
from inference.scenarios import ScenarioRegistry
from inference.tokenization import HFChatTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from gen_alerts import generate_alerts  # noqa: E402


@pytest.fixture
def prepared(tiny_model: Path, tmp_path: Path):
    builder = PromptBuilder(
        HFChatTokenizer(str(tiny_model)),
        system_prompt=DEFAULT_SYSTEM_PROMPT,
        max_model_len=2048,
        context_share=0.45,
        history_share=0.2,
    )
    alerts = generate_alerts(400, seed=1)
    read = read_bytes(json.dumps(alerts).encode(), "shift.json")
    spec = JobSpec(input_name="shift.json", scenario="alert_summary", out_dir=tmp_path / "out", max_tokens=32)
    return prepare(spec, read, builder, ScenarioRegistry())


def fake_results(prepared, done: int) -> dict[str, ItemResult]:
    out = {}
    for index, item in enumerate(prepared.plan.items[:done]):
        out[item.id] = ItemResult(
            id=item.id,
            group=item.group.key,
            scenario=item.scenario,
            request_id=f"batch-test-{index}",
            text=f"Summary of {item.group.name}: fired {item.group.occurrences} times.",
            finish_reason="stop",
            prompt_tokens=item.prompt_tokens,
            cached_tokens=0,
            output_tokens=12,
            queue_ms=1.0,
            ttft_ms=5.0,
            tpot_ms=2.0,
            e2e_ms=30.0,
            created_at="2026-11-30T16:00:00+00:00",
            finished_at="2026-11-30T16:00:01+00:00",
        )
    return out


def report_of(prepared, done: int) -> dict:
    return build_report(
        input_name="shift.json",
        read=prepared.read,
        outside_window=0,
        since=None,
        until=None,
        grouping=prepared.grouping,
        plan=prepared.plan,
        results=fake_results(prepared, done),
        summary=RunSummary(
            mode="engine", total=len(prepared.plan.items), skipped=0, finished=done, wall_s=2.0
        ),
        scenario="alert_summary",
        model="tiny",
    )


def test_the_report_files_are_written_and_the_png_is_a_real_chart_of_the_expected_size(
    prepared, tmp_path: Path
) -> None:
    report = report_of(prepared, done=len(prepared.plan.items) - 2)
    files = write_report(tmp_path / "out", report)
    with Image.open(files.png) as image:
        assert image.format == "PNG" and image.size == PNG_SIZE
        colours = image.convert("RGB").getcolors(maxcolors=1_000_000)
    assert colours is not None and len(colours) > 20  # lines and a legend, not an empty canvas

    md = files.markdown.read_text()
    for heading in ("## Top groups", "## Counts over time", "## What changed", "## Summaries"):
        assert heading in md
    assert "400 alert firings" in md and "prompt tokens saved" in md
    assert "re-run `opsbot analyze`" in md  # the two groups still pending say how to finish them
    top = report["groups"][0]
    assert f"| 1 | {top['title']}" in md and top["summary"] in md
    assert "![counts over time per group](counts.png)" in md
    assert "rollout of payments-api" in md  # pods of two ReplicaSets during the shift

    data = json.loads(files.json.read_text())
    assert data["grouping"]["items"] == 400 and data["grouping"]["unit"] == "tokens"
    assert data["grouping"]["prompt_tokens_saved"] > 0
    assert data["totals"] == {
        "groups": len(prepared.grouping.groups),
        "summarised": len(prepared.plan.items) - 2,
        "pending": 2,
        "not_planned": 0,
        "echoed": 0,
        "empty": 0,
    }
    counts = data["counts_over_time"]
    first, last = (
        datetime.fromisoformat(data["window"][k].replace("Z", "+00:00")) for k in ("first", "last")
    )
    assert counts["bucket_s"] == bucket_seconds(last - first) == 600  # an 8-hour shift: 48 buckets of 10 min
    assert sum(counts["total"]) == 400
    assert sum(sum(s["counts"]) for s in counts["series"]) == 400
    assert data["run"]["items_per_s"] == pytest.approx((len(prepared.plan.items) - 2) / 2.0, rel=0.01)


def test_what_changed_finds_new_groups_rates_and_rollouts(prepared) -> None:
    report = report_of(prepared, done=0)
    kinds = {c["kind"] for c in report["changes"]}
    assert {"new", "rollout"} <= kinds
    crash = next(c for c in report["changes"] if c["kind"] == "new" and "KubePodCrashLooping" in c["what"])
    assert crash["at"].startswith("2026-11-30T10:") or crash["at"].startswith("2026-11-30T11:")
    assert report["changes"] == sorted(report["changes"], key=lambda c: (c["at"] or "", c["kind"], c["what"]))


def test_the_chat_summary_is_a_header_and_a_body_with_the_top_groups(prepared) -> None:
    report = report_of(prepared, done=3)
    header, body = chat_summary(report, report_path="/tmp/out/report.md")
    assert "opsbot analyze" in header and "400 alert firings" in header and "\n" not in header
    assert report["groups"][0]["title"] in body and "What changed" in body
    assert "(no summary yet)" in body and "/tmp/out/report.md" in body


def test_a_report_without_any_timestamp_still_draws_a_png(tiny_model: Path, tmp_path: Path) -> None:
    builder = PromptBuilder(
        HFChatTokenizer(str(tiny_model)),
        system_prompt="s",
        max_model_len=1024,
        context_share=0.4,
        history_share=0.2,
    )
    read = read_bytes(b"ERROR one thing broke\nERROR one thing broke\nINFO fine\n", "plain.log")
    prepared = prepare(JobSpec("plain.log", "timeline", tmp_path), read, builder, ScenarioRegistry())
    report = build_report(
        input_name="plain.log",
        read=read,
        outside_window=0,
        since=None,
        until=None,
        grouping=prepared.grouping,
        plan=prepared.plan,
        results={},
        summary=None,
        scenario="timeline",
        model="tiny",
    )
    files = write_report(tmp_path, report)
    with Image.open(files.png) as image:
        assert image.size == PNG_SIZE
    assert "No record carries a timestamp." in files.markdown.read_text()
