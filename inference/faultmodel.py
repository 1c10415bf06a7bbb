"""A test model that fails on command: the explicit fault-injection seam of the engine tests.

``build_fault_model(tiny, dest)`` copies the offline tiny test model (:mod:`inference.testmodel`)
and adds its own modeling code (``modeling_faulty.py``, loaded by transformers through
``auto_map`` with ``engine.trust_remote_code = true``): a ``LlamaForCausalLM`` whose forward pass
looks for a trigger file in the model folder on every call:

- ``crash``: the next forward raises ``RuntimeError`` (as a torch kernel failure or an out-of-memory
  does) and removes the file (one-shot: a restarted engine loads and runs again);
- ``hang``: forward blocks, producing no token, until the file is removed (as a stuck kernel or a
  deadlocked collective does);
- ``slow``: every decoder layer takes the seconds the file holds (default 0.25) while it exists: a
  forward pass that computes, layer by layer, but slowly (a CPU-starved prefill).

Nothing in opsbot's code is patched: the engine, its worker threads and the pipeline meet a model
that really fails, at the moment the test creates the file (:func:`trigger`). Only tests use this;
no production path imports it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Literal

Fault = Literal["crash", "hang", "slow"]

MODELING = '''"""The faulty test model of opsbot's inference.faultmodel: a Llama that fails on command."""

import os
import time

from transformers import LlamaForCausalLM

_HERE = os.path.dirname(os.path.abspath(__file__))


class FaultyLlamaForCausalLM(LlamaForCausalLM):
    """``LlamaForCausalLM``; raises once for ``<folder>/crash``, blocks while ``<folder>/hang`` exists.

    The check is a forward pre-hook, so ``forward`` keeps Llama's own signature.
    """

    def __init__(self, config):
        super().__init__(config)
        self.register_forward_pre_hook(_check_faults)
        folder = getattr(config, "fault_dir", None) or _HERE
        for layer in self.model.layers:
            layer.register_forward_pre_hook(lambda module, args: _slow_layer(folder))


def _check_faults(module, args):
    folder = getattr(module.config, "fault_dir", None) or _HERE
    crash = os.path.join(folder, "crash")
    if os.path.exists(crash):
        # One-shot, as a transient kernel failure is: the restarted engine loads and runs again.
        try:
            os.remove(crash)
        except FileNotFoundError:
            pass
        raise RuntimeError("faulty test model: forward failed (crash trigger)")
    while os.path.exists(os.path.join(folder, "hang")):
        time.sleep(0.05)
    return None


def _slow_layer(folder):
    try:
        with open(os.path.join(folder, "slow")) as fh:
            seconds = float(fh.read().strip() or 0.25)
    except (FileNotFoundError, ValueError):
        return None
    time.sleep(seconds)
    return None
'''


def build_fault_model(tiny: Path, dest: Path) -> Path:
    """Copy the tiny test model at ``tiny`` to ``dest`` with the faulty modeling code; returns ``dest``.

    Load it with ``engine.trust_remote_code = true``. The trigger files go in ``dest``
    (:func:`trigger`, :func:`clear`); the model's config names that folder (``fault_dir``), since
    transformers runs remote code from a cache folder of its own.
    """
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(tiny, dest)
    (dest / "modeling_faulty.py").write_text(MODELING)
    config_path = dest / "config.json"
    config = json.loads(config_path.read_text())
    config["architectures"] = ["FaultyLlamaForCausalLM"]
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_faulty.FaultyLlamaForCausalLM"}
    config["fault_dir"] = str(dest.resolve())
    config_path.write_text(json.dumps(config, indent=2))
    return dest


def trigger(model_dir: Path, fault: Fault, layer_s: float = 0.25) -> None:
    """The next forward pass of the model in ``model_dir`` crashes, or every one hangs until
    :func:`clear`, or (``slow``) every decoder layer takes ``layer_s`` until :func:`clear`."""
    (Path(model_dir) / fault).write_text(str(layer_s) if fault == "slow" else fault)


def clear(model_dir: Path, fault: Fault | None = None) -> None:
    """Remove one trigger (``None``: all): forward passes work again (a hung one resumes)."""
    for name in (fault,) if fault else ("crash", "hang", "slow"):
        (Path(model_dir) / name).unlink(missing_ok=True)
