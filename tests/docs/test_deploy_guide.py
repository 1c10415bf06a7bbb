"""docs/deploy.md and deploy/README.md point at files that exist and say what the Dockerfiles say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDES = [ROOT / "docs" / "deploy.md", ROOT / "deploy" / "README.md"]


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_deploy_path_the_guide_names_exists(guide: Path) -> None:
    text = guide.read_text()
    named = set(re.findall(r"(?<![\w/])deploy/[\w./-]*[\w/]", text))
    named |= {
        "deploy/" + p for p in re.findall(r"`((?:base|components|overlays|monitoring)/[\w./-]*)`", text)
    }
    assert len(named) >= 5
    for path in named:
        if path.endswith("secrets.env"):  # made by the reader, from the example beside it
            path += ".example"
        assert (ROOT / path).exists(), f"{guide.name} names {path}, which does not exist"


def test_every_overlay_the_guide_applies_exists_and_every_overlay_is_described() -> None:
    text = (ROOT / "docs" / "deploy.md").read_text()
    applied = set(re.findall(r"kubectl apply -k deploy/overlays/([\w-]+)", text))
    overlays = {p.name for p in (ROOT / "deploy" / "overlays").iterdir() if p.is_dir()}
    assert applied and applied <= overlays
    for overlay in overlays:
        assert f"    {overlay}/" in text, f"docs/deploy.md does not describe overlay {overlay}"


def test_the_driver_requirement_is_the_one_dockerfile_gpu_states() -> None:
    dockerfile = (ROOT / "Dockerfile.gpu").read_text()
    (driver,) = re.findall(r"needs NVIDIA driver (\d+) or newer", dockerfile)
    (cuda,) = re.findall(r"with CUDA (\d+\.\d+), so", dockerfile)
    guide = (ROOT / "docs" / "deploy.md").read_text()
    assert f"**driver {driver} or newer**" in guide and f"CUDA {cuda}" in guide
