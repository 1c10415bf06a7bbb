"""What every benchmark result carries (bench/README.md's rule): date, host, GPU, versions and the
exact command. One copy for ``engine_bench.py``, ``batch_bench.py`` and ``quality_bench.py``, with
the GPU queries they share (:func:`gpu_line`, :func:`wait_for_gpu_memory`)."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def run_meta(argv: Sequence[str]) -> dict[str, Any]:
    """``date`` (UTC), ``command`` (``python`` + ``argv``, quoted), ``python``, ``host``, ``gpu``
    (nvidia-smi's name, driver and memory, or the CPU when there is none) and the versions of
    vllm, torch and transformers (:func:`package_versions`)."""
    info: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": "python " + shlex.join(argv),
        "python": platform.python_version(),
        "host": platform.node(),
        "commit": source_commit(Path(__file__).resolve().parent),
    }
    info["gpu"] = gpu_line() or f"no GPU ({os.cpu_count()} CPU cores, {platform.machine()})"
    info.update(package_versions("vllm", "torch", "transformers"))
    return info


# Import names whose distribution is named otherwise (the version is the distribution's).
_DISTRIBUTIONS = {"bot": "opsbot", "slack_sdk": "slack-sdk", "slack_bolt": "slack-bolt"}


def package_versions(*modules: str) -> dict[str, str]:
    """The installed version of each import name's distribution: from package metadata first
    (slack_sdk and slack_bolt keep no ``__version__`` on the package, and nothing is imported), else
    the module's ``__version__`` (a tree unpacked without its dist-info, such as a copied bundle),
    else ``not installed``."""
    versions: dict[str, str] = {}
    for mod in modules:
        try:
            versions[mod] = importlib.metadata.version(_DISTRIBUTIONS.get(mod, mod))
        except importlib.metadata.PackageNotFoundError:
            try:
                versions[mod] = str(__import__(mod).__version__)
            except Exception:  # noqa: BLE001 - report, do not fail the run
                versions[mod] = "not installed"
    return versions


def _nvidia_smi(query: str, csv_format: str = "csv,noheader") -> str:
    """nvidia-smi's answer to ``--query-gpu=query`` ("" without a GPU or nvidia-smi)."""
    try:
        return subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", f"--format={csv_format}"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def gpu_line() -> str:
    """nvidia-smi's name, driver and memory of each GPU ("" without a GPU or nvidia-smi)."""
    return _nvidia_smi("name,driver_version,memory.total")


def wait_for_gpu_memory(fraction: float, timeout_s: float = 180.0) -> bool:
    """Wait until ``fraction`` of GPU 0's memory is free; ``True`` when it is (also without
    nvidia-smi: nothing to wait for). A stopped vLLM engine core process gives its memory back
    seconds after its shutdown returns (seen on the H200: the next engine found 21 GiB free and
    refused to start), so benchmarks that start engines one after another wait here first."""
    deadline = time.monotonic() + timeout_s
    while True:
        line = _nvidia_smi("memory.free,memory.total", "csv,noheader,nounits")
        try:
            free, total = (float(x) for x in line.splitlines()[0].split(","))
        except (ValueError, IndexError):
            return True
        if free >= fraction * total:
            return True
        if time.monotonic() > deadline:
            print(f"GPU memory in use after {timeout_s:.0f} s: {free:.0f} / {total:.0f} MiB free", flush=True)
            return False
        time.sleep(1.0)


def cpu_model() -> str:
    """The processor's model name from /proc/cpuinfo ("unknown" elsewhere): CPU-bound results
    compare only on the same model."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def git_commit(folder: Path) -> str:
    """The short commit of the git checkout holding ``folder`` ("unknown" outside one)."""
    done = subprocess.run(
        ["git", "-C", str(folder), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "unknown"


COMMIT_ENV = "OPSBOT_GIT_COMMIT"
"""Set by the caller where the tree has no .git (the device machine gets a copy of the working
tree): the commit that tree was copied from."""


def source_commit(folder: Path) -> str:
    """The commit the code under ``folder`` is: :data:`COMMIT_ENV` where set, else git's short
    HEAD, with ``+dirty`` when tracked files differ from it (the numbers are then of code no
    commit holds)."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    commit = git_commit(folder)
    if commit == "unknown":
        return commit
    dirty = subprocess.run(
        ["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return commit + ("+dirty" if dirty else "")


def write_results(stem: Path, payload: dict[str, Any], lines: Sequence[str]) -> None:
    """``stem``.json (``payload``) and ``stem``.md (``lines``): one result, machine- and
    human-readable."""
    stem.with_suffix(".json").write_text(json.dumps(payload, indent=2) + "\n")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
