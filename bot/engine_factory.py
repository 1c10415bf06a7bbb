"""From ``Settings`` to a running engine: pick the backend, find or build the model, add admission.

``inference/`` knows nothing of ``bot.config``; the ``[engine]`` and ``[admission]`` sections are
``inference.config``'s own models, handed to the engines as they are.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from bot import metrics
from bot.config import Settings
from inference.admission import AdmittedEngine
from inference.engine import Engine, Lane

logger = logging.getLogger(__name__)

RANDOM_MODEL_WARNING = (
    "no model configured: using the tiny offline test model at %s. Its weights are random, so "
    "answers are gibberish until you set engine.model (OPSBOT_ENGINE__MODEL) to a real chat model"
)


def default_model_dir(settings: Settings) -> Path:
    """Where the generated tiny test model lives when no model is configured."""
    return settings.data_dir / "models" / "tiny-test"


def resolve_model(settings: Settings, progress: Callable[[str], None] | None = None) -> str:
    """The configured model, or the tiny offline test model (built on first use)."""
    if settings.engine.model:
        return settings.engine.model
    if settings.engine.backend == "openai":
        # The server has the model; its name may be served_model_name alone (checked at start).
        return settings.engine.served_model_name or ""
    from inference.testmodel import build_test_model, is_test_model

    path = default_model_dir(settings)
    if not is_test_model(path, "tiny"):
        (progress or logger.info)(f"building the tiny offline test model in {path} (first start only) ...")
        build_test_model(path, "tiny", progress=progress)
    logger.warning(RANDOM_MODEL_WARNING, path)
    return str(path)


def pick_backend(settings: Settings) -> str:
    """The configured backend; ``auto`` is vLLM when it is installed and a CUDA GPU is visible, else cpu."""
    if settings.engine.backend != "auto":
        return settings.engine.backend
    if importlib.util.find_spec("vllm") is None:
        return "cpu"
    import torch

    return "vllm" if torch.cuda.is_available() else "cpu"


def _export_queues(queued: Mapping[Lane, int], in_flight: Mapping[Lane, int]) -> None:
    for lane in Lane:
        metrics.LANE_QUEUE_DEPTH.labels(lane.value).set(queued.get(lane, 0))
        metrics.LANE_IN_FLIGHT.labels(lane.value).set(in_flight.get(lane, 0))


def _engine_died(reason: str) -> None:
    metrics.ENGINE_READY.set(0)
    logger.error("engine died: %s", reason)


def build_engine(settings: Settings, model: str, *, on_fatal: Callable[[str], None] | None = None) -> Engine:
    """The configured engine for ``model``, behind lane admission control (not yet started).

    ``on_fatal(reason)`` is called when the engine died and will not be restarted
    (``engine.on_dead = "exit"`` or no restart left): the caller should shut down non-zero.
    """
    config = settings.engine.model_copy(update={"model": model})
    backend = pick_backend(settings)
    inner: Engine
    if backend == "vllm":
        from inference.vllm_engine import VllmEngine

        inner = VllmEngine(config, on_dead=_engine_died, on_fatal=on_fatal)
    elif backend == "openai":
        from inference.openai_engine import OpenAIEngine

        inner = OpenAIEngine(config)
    else:
        from inference.cpu_engine import CpuEngine

        inner = CpuEngine(config, on_dead=_engine_died, on_fatal=on_fatal)
    logger.info("engine backend: %s", backend)
    return AdmittedEngine(
        inner,
        settings.admission,
        request_timeout_s=config.request_timeout_s,
        stall_timeout_s=config.stall_timeout_s,
        on_queue_change=_export_queues,
    )
