"""The README stays true: its configuration reference is the settings' own, its commands are CI's."""

from __future__ import annotations

import re
from pathlib import Path

from bot.config import reference_markdown

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_configuration_reference_matches_the_settings() -> None:
    block = re.search(r"<!-- config-reference:start -->\n(.*?)\n<!-- config-reference:end -->", README, re.S)
    assert block, "README lost its config-reference markers"
    assert block.group(1) == reference_markdown(), (
        "README's configuration reference is stale: run "
        "`python -c 'import tests.test_readme as t; t.regenerate()'` from the repo root"
    )


def test_ci_runs_the_readmes_test_command() -> None:
    assert "make test" in README and "make run" in README
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test\b", ci, re.M)


def regenerate() -> None:
    """Rewrite the README's reference block from ``bot.config`` (a maintenance helper)."""
    text = re.sub(
        r"(<!-- config-reference:start -->\n).*?(<!-- config-reference:end -->)",
        lambda m: m.group(1) + reference_markdown() + "\n" + m.group(2),
        README,
        flags=re.S,
    )
    (ROOT / "README.md").write_text(text)
