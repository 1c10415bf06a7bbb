"""README and docs/ stay true: the configuration reference and the lane table are the code's own,
every module is in README's table, the commands are CI's, and the front door stays short."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from bot.config import reference_markdown
from bot.routing import lane_table_markdown

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GENERATED: dict[str, tuple[Path, Callable[[], str]]] = {
    "config-reference": (ROOT / "docs" / "configuration.md", reference_markdown),
    "lane-table": (ROOT / "docs" / "scenarios.md", lane_table_markdown),
}
"""Blocks between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``: the file each lives in and what
writes it."""
README_MAX_LINES = 350
"""README is the front door: what opsbot is, the two commands, the layers; the rest is in docs/."""


def _block(name: str, text: str) -> str | None:
    found = re.search(rf"<!-- {name}:start -->\n(.*?)\n<!-- {name}:end -->", text, re.S)
    return found.group(1) if found else None


def test_the_configuration_reference_matches_the_settings() -> None:
    path, render = GENERATED["config-reference"]
    block = _block("config-reference", path.read_text())
    assert block, f"{path.name} lost its config-reference markers"
    assert block == render(), (
        f"{path.relative_to(ROOT)}'s configuration reference is stale: run "
        "`python -c 'import tests.test_readme as t; t.regenerate()'` from the repo root"
    )


def test_the_lane_table_is_the_one_the_router_uses() -> None:
    path, render = GENERATED["lane-table"]
    block = _block("lane-table", path.read_text())
    assert block, f"{path.name} lost its lane-table markers"
    assert block == render(), (
        f"{path.relative_to(ROOT)}'s lane table is stale: run tests.test_readme.regenerate()"
    )


def top_level_modules() -> list[str]:
    """Every module and package directly under ``bot/`` and ``inference/``, as README names them
    (``bot/pipeline.py``, ``bot/context/``)."""
    found = []
    for package in ("bot", "inference"):
        for path in sorted((ROOT / package).iterdir()):
            if path.suffix == ".py" and path.name != "__init__.py":
                found.append(f"{package}/{path.name}")
            elif path.is_dir() and (path / "__init__.py").exists():
                found.append(f"{package}/{path.name}/")
    return found


def test_every_module_is_in_the_readmes_table() -> None:
    table = _block("module-table", README.read_text())
    assert table, "README lost its module-table markers"
    missing = [name for name in top_level_modules() if f"`{name}`" not in table]
    assert not missing, f"README's module table does not name {missing}: add a row (or a name to a row)"


def test_the_readme_is_a_front_door() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, "README grew past its size: move detail into docs/"
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).exists(), f"README links to {link}, which does not exist"


def test_ci_runs_the_readmes_test_command() -> None:
    text = README.read_text()
    assert "make test" in text and "make run" in text
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test\b", ci, re.M)


def regenerate() -> None:
    """Rewrite the generated blocks in docs/ from the code (a maintenance helper)."""
    for name, (path, render) in GENERATED.items():
        text = re.sub(
            rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)",
            lambda m, render=render: m.group(1) + render() + "\n" + m.group(2),  # type: ignore[misc]
            path.read_text(),
            flags=re.S,
        )
        path.write_text(text)
