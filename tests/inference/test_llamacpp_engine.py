"""What only the llama.cpp engine does: GGUF file / folder resolution, its quantization and slots,
and agreement with the transformers CPU engine on the same GGUF (same prompt ids, same greedy start).
The shared engine contract is ``test_engine_contract.py``."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path

import pytest

from inference.config import EngineConfig
from inference.cpu_engine import CpuEngine
from inference.engine import (
    ChatMessage,
    EngineStartupError,
    GenerationRequest,
    GenerationResult,
    Lane,
    SamplingSettings,
)
from inference.gguf import find_gguf, is_gguf_ref

if os.environ.get("CI") != "true":
    pytest.importorskip("llama_cpp")

from inference.llamacpp_engine import LlamaCppEngine, cpu_has_amx, use_extra_buffers  # noqa: E402

QUESTION = [
    ChatMessage("system", "You are opsbot, an incident assistant for Kubernetes clusters."),
    ChatMessage("user", "Why is checkout-api crashlooping?"),
]


def greedy(request_id: str, max_tokens: int) -> GenerationRequest:
    return GenerationRequest(
        request_id,
        "chat",
        Lane.NORMAL,
        SamplingSettings(temperature=0.0, max_tokens=max_tokens),
        messages=QUESTION,
    )


async def answer(engine: CpuEngine, request: GenerationRequest) -> GenerationResult:
    async for event in engine.generate(request):
        if isinstance(event, GenerationResult):
            return event
    raise AssertionError("no result")


def test_a_gguf_is_named_by_its_file_or_by_a_folder_holding_one(tmp_path: Path, smollm2_gguf: Path) -> None:
    folder = tmp_path / "one"
    folder.mkdir()
    os.symlink(smollm2_gguf, folder / smollm2_gguf.name)
    assert is_gguf_ref(str(smollm2_gguf)) and is_gguf_ref(str(folder))
    assert find_gguf(str(folder)) == smollm2_gguf.resolve()
    assert find_gguf(str(folder), smollm2_gguf.name) == smollm2_gguf.resolve()
    (tmp_path / "transformers").mkdir()
    (tmp_path / "transformers" / "config.json").write_text("{}")
    assert not is_gguf_ref(str(tmp_path / "transformers"))


def test_gguf_mistakes_are_startup_errors_that_name_the_fix(tmp_path: Path, smollm2_gguf: Path) -> None:
    several = tmp_path / "several"
    several.mkdir()
    for name in ("a.Q4_K_M.gguf", "a.Q8_0.gguf"):
        os.symlink(smollm2_gguf, several / name)
    with pytest.raises(EngineStartupError, match=r"several GGUF files .*engine\.gguf_file"):
        find_gguf(str(several))
    with pytest.raises(EngineStartupError, match=r"a\.Q4_K_M\.gguf, a\.Q8_0\.gguf"):
        find_gguf(str(several), "a.Q2_K.gguf")
    with pytest.raises(EngineStartupError, match="does not exist"):
        find_gguf(str(tmp_path / "missing.gguf"))
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(EngineStartupError, match="not a GGUF file"):
        find_gguf(str(tmp_path / "weights.bin"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(EngineStartupError, match="holds no .gguf"):
        find_gguf(str(tmp_path / "empty"))


async def test_a_truncated_gguf_is_a_startup_error_and_health_says_why(
    tmp_path: Path, smollm2_gguf: Path
) -> None:
    broken = tmp_path / "broken.gguf"
    with smollm2_gguf.open("rb") as src:
        broken.write_bytes(src.read(1 << 20))
    engine = LlamaCppEngine(EngineConfig(model=str(broken), cpu_max_concurrency=1))
    with pytest.raises(EngineStartupError, match="llama.cpp cannot load"):
        await engine.start()
    assert not engine.health().ready and "failed to start" in engine.health().reason


async def test_stats_name_the_files_quantization_and_the_ready_engine_reports_its_slots(
    smollm2_gguf: Path,
) -> None:
    folder_copy = smollm2_gguf.parent
    engine = LlamaCppEngine(EngineConfig(model=str(folder_copy), cpu_max_concurrency=2, cpu_threads=1))
    await engine.start(QUESTION[:1])
    try:
        stats = engine.stats()
        assert stats.backend == "llamacpp" and stats.quantization == "Q8_0"  # the default model as kept
        assert stats.prefix_cache_hit_rate is None  # no request yet
        assert engine.gguf_path == smollm2_gguf.resolve() and len(engine._slots) == 2
    finally:
        await engine.shutdown()


@pytest.mark.slow
async def test_the_cpu_engine_loads_the_same_gguf_renders_the_same_ids_and_starts_the_same_greedy_answer(
    smollm2_gguf: Path, tmp_path: Path
) -> None:
    llama = LlamaCppEngine(EngineConfig(model=str(smollm2_gguf), cpu_max_concurrency=1, cpu_threads=1))
    await llama.start()
    try:
        ids = llama.tokenizer.render(QUESTION)
        from_llama = await answer(llama, greedy("l-1", 12))
    finally:
        await llama.shutdown()
    # A folder holding only the GGUF, as a user would point engine.model at it.
    folder = tmp_path / "smollm2"
    folder.mkdir()
    shutil.copyfile(smollm2_gguf, folder / smollm2_gguf.name)
    cpu = CpuEngine(EngineConfig(model=str(folder), cpu_max_concurrency=1, cpu_threads=1))
    await cpu.start()
    try:
        assert cpu.tokenizer.render(QUESTION) == ids
        from_cpu = await answer(cpu, greedy("c-1", 12))
    finally:
        await cpu.shutdown()
    # Q4_1 dequantized to float32 (transformers) and Q4_1 x Q8 kernels (llama.cpp) round differently,
    # so only the start of a greedy answer must agree.
    assert from_cpu.text.split()[:5] == from_llama.text.split()[:5]
    assert from_cpu.prompt_tokens == from_llama.prompt_tokens == len(ids)


async def test_a_dead_engine_restarts_and_answers_again(smollm2_gguf: Path) -> None:
    """``engine.on_dead = "restart"`` on llama.cpp: declared dead (what the watchdog does to a hung
    engine), it loads its slots again and the next request is answered. Its loading loop once took
    the restart for a shutdown and gave up after the first slot (eval under load, 2026-12-06)."""
    config = EngineConfig(
        model=str(smollm2_gguf), cpu_max_concurrency=2, cpu_threads=1, on_dead="restart", max_restarts=1
    )
    engine = LlamaCppEngine(config)
    await engine.start()
    try:
        engine.declare_dead("hung: no token for 60 s")
        assert not engine.health().ready
        for _ in range(600):
            if engine.health().ready:
                break
            await asyncio.sleep(0.1)
        assert engine.health().ready, engine.health()
        assert (await answer(engine, greedy("after-restart", 4))).output_tokens > 0
    finally:
        await engine.shutdown()


async def test_an_abort_stops_a_long_prompt_evaluation_and_the_slot_serves_the_next_request(
    smollm2_gguf: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import asyncio
    import logging

    from inference.engine import RequestAbortedError, TextDelta

    caplog.set_level(logging.INFO, logger="inference")
    engine = LlamaCppEngine(EngineConfig(model=str(smollm2_gguf), cpu_max_concurrency=1, cpu_threads=1))
    await engine.start(QUESTION[:1])
    try:
        # ~3000 prompt tokens: seconds of prefill on one thread, which the abort cuts short.
        long = [QUESTION[0], ChatMessage("user", "pod restarted with exit code 137. " * 300)]
        request = GenerationRequest(
            "long-1", "chat", Lane.NORMAL, SamplingSettings(max_tokens=8), messages=long
        )
        stream = engine.generate(request)
        first = asyncio.create_task(anext(stream))
        while engine.stats().running != 1:
            await asyncio.sleep(0.01)
        await engine.abort("long-1")
        with pytest.raises(RequestAbortedError):
            event = await first
            assert not isinstance(event, TextDelta), "the prompt was evaluated before the abort"
        while "long-1 stopped after 0 tokens, during its prompt" not in caplog.text:
            await asyncio.sleep(0.01)
        # The same (only) slot answers the next request in full.
        after = await answer(engine, greedy("after-1", 6))
        assert after.output_tokens == 6 and after.text
    finally:
        await engine.shutdown()


async def test_a_prompt_evaluation_longer_than_the_stall_timeout_is_not_taken_for_a_hang(
    smollm2_gguf: Path,
) -> None:
    """The watchdog (``engine.stall_timeout_s``) reads llama.cpp's computing, not only its tokens: a
    ~3,000-token prompt on one thread gives no token for seconds, far past a 0.3 s stall timeout,
    and is answered; the old watchdog declared such a CPU-starved prefill hung (a fresh clone's first
    demo answer was lost that way on a busy 2-core machine, 2026-12-06)."""
    from inference.admission import AdmittedEngine

    inner = LlamaCppEngine(EngineConfig(model=str(smollm2_gguf), cpu_max_concurrency=1, cpu_threads=1))
    engine = AdmittedEngine(inner, stall_timeout_s=0.3)
    await engine.start(QUESTION[:1])
    try:
        long = [QUESTION[0], ChatMessage("user", "pod restarted with exit code 137. " * 300)]
        request = GenerationRequest(
            "long-1", "chat", Lane.NORMAL, SamplingSettings(max_tokens=4), messages=long
        )
        result = None
        async for event in engine.generate(request):
            if isinstance(event, GenerationResult):
                result = event
        assert result is not None and result.output_tokens > 0
        assert result.ttft_ms is not None and result.ttft_ms > 1000  # the prefill did outlast the timeout
        assert engine.stalls == 0 and engine.health().ready
    finally:
        await engine.shutdown()


async def test_a_shutdown_right_after_the_watchdog_fires_mid_prompt_frees_nothing_still_in_use(
    smollm2_gguf: Path,
) -> None:
    """The watchdog declares the engine dead while a slot evaluates a long prompt (here an engine
    that shows only its tokens, so the prefill outlasts a 0.3 s stall timeout); the engine restarts
    and the bot shuts down at once. The shutdown must wait for the aborted decode and the restart's
    loading before it frees any context: it freed the old slots under the still-running decode, a
    segfault of the whole process (2026-12-06)."""
    from inference.admission import AdmittedEngine
    from inference.engine import EngineDeadError, WrappedEngine

    class TokensOnly(WrappedEngine):
        def computing_at(self) -> float | None:
            return None

    fatal: list[str] = []
    config = EngineConfig(
        model=str(smollm2_gguf), cpu_max_concurrency=1, cpu_threads=1, on_dead="restart", max_restarts=1
    )
    inner = LlamaCppEngine(config, on_fatal=fatal.append)
    engine = AdmittedEngine(TokensOnly(inner), stall_timeout_s=0.3)
    await engine.start(QUESTION[:1])
    long = [QUESTION[0], ChatMessage("user", "pod restarted with exit code 137. " * 300)]
    request = GenerationRequest("long", "chat", Lane.NORMAL, SamplingSettings(max_tokens=8), messages=long)
    try:
        with pytest.raises(EngineDeadError, match="hung"):
            async for _ in engine.generate(request):
                pass
    finally:
        await engine.shutdown()
    assert engine.stalls == 1 and not inner.health().ready
    assert "shut down" in (inner.health().reason or "")
    assert fatal == []  # a restart stopped by the shutdown is no failure


async def test_what_the_process_prints_while_llama_cpp_loads_a_model_is_not_lost(
    smollm2_gguf: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """llama-cpp-python pointed stdout and stderr at /dev/null for the whole process while it loaded
    a model: a restart loads in the background, and ``opsbot chat``'s "the model engine is down"
    note printed meanwhile never reached the screen (2026-12-06). Every line printed on the event
    loop while two slots load arrives."""
    engine = LlamaCppEngine(EngineConfig(model=str(smollm2_gguf), cpu_max_concurrency=2, cpu_threads=1))
    loading = asyncio.create_task(engine.start())
    printed = 0
    try:
        while not loading.done():
            print(f"still here {printed}", flush=True)
            print(f"still here on stderr {printed}", file=sys.stderr, flush=True)
            printed += 1
            await asyncio.sleep(0.002)
        await loading
    finally:
        await engine.shutdown()
    captured = capfd.readouterr()
    assert printed > 20  # the load took a while
    assert [f"still here {i}" for i in range(printed)] == [
        line for line in captured.out.splitlines() if line.startswith("still here")
    ]
    assert sum(line.startswith("still here on stderr") for line in captured.err.splitlines()) == printed


AMX_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu sse sse2 avx avx2 avx512f avx512_vnni amx_bf16 amx_tile amx_int8
"""


def test_auto_turns_llamacpps_extra_buffers_off_on_an_amx_cpu_and_leaves_them_on_elsewhere(
    tmp_path: Path,
) -> None:
    # The AMX matmul of the bundled llama.cpp segfaults on Q4_1 (the default model): seen on a Xeon
    # with AMX, 2026-12-01. Only the flags line counts, and the flag must be a whole word.
    amx, plain, odd, missing = (tmp_path / n for n in ("amx", "plain", "odd", "missing"))
    amx.write_text(AMX_CPUINFO)
    plain.write_text(AMX_CPUINFO.replace(" amx_bf16 amx_tile amx_int8", ""))
    odd.write_text(
        AMX_CPUINFO.replace("flags\t\t: fpu", "model name\t: amx_int8 lab box\nflags\t\t: fpu").replace(
            " amx_int8", " xamx_int8x"
        )
    )
    assert cpu_has_amx(amx) and not cpu_has_amx(plain) and not cpu_has_amx(odd) and not cpu_has_amx(missing)
    assert use_extra_buffers("auto", amx) is False and use_extra_buffers("auto", plain) is True
    assert use_extra_buffers("on", amx) is True and use_extra_buffers("off", plain) is False


async def test_extra_buffers_off_reaches_llamacpps_model_parameters_and_the_engine_answers(
    smollm2_gguf: Path,
) -> None:
    engine = LlamaCppEngine(
        EngineConfig(
            model=str(smollm2_gguf), cpu_max_concurrency=1, cpu_threads=1, llamacpp_extra_buffers="off"
        )
    )
    await engine.start(QUESTION[:1])
    try:
        assert all(slot.llama.model_params.use_extra_bufts is False for slot in engine._slots)
        events = [e async for e in engine.generate(greedy("r-extra-off", 4))]
        assert isinstance(events[-1], GenerationResult) and events[-1].output_tokens == 4
    finally:
        await engine.shutdown()
    import llama_cpp

    assert llama_cpp.llama_cpp.llama_model_default_params().use_extra_bufts is True  # put back


async def openings(engine: LlamaCppEngine, turns: list[ChatMessage], bad: tuple[str, ...]) -> list[str]:
    """The first 8 greedy tokens' text after ``turns``: without bad words, then with ``bad``."""
    texts = []
    for words in ((), bad):
        request = GenerationRequest(
            f"bad-{len(words)}",
            "chat",
            Lane.NORMAL,
            SamplingSettings(temperature=0.0, max_tokens=8, bad_words=words),
            messages=turns,
        )
        texts.append((await answer(engine, request)).text)
    return texts


async def test_bad_words_keep_a_model_from_opening_its_answer_with_the_prompts_markup(
    smollm2_gguf: Path,
) -> None:
    """SmolLM2, shown fenced data, opens its answer by copying the fence; with the fence as a bad
    word its first tokens must be words of its own (the same prompt, greedy, without: the fence)."""
    engine = LlamaCppEngine(EngineConfig(model=str(smollm2_gguf), cpu_max_concurrency=1, cpu_threads=1))
    await engine.start()
    turns = [
        ChatMessage("system", "Echo."),
        ChatMessage("user", "<<<DATA id=1>>>"),
        ChatMessage("assistant", "<<<DATA id=1>>>"),
        ChatMessage("user", "<<<DATA id=2>>>"),
    ]
    try:
        texts = await openings(engine, turns, ("<<<DATA", "<<< DATA"))
    finally:
        await engine.shutdown()
    assert texts[0].lstrip().startswith("<<<DATA")  # the case is real: without them it copies
    assert not texts[1].lstrip().startswith("<<"), texts[1]


@pytest.mark.parametrize("backend", ["llamacpp", "cpu"])
async def test_a_banned_phrase_of_the_greedy_answer_is_never_completed(
    backend: str, smollm2_gguf: Path, tmp_path: Path
) -> None:
    """vLLM's ``bad_words`` rule in both engines that decode themselves, on the same GGUF: the phrase
    a greedy answer wrote, given as a bad word, is not written again (what an answer asked again
    after copying its prompt is given: ``bot.answer_clean.ask_again``)."""
    config = EngineConfig(model=str(smollm2_gguf), cpu_max_concurrency=1, cpu_threads=1)
    if backend == "cpu":  # a folder holding only the GGUF, as test_the_cpu_engine_loads_the_same_gguf
        folder = tmp_path / "smollm2"
        folder.mkdir()
        shutil.copyfile(smollm2_gguf, folder / smollm2_gguf.name)
        config = EngineConfig(model=str(folder), cpu_max_concurrency=1, cpu_threads=1)
    engine: CpuEngine = LlamaCppEngine(config) if backend == "llamacpp" else CpuEngine(config)
    await engine.start()
    try:
        free = (await answer(engine, greedy(f"{backend}-free", 24))).text
        phrase = " ".join(free.split()[1:4])
        banned = GenerationRequest(
            f"{backend}-banned",
            "chat",
            Lane.NORMAL,
            SamplingSettings(temperature=0.0, max_tokens=24, bad_words=(phrase,)),
            messages=QUESTION,
        )
        again = (await answer(engine, banned)).text
    finally:
        await engine.shutdown()
    assert len(phrase.split()) == 3 and phrase in free  # the case is real: the model writes it
    assert phrase not in again, (phrase, again)


async def test_after_calls_the_answer_may_not_open_with_another_call(smollm2_gguf: Path) -> None:
    """A transcript of JSON calls (an investigation's): SmolLM2 answers with one more call; with the
    decision's opening as a bad word (what the pipeline gives the answer after a loop) it writes
    words instead."""
    from inference.tool_calls import DECISION_OPENINGS

    engine = LlamaCppEngine(EngineConfig(model=str(smollm2_gguf), cpu_max_concurrency=1, cpu_threads=1))
    await engine.start()
    call = '{ "name": "kube_get", "arguments": { "kind": "pod", "namespace": "shop", "name": "api-1" }}'
    turns = [
        ChatMessage("system", "Call tools as JSON, then answer."),
        ChatMessage("user", "why is api-1 in shop restarting?"),
        ChatMessage("assistant", call),
        ChatMessage("user", "Result of step [1]: pod shop/api-1 OOMKilled, 7 restarts."),
        ChatMessage("assistant", call.replace("pod", "deployment")),
        ChatMessage("user", "Result of step [2]: deployment shop/api 2/3 ready. No more tool calls: answer."),
    ]
    try:
        texts = await openings(engine, turns, DECISION_OPENINGS)
    finally:
        await engine.shutdown()
    assert texts[0].lstrip().startswith("{"), texts[0]  # the case is real: without them, a call
    assert not texts[1].lstrip().startswith("{"), texts[1]


async def test_a_greedy_constrained_decision_is_the_one_llamacpps_whole_vocabulary_grammar_picks(
    smollm2_gguf: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The engine checks the best token against the grammar and the whole vocabulary only when it is
    rejected (``_GreedyGrammar``); the decision must be the very one llama-cpp-python's sampler chain
    (the grammar applied to every token, then greedy) decodes from the same prompt ids."""
    import json
    import logging

    import llama_cpp

    from inference.engine import ToolSpec
    from inference.tool_calls import decision_schema, final_answer_spec, parse_decision

    pod = {
        "type": "object",
        "properties": {
            "namespace": {"type": "string", "maxLength": 24},
            "name": {"type": "string", "maxLength": 24},
            "previous": {"type": "boolean"},
        },
        "required": ["namespace", "name", "previous"],
        "additionalProperties": False,
    }
    specs = (ToolSpec("kube_logs", "A pod's log lines.", pod), ToolSpec("kube_get", "An object.", pod))
    specs += (final_answer_spec(),)
    schema = json.dumps(decision_schema(specs))
    turns = [
        ChatMessage("system", 'Answer with one JSON call: {"name": ..., "arguments": {...}}.'),
        ChatMessage("user", "Why does pod api-1 in namespace shop restart? Its last log line was cut."),
    ]
    engine = LlamaCppEngine(EngineConfig(model=str(smollm2_gguf), cpu_max_concurrency=1, cpu_threads=1))
    await engine.start()
    try:
        request = GenerationRequest(
            "decide",
            "investigate",
            Lane.NORMAL,
            SamplingSettings(temperature=0.0, max_tokens=96, json_schema=schema),
            messages=turns,
        )
        with caplog.at_level(logging.DEBUG, logger="inference.llamacpp_engine"):
            result = await answer(engine, request)
        checked = [r.getMessage() for r in caplog.records if "whole vocabulary checked" in r.getMessage()]
        llama = engine._slots[0].llama
        reference: list[int] = []
        for token in llama.generate(
            engine.tokenizer.render(turns),
            top_k=0,
            top_p=1.0,
            min_p=0.0,
            temp=0.0,
            repeat_penalty=1.0,
            grammar=llama_cpp.LlamaGrammar.from_json_schema(schema, verbose=False),
        ):
            if token == llama.token_eos() or len(reference) >= 96:
                break
            reference.append(token)
        expected = llama.detokenize(reference).decode("utf-8", "replace")
    finally:
        await engine.shutdown()
    assert result.text == expected
    assert parse_decision(result.text, specs).name in {"kube_logs", "kube_get", "final_answer"}
    assert checked and f"of {result.output_tokens} constrained tokens" in checked[0], checked


async def test_llamacpps_own_log_lines_go_to_python_logging_not_to_the_terminal(
    smollm2_gguf: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """llama-cpp-python prints llama.cpp's lines to stderr itself (one reached ``opsbot chat``'s
    screen); once the engine has loaded llama.cpp, the callback llama.cpp holds hands them to the
    ``llama_cpp.native`` logger: errors as INFO lines, the rest DEBUG. Called here through the very
    function pointer llama.cpp would call."""
    import ctypes
    import logging

    import llama_cpp

    engine = LlamaCppEngine(EngineConfig(model=str(smollm2_gguf), cpu_max_concurrency=1, cpu_threads=1))
    await engine.start()
    await engine.shutdown()
    capfd.readouterr()
    # Only the two lines below count: loading logs llama.cpp's own lines through the same callback
    # (DEBUG, kept when an earlier test left the root logger at DEBUG).
    caplog.clear()
    installed = llama_cpp.llama_log_callback()
    llama_cpp.llama_log_get(ctypes.byref(installed), ctypes.byref(ctypes.c_void_p()))
    with caplog.at_level(logging.DEBUG, logger="llama_cpp.native"):
        installed(3, b"decode: removing memory module entries for seq_id = 0, pos = [1380, +inf)\n", None)
        installed(2, b"llama_context: n_ctx_per_seq (4096) < n_ctx_train (8192)\n", None)
    assert capfd.readouterr().err == ""
    native = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "llama_cpp.native"]
    assert native == [
        (logging.INFO, "decode: removing memory module entries for seq_id = 0, pos = [1380, +inf)"),
        (logging.DEBUG, "llama_context: n_ctx_per_seq (4096) < n_ctx_train (8192)"),
    ]
