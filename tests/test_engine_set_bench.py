"""bench/engine_bench.py's split report (two engines through the EngineSet vs one with lanes): the
comparison and the table, from episode numbers with known ratios (the GPU run fills them in)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from inference.engine import Lane
from inference.scenarios import ALERT_SUMMARY, ROOT_CAUSE

BENCH = Path(__file__).resolve().parents[1] / "bench" / "engine_bench.py"


def load_bench():  # type: ignore[no-untyped-def]
    # the bench imports its siblings (run_meta) as a script would, from its own folder
    if str(BENCH.parent) not in sys.path:
        sys.path.insert(0, str(BENCH.parent))
    spec = importlib.util.spec_from_file_location("engine_bench_under_test", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def episode(p99: float, tok_s: float) -> dict[str, float]:
    return {
        "urgent_ttft_p50": p99 / 2,
        "urgent_ttft_p99": p99,
        "urgent_ttft_max": p99,
        "background_ttft_p99": 900.0,
        "total_tok_s": tok_s,
    }


def test_split_compares_first_with_first_and_steady_medians_as_two_over_one_ratios() -> None:
    bench = load_bench()
    split = {
        "one_engine": [episode(400, 3000), episode(200, 3200), episode(220, 3100), episode(1000, 3300)],
        "two_engines": [episode(100, 2400), episode(50, 2500), episode(60, 2600), episode(55, 2700)],
    }
    verdict = bench.split_compare(split)
    assert verdict["urgent_ttft_p99_first"] == {"one_engine": 400, "two_engines": 100, "two_over_one": 0.25}
    # steady: median of episodes 2.. (220 vs 55; 3200 vs 2600)
    assert verdict["urgent_ttft_p99_steady"]["two_over_one"] == 0.25
    assert verdict["total_tok_s_steady"] == {"one_engine": 3200, "two_engines": 2600, "two_over_one": 0.812}
    split["compare"] = verdict
    text = bench.table({"meta": {}, "runs": [], "split": split})
    assert "| two engines | 1 | 50.0 / 100 | 900.0 | 2400 |" in text
    assert '"two_over_one": 0.812' in text


def test_one_episode_has_no_steady_phase_and_missing_setups_no_verdict() -> None:
    bench = load_bench()
    verdict = bench.split_compare({"one_engine": [episode(300, 1000)], "two_engines": [episode(150, 900)]})
    assert set(verdict) == {"urgent_ttft_p99_first", "total_tok_s_first"}
    assert bench.split_compare({"one_engine": [episode(300, 1000)]}) == {}


def test_the_split_routes_urgent_work_as_alert_summaries_and_the_rest_as_root_cause() -> None:
    bench = load_bench()
    assert bench.SPLIT_SCENARIOS == {
        Lane.URGENT: ALERT_SUMMARY,
        Lane.NORMAL: ROOT_CAUSE,
        Lane.BACKGROUND: ROOT_CAUSE,
    }
