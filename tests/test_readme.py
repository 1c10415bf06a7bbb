"""The README stays true: its configuration reference and lane table are the code's own, its
commands are CI's."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from bot.config import reference_markdown
from bot.routing import lane_table_markdown

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
GENERATED: dict[str, Callable[[], str]] = {
    "config-reference": reference_markdown,
    "lane-table": lane_table_markdown,
}
"""README blocks between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` and what writes them."""


def _block(name: str) -> str | None:
    found = re.search(rf"<!-- {name}:start -->\n(.*?)\n<!-- {name}:end -->", README, re.S)
    return found.group(1) if found else None


def test_the_configuration_reference_matches_the_settings() -> None:
    block = _block("config-reference")
    assert block, "README lost its config-reference markers"
    assert block == reference_markdown(), (
        "README's configuration reference is stale: run "
        "`python -c 'import tests.test_readme as t; t.regenerate()'` from the repo root"
    )


def test_the_lane_table_is_the_one_the_router_uses() -> None:
    block = _block("lane-table")
    assert block, "README lost its lane-table markers"
    assert block == lane_table_markdown(), "README's lane table is stale: run tests.test_readme.regenerate()"


def test_ci_runs_the_readmes_test_command() -> None:
    assert "make test" in README and "make run" in README
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test\b", ci, re.M)


def regenerate() -> None:
    """Rewrite the README's generated blocks from the code (a maintenance helper)."""
    text = README
    for name, render in GENERATED.items():
        text = re.sub(
            rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)",
            lambda m, render=render: m.group(1) + render() + "\n" + m.group(2),  # type: ignore[misc]
            text,
            flags=re.S,
        )
    (ROOT / "README.md").write_text(text)
