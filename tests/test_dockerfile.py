"""The images' contract, read from the Dockerfiles (CI has no container runtime; docs/deploy.md says
how and where the CPU image was built)."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

from bot.config import load_settings
from bot.default_model import GGUF_NAME, default_gguf_path

ROOT = Path(__file__).resolve().parents[1]
CPU = ROOT / "Dockerfile"
GPU = ROOT / "Dockerfile.gpu"
IMAGES = pytest.mark.parametrize("dockerfile", [CPU, GPU], ids=["cpu", "gpu"])


def instructions(text: str, name: str) -> list[str]:
    """The arguments of every ``name`` instruction, continuation lines joined, comments dropped."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [line.split(None, 1)[1] for line in joined.splitlines() if line.upper().startswith(name + " ")]


def final_env(text: str) -> dict[str, str]:
    """ENV of the last stage (the image that runs), ``KEY=value`` pairs."""
    last = text.split("\nFROM ")[-1]
    return dict(re.findall(r"([A-Z_][A-Z0-9_]*)=(\S+)", " ".join(instructions("FROM " + last, "ENV"))))


@IMAGES
def test_is_multi_stage_and_the_runtime_takes_only_the_venv(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    stages = instructions(text, "FROM")
    assert len(stages) == 2 and stages[0].endswith(" AS build")
    runtime = "FROM " + text.split("\nFROM ")[-1]
    copies = instructions(runtime, "COPY")
    assert copies and all(c.startswith("--from=build ") for c in copies), "runtime copies from the build only"
    assert "build-essential" not in runtime and "cmake" not in runtime


@IMAGES
def test_runs_as_a_non_root_user(dockerfile: Path) -> None:
    users = instructions(dockerfile.read_text(), "USER")
    assert users and users[-1].strip() not in ("root", "0")


@IMAGES
def test_exposes_the_http_port_it_configures(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    (port,) = instructions(text, "EXPOSE")
    assert final_env(text)["OPSBOT_HTTP__PORT"] == port.strip()


@IMAGES
def test_healthcheck_probes_healthz_on_that_port(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    (check,) = instructions(text, "HEALTHCHECK")
    assert f"127.0.0.1:{final_env(text)['OPSBOT_HTTP__PORT']}/healthz" in check


@IMAGES
def test_the_environment_is_one_opsbot_understands(dockerfile: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    envs = {k: v for k, v in final_env(dockerfile.read_text()).items() if k.startswith("OPSBOT_")}
    assert {"OPSBOT_ENGINE__MODEL", "OPSBOT_ENGINE__BACKEND", "OPSBOT_STORE__URL"} <= set(envs)
    monkeypatch.delenv("OPSBOT_CONFIG", raising=False)
    for key, value in envs.items():
        monkeypatch.setenv(key, value)
    settings = load_settings()
    assert settings.engine.model == envs["OPSBOT_ENGINE__MODEL"]
    assert settings.store_url == envs["OPSBOT_STORE__URL"]
    # the SQLite file lives on the one directory the unprivileged user owns
    assert settings.store_url.endswith(":////data/opsbot.db") and str(settings.data_dir) == "/data"


@IMAGES
def test_entrypoint_runs_the_bot(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    assert instructions(text, "ENTRYPOINT") == ['["opsbot"]']
    assert instructions(text, "CMD") == ['["run"]']


def test_the_cpu_image_carries_the_default_model_where_its_environment_points() -> None:
    text = CPU.read_text()
    env = final_env(text)
    assert env["OPSBOT_ENGINE__BACKEND"] == "llamacpp"
    assert any(".[llamacpp]" in run for run in instructions(text, "RUN"))
    # built into /opt/opsbot-data by ensure_default_gguf, copied to /opt/models in the runtime stage
    built = default_gguf_path(Path("/opt/opsbot-data"))
    assert "ensure_default_gguf(Path('/opt/opsbot-data'))" in text
    assert "COPY --from=build /opt/opsbot-data/models /opt/models" in text
    assert env["OPSBOT_ENGINE__MODEL"] == "/opt/models/" + str(built.relative_to("/opt/opsbot-data/models"))
    assert env["OPSBOT_ENGINE__MODEL"].endswith(GGUF_NAME)
    # a portable llama.cpp build: one compiled for the build machine's CPU dies on older nodes
    assert "-DGGML_NATIVE=OFF" in text


def test_the_gpu_image_installs_vllm_and_states_the_driver_it_needs() -> None:
    text = GPU.read_text()
    assert any(".[vllm]" in run for run in instructions(text, "RUN"))
    assert final_env(text)["OPSBOT_ENGINE__BACKEND"] == "vllm"
    (base,) = re.findall(r"ARG BASE_IMAGE=nvidia/cuda:(\d+\.\d+)\.\d+-", text)
    stated = re.search(r"with CUDA (\d+\.\d+), so the node\s+#?\s*needs NVIDIA driver (\d+) or newer", text)
    assert stated, "Dockerfile.gpu must say which CUDA and which driver the host needs"
    assert stated.group(1) == base, "the stated CUDA version is not the base image's"
    assert "HF_HOME=/models" in " ".join(instructions(text, "ENV"))


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule, simplified to what .dockerignore uses here: the last matching pattern wins."""
    verdict = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        bare = pattern.lstrip("!").rstrip("/")
        candidates = [bare, bare.replace("**/", "")]
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(p, c) for p in prefixes for c in candidates) or any(
            fnmatch.fnmatch(parts[-1], c) for c in candidates if "/" not in c
        ):
            verdict = not negate
    return verdict


def test_dockerignore_keeps_what_the_images_copy_and_drops_local_state() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = {
        word
        for dockerfile in (CPU, GPU)
        for copy in instructions(dockerfile.read_text(), "COPY")
        if not copy.startswith("--from")
        for word in copy.split()[:-1]
    }
    assert sources >= {"pyproject.toml", "README.md", "bot", "inference", "migrations"}
    for source in sources:
        assert not _ignored(source, patterns), f".dockerignore drops {source}, which a Dockerfile copies"
    for local in (".venv/bin/python", ".git/config", "opsbot.toml", "bot/opsbot.db", "tests/test_x.py",
                  "deploy/overlays/slack/secrets.env", "bot/__pycache__/x.pyc"):  # fmt: skip
        assert _ignored(local, patterns), f".dockerignore lets {local} into the build context"
