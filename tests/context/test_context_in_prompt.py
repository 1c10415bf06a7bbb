"""Gathered context as the lead's PromptBuilder puts it in a prompt: what the pipeline will see.

The lead's end-to-end tests cover the whole pipeline; these check the seam between gathering and
prompting with the real tokenizer of the offline test model.
"""

from __future__ import annotations

import re
import socket

import pytest
from corpus import INJECTIONS, SECRETS, corpus_cluster

from bot.config import Settings
from bot.context.gatherer import ContextGatherer
from bot.prompts import DEFAULT_SYSTEM_PROMPT, PromptBuilder


@pytest.fixture
def builder(tiny_model):
    from inference.tokenization import HFChatTokenizer

    return PromptBuilder(
        HFChatTokenizer(str(tiny_model)),
        system_prompt=DEFAULT_SYSTEM_PROMPT,
        max_model_len=8192,
        context_share=0.45,
        history_share=0.2,
    )


def _dead_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


async def test_rca_prompt_about_a_crash_looping_pod_holds_status_events_and_log_tail(kubeconfig, builder):
    settings = Settings(
        kubernetes={"enabled": True, "kubeconfig": kubeconfig},
        prometheus={"enabled": True, "url": _dead_url(), "timeout_s": 1.0},
    )
    gatherer = ContextGatherer.from_settings(settings)
    question = "api-7f9c8d6b5-x2x9q in payments keeps crashing, why?"
    try:
        bundle = await gatherer.gather(question, scenario="root_cause")
    finally:
        await gatherer.close()
    plan = builder.build(
        scenario="root_cause", question=question, asker="alice", context=bundle, max_tokens=512
    )
    user_turn = plan.messages[-1].content
    assert "payments/api-7f9c8d6b5-x2x9q | Running | ready 0/1 | restarts 7" in user_turn
    assert "CrashLoopBackOff" in user_turn and "BackOff x31" in user_turn
    assert "FATAL cannot start without database, exiting (exit code 1)" in user_turn
    # The failed source is named for the model, and the notes give the footer its sources.
    assert "Prometheus: failed Prometheus failed at http://127.0.0.1:" in user_turn
    assert {note.name for note in bundle.notes} == {"Kubernetes", "Prometheus"}


async def test_injection_strings_from_logs_and_annotations_sit_inside_data_fences(tmp_path, builder):
    fake = corpus_cluster()
    await fake.start()
    try:
        settings = Settings(
            kubernetes={
                "enabled": True,
                "kubeconfig": fake.write_kubeconfig(tmp_path / "kc"),
                "log_tail_lines": 5000,
            }
        )
        gatherer = ContextGatherer.from_settings(settings)
        try:
            bundle = await gatherer.gather(
                "why is leaky-7d9f8c6b5-q8w2e failing in namespace corpus?", scenario="chat"
            )
        finally:
            await gatherer.close()
    finally:
        await fake.stop()
    builder.context_budget = 10**6  # this test is about fencing, not the budget
    builder.max_model_len = 10**6  # the window bounds the context too
    plan = builder.build(
        scenario="chat", question="what is wrong?", asker="bob", context=bundle, max_tokens=64
    )
    user_turn = plan.messages[-1].content
    fenced = "\n".join(re.findall(r"<<<DATA id=\w+ label=\"[^\"]*\">>>\n(.*?)\n<<<END DATA", user_turn, re.S))
    outside = re.sub(
        r"<<<DATA id=\w+ label=\"[^\"]*\">>>\n.*?\n<<<END DATA id=\w+>>>", "", user_turn, flags=re.S
    )
    for injection in INJECTIONS:
        first_line = injection.splitlines()[0]
        assert first_line.replace("<<<", "‹‹‹").replace(">>>", "›››") in fenced, injection
        assert first_line not in outside, injection
    assert not [item for item in SECRETS if item.secret in user_turn]
