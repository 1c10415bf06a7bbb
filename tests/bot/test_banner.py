"""The chat start banner: the model (a toy or not), each source and its health check."""

from __future__ import annotations

import socket
from pathlib import Path

from bot.banner import check_sources, model_line, model_size_b, sources_line
from bot.config import Settings
from bot.context.gatherer import ContextGatherer
from bot.eval.demo import find_case
from bot.eval.runner import served_settings


def test_the_model_name_says_whether_it_is_a_toy() -> None:
    assert model_size_b("/data/models/SmolLM2-135M-Instruct.Q4_1.gguf") == 0.135
    assert model_size_b("meta-llama/Llama-3.1-8B-Instruct") == 8.0
    assert model_size_b("Qwen2.5-0.5B-Instruct") == 0.5
    assert model_size_b("my-finetune") is None
    toy = model_line("/data/SmolLM2-135M-Instruct.Q4_1.gguf", "llamacpp")
    assert "135M-parameter toy" in toy and "engine.model" in toy
    assert "toy" not in model_line("meta-llama/Llama-3.1-8B-Instruct", "vllm")
    assert "random weights" in model_line("/data/tiny-test", "cpu", random_weights=True)


def test_no_source_on_says_so_and_points_at_the_demo() -> None:
    line = sources_line([])
    assert "none on" in line and "opsbot chat --demo" in line
    assert "--demo" not in sources_line([], demo=True)


async def test_each_source_answers_its_health_check_or_says_why_not(tmp_path: Path) -> None:
    case = find_case("oom-worker")
    kube, prom = case.kubernetes_server(), case.prometheus_server()
    assert kube is not None and prom is not None
    await kube.start()
    await prom.start()
    try:
        gatherer = ContextGatherer.from_settings(
            served_settings(Settings(data_dir=tmp_path), kube, prom, tmp_path / "c")
        )
        checks = await check_sources(gatherer.providers)
        await gatherer.close()
    finally:
        await prom.stop()
        await kube.stop()
    assert [(c.name, c.problem) for c in checks] == [("Kubernetes", None), ("Prometheus", None)]
    assert "GET /version/" in kube.requests
    # A Prometheus nobody serves: its line says why, in one line.
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    settings = Settings(data_dir=tmp_path, prometheus={"enabled": True, "url": f"http://127.0.0.1:{port}"})
    gatherer = ContextGatherer.from_settings(settings)
    (check,) = await check_sources(gatherer.providers)
    await gatherer.close()
    assert check.problem is not None and f"cannot reach http://127.0.0.1:{port}/-/ready" in check.problem
    assert check.line.startswith("Prometheus ✗ cannot reach") and "\n" not in check.line
