"""GPU tests: vLLM on a real CUDA GPU (the lent H200). Skipped cleanly where CUDA or vLLM is missing.

Every test here is marked ``gpu`` and gets a long timeout (a first vLLM start compiles for
minutes). vLLM and torch emit deprecation and user warnings of their own that the project-wide
``filterwarnings = error`` would turn into failures; those categories are ignored here only.
Model folders come from ``inference.testmodel`` (tiny random Llama, 8B-shaped config for
``load_format="dummy"``), cached under ``.pytest_cache/opsbot-models``.
"""

from __future__ import annotations

import gc
import importlib.util
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

_IGNORED_WARNINGS = (
    "ignore::DeprecationWarning",
    "ignore::PendingDeprecationWarning",
    "ignore::FutureWarning",
    "ignore::UserWarning",
    "ignore::ResourceWarning",
    "ignore::RuntimeWarning",
    "ignore::pytest.PytestUnraisableExceptionWarning",
    "ignore::pytest.PytestUnhandledThreadExceptionWarning",
)


def _gpu_reason() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed"
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    gpu_items = [item for item in items if here in Path(str(item.fspath)).parents]
    if not gpu_items:
        return
    reason = _gpu_reason()
    for item in gpu_items:
        item.add_marker(pytest.mark.gpu)
        item.add_marker(pytest.mark.timeout(900))
        for spec in _IGNORED_WARNINGS:
            item.add_marker(pytest.mark.filterwarnings(spec))
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"GPU test: {reason}"))


def pytest_configure(config: pytest.Config) -> None:
    # vLLM's engine client leaves ZeroMQ sockets for the garbage collector after AsyncLLM.shutdown();
    # their ResourceWarning fires at pytest's final teardown, outside any test, and made
    # `pytest -m gpu` exit 1 with every test passed. Only that warning is ignored, session-wide.
    config.addinivalue_line("filterwarnings", "ignore:Unclosed (socket|context) <zmq:ResourceWarning")
    config.addinivalue_line(
        "filterwarnings", "ignore:Exception ignored in.*zmq:pytest.PytestUnraisableExceptionWarning"
    )


@pytest.fixture(scope="session", autouse=True)
def _collect_engine_garbage() -> Iterator[None]:
    """Collect what stopped engines left behind while the GPU tests' warning filters still apply."""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def _model_cache(request: pytest.FixtureRequest) -> Path:
    cache = Path(request.config.rootpath) / ".pytest_cache" / "opsbot-models"
    cache.mkdir(parents=True, exist_ok=True)
    return cache


@pytest.fixture(scope="session")
def model_8b(request: pytest.FixtureRequest) -> Path:
    """Folder with the 8B-shaped config and tokenizer (vLLM ``load_format="dummy"``)."""
    from inference.testmodel import TEST_MODEL_VERSION, build_test_model

    return build_test_model(_model_cache(request) / f"8b-v{TEST_MODEL_VERSION}", "8b")


@pytest.fixture(scope="session")
def tiny_model(request: pytest.FixtureRequest) -> Path:
    """The tiny test model (as the root conftest's fixture; the GPU run loads only this conftest)."""
    from inference.testmodel import TEST_MODEL_VERSION, build_test_model

    return build_test_model(_model_cache(request) / f"tiny-v{TEST_MODEL_VERSION}", "tiny")
