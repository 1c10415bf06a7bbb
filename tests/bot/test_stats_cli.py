"""``opsbot stats`` as a user runs it (a real process on a real SQLite file): windows, groupings,
percentiles, error rate, prefix-cache reuse, the TTFT histogram in 80 columns, JSON, CSV and the
PNG plot."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from PIL import Image

from bot.config import StoreSettings
from bot.store import RequestRecord, Store

REPO = Path(__file__).resolve().parents[2]
LONG_MODEL = "/models/Meta-Llama-3.1-8B-Instruct-AWQ-INT4-with-a-very-long-folder-name-indeed"
FIXED = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)
"""Rows of the fixed window are created between 10:00 and 10:59 on this day."""

pytestmark = pytest.mark.timeout(180)


def opsbot(args: list[str], db: Path, *, columns: int = 80) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSBOT_")}
    env.update(
        {
            "OPSBOT_STORE__URL": f"sqlite+aiosqlite:///{db}",
            "OPSBOT_LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(REPO),
            "COLUMNS": str(columns),
            "NO_COLOR": "1",
        }
    )
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", *args],
        cwd=db.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def record(i: int, created_at: datetime, **fields: object) -> RequestRecord:
    values: dict[str, object] = {
        "platform": "slack",
        "channel": "C0INCIDENTS",
        "thread_id": "1.2",
        "user": "U1",
        "scenario": "root_cause",
        "lane": "urgent",
        "status": "ok",
        "model": LONG_MODEL,
        "prompt_tokens": 1000,
        "cached_tokens": 750,
        "output_tokens": 50,
        "ttft_ms": 100.0 * i,
        "tpot_ms": 10.0 + i,
        "queue_ms": float(i),
        "e2e_ms": 1000.0 + 100 * i,
        "created_at": created_at,
    }
    values.update(fields)
    return RequestRecord(request_id=f"r{created_at.timestamp():.0f}-{i}", **values)  # type: ignore[arg-type]


async def seed(db: Path, rows: list[RequestRecord]) -> None:
    store = await Store.open(f"sqlite+aiosqlite:///{db}", StoreSettings())
    for r in rows:
        await store.record_request(r)
    await store.close(flush_timeout_s=10)


@pytest.fixture
async def db(tmp_path: Path) -> Path:
    """Recent rows (the last hour) in two scenarios, lanes and channels, one of them failed; and rows
    of a fixed past hour."""
    now = datetime.now(UTC)
    rows = [record(i, now - timedelta(minutes=i)) for i in range(1, 11)]  # TTFT 100..1000 ms
    rows += [
        record(
            20 + i,
            now - timedelta(minutes=5 + i),
            scenario="chat",
            lane="background",
            channel="C0OPS",
            ttft_ms=25.0 * (i + 1),
            cached_tokens=0,
            model="tiny",
        )  # fmt: skip
        for i in range(3)
    ]
    rows.append(record(99, now - timedelta(minutes=7), scenario="chat", lane="background", status="timeout",
                       ttft_ms=None, tpot_ms=None, model="tiny", channel="C0OPS"))  # fmt: skip
    rows += [record(i, FIXED + timedelta(minutes=6 * i), scenario="alert_summary") for i in range(10)]
    path = tmp_path / "opsbot.db"
    await seed(path, rows)
    return path


def test_the_table_fits_80_columns_with_percentiles_error_rate_reuse_and_a_ttft_histogram(db: Path) -> None:
    proc = opsbot(["stats", "--since", "1h", "--by", "scenario,lane,model"], db)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, "\n".join(line for line in lines if len(line) > 80)
    text = proc.stdout
    assert "14 requests, grouped by scenario, lane, model" in text
    assert "error %" in text and "reuse %" in text and "p99 ms" in text
    chat = next(line for line in lines if line.startswith("chat / background / tiny"))
    assert chat.split()[-4:] == ["4", "1", "25.0", "0.0"]  # requests, errors, error %, reuse %
    root = next(line for line in lines if line.startswith("root_cause / urgent / /models/Meta"))
    assert root.endswith("10       0      0.0      75.0") and "…" in root  # the long model name is cut
    # TTFT of root_cause 100..1000 ms: p50 550, p90 910, p99 991 (linear interpolation).
    ttft = next(line for line in lines if line.startswith("root_cause / urgent / /models") and "TTFT" in line)
    assert ttft.split()[-4:] == ["TTFT", "550.0", "910.0", "991.0"], ttft
    histogram = lines[lines.index(next(line for line in lines if line.startswith("TTFT histogram"))) :]
    assert histogram[0] == "TTFT histogram (13 answers with a first token)"
    counts = {line.split("│")[0].strip(): int(line.split()[-1]) for line in histogram[1:]}
    assert counts == {
        "25-50 ms": 1,
        "50-100 ms": 2,
        "100-250 ms": 2,
        "250-500 ms": 2,
        "500 ms-1 s": 5,
        "1-2 s": 1,
    }


def test_grouping_by_lane_channel_or_model_regroups_the_same_rows(db: Path) -> None:
    by_lane = json.loads(opsbot(["stats", "--since", "1h", "--by", "lane", "--json"], db).stdout)
    assert [(g["lane"], g["count"], g["errors"]) for g in by_lane["groups"]] == [
        ("background", 4, 1),
        ("urgent", 10, 0),
    ]
    by_channel = json.loads(opsbot(["stats", "--since", "1h", "--by", "channel,model", "--json"], db).stdout)
    assert [(g["channel"], g["model"], g["count"]) for g in by_channel["groups"]] == [
        ("C0INCIDENTS", LONG_MODEL, 10),
        ("C0OPS", "tiny", 4),
    ]
    total = by_channel["total"]
    assert total["count"] == 14 and total["errors"] == 1
    assert total["prefix_cache_reuse"] == pytest.approx(7500 / 13000)  # ok requests only
    assert by_channel["unit"] == "ms" and by_channel["by"] == ["channel", "model"]


def test_json_and_csv_carry_the_same_numbers(db: Path) -> None:
    data = json.loads(opsbot(["stats", "--since", "1h", "--by", "scenario", "--json"], db).stdout)
    rows = list(
        csv.DictReader(
            io.StringIO(opsbot(["stats", "--since", "1h", "--by", "scenario", "--csv"], db).stdout)
        )
    )
    assert [r["scenario"] for r in rows] == [g["scenario"] for g in data["groups"]] == ["chat", "root_cause"]
    for row, group in zip(rows, data["groups"], strict=True):
        assert int(row["requests"]) == group["count"] and int(row["errors"]) == group["errors"]
        assert float(row["error_rate"]) == pytest.approx(group["error_rate"])
        assert float(row["ttft_p99_ms"]) == pytest.approx(group["ttft_ms"]["p99"], abs=1e-3)
        assert float(row["tpot_p50_ms"]) == pytest.approx(group["tpot_ms"]["p50"], abs=1e-3)
    assert data["groups"][0]["by_status"] == {"ok": 3, "timeout": 1}
    assert sum(b["count"] for b in data["ttft_histogram"]) == 13


def test_since_and_until_take_utc_times_or_durations(db: Path) -> None:
    fixed = json.loads(
        opsbot(["stats", "--since", "2026-01-05T10:00", "--until", "2026-01-05T10:30", "--json"], db).stdout
    )
    assert [(g["scenario"], g["count"]) for g in fixed["groups"]] == [("alert_summary", 5)]  # 10:00 .. 10:24
    assert fixed["since"] == "2026-01-05T10:00:00+00:00" and fixed["until"] == "2026-01-05T10:30:00+00:00"
    offset = json.loads(
        opsbot(
            ["stats", "--since", "2026-01-05T11:00+01:00", "--until", "2026-01-05T12:00+01:00", "--json"], db
        ).stdout
    )
    assert offset["total"]["count"] == 10
    older = json.loads(opsbot(["stats", "--since", "1h", "--until", "6m", "--json"], db).stdout)
    assert older["total"]["count"] == 14 - 5 - 1  # minutes 1..5 of root_cause and 5 of chat are too recent


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--by", "user"], "group by one or more of scenario, lane, platform, channel, model"),
        (["--by", "lane,lane"], "each once"),
        (["--since", "yesterday"], "neither a duration"),
        (["--since", "1h", "--until", "2h"], "must be before --until"),
        (["--json", "--csv"], "not allowed with argument"),
    ],
)
def test_bad_windows_and_groupings_are_one_line_errors(db: Path, args: list[str], needle: str) -> None:
    proc = opsbot(["stats", *args], db)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_plot_writes_a_real_png_of_1200_by_800_pixels(db: Path, tmp_path: Path) -> None:
    target = tmp_path / "latency.png"
    proc = opsbot(["stats", "--since", "2h", "--plot", str(target)], db)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {target} (1200 x 800 px)" in proc.stderr
    with Image.open(target) as image:
        assert image.format == "PNG" and image.size == (1200, 800)
        colours = image.convert("RGB").getcolors(maxcolors=1_000_000)
    assert colours is not None and len(colours) > 50  # lines, markers, text: not a blank canvas


def test_plot_into_a_missing_folder_is_a_one_line_error(db: Path, tmp_path: Path) -> None:
    proc = opsbot(["stats", "--plot", str(tmp_path / "no" / "such" / "dir" / "x.png")], db)
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot write the plot" in lines[0], proc.stderr
