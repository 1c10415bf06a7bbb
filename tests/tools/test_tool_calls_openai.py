"""The ``openai`` backend's side of tool calls, against the fake vLLM server: the tools travel in the
``tools`` parameter (the server's tool-call parser answers), the streamed ``delta.tool_calls`` come
back as the same decision text every engine gives, a step without a call is the final answer, and a
schema without tools is the server's ``response_format``; on token ids (vLLM's ``/v1/completions``) the
tools travel as the decision's schema in ``response_format`` and the text that comes back is the
decision."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes.openai_server import FakeOpenAIServer

from inference.config import EngineConfig
from inference.engine import (
    ChatMessage,
    GenerationRequest,
    GenerationResult,
    Lane,
    SamplingSettings,
    ToolSpec,
)
from inference.openai_engine import OpenAIEngine
from inference.tool_calls import FINAL_ANSWER, decision_schema, final_answer_spec, parse_decision

MODEL = "tiny-chat"
LOGS = ToolSpec(
    "kube_logs",
    "Log lines of a pod's container.",
    {
        "type": "object",
        "properties": {
            "namespace": {"type": "string", "enum": ["shop"]},
            "pod": {"type": "string", "maxLength": 63},
        },
        "required": ["namespace", "pod"],
        "additionalProperties": False,
    },
)
SPECS = (LOGS, final_answer_spec())
MESSAGES = [ChatMessage("system", "You are opsbot."), ChatMessage("user", "why is api-1 in shop restarting?")]


@pytest.fixture
def server(tiny_model: Path) -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(tiny_model, served_model_name=MODEL) as srv:
        yield srv


async def ask(
    server: FakeOpenAIServer, request: GenerationRequest, prompt: str = "messages"
) -> GenerationResult:
    engine = OpenAIEngine(
        EngineConfig(
            backend="openai", base_url=server.url, model=MODEL, max_model_len=2048, server_prompt=prompt
        )
    )
    await engine.start([MESSAGES[0]])
    try:
        async for event in engine.generate(request):
            if isinstance(event, GenerationResult):
                return event
    finally:
        await engine.shutdown(drain_timeout_s=5)
    raise AssertionError("no result")


def step(request_id: str, tools: tuple[ToolSpec, ...] = SPECS) -> GenerationRequest:
    schema = json.dumps(decision_schema(SPECS))
    return GenerationRequest(
        request_id,
        "investigate",
        Lane.NORMAL,
        SamplingSettings(temperature=0.0, max_tokens=64, json_schema=schema),
        messages=MESSAGES,
        tools=tools,
    )


async def test_a_streamed_tool_call_comes_back_as_the_decision_every_engine_gives(
    server: FakeOpenAIServer,
) -> None:
    server.tool_call = ("kube_logs", json.dumps({"namespace": "shop", "pod": "api-1"}))
    result = await ask(server, step("call-1"))
    call = parse_decision(result.text, SPECS)
    assert (call.name, call.arguments) == ("kube_logs", {"namespace": "shop", "pod": "api-1"})
    (received,) = server.requests_for("call-1")
    assert received.body["tool_choice"] == "auto"
    assert [t["function"]["name"] for t in received.body["tools"]] == ["kube_logs"]  # no pseudo-tool
    assert received.body["tools"][0]["function"]["parameters"] == dict(LOGS.parameters)
    assert "response_format" not in received.body


async def test_a_step_without_a_call_is_the_final_answer(server: FakeOpenAIServer) -> None:
    result = await ask(server, step("call-2"))  # the server's model answers in text
    assert parse_decision(result.text, SPECS).name == FINAL_ANSWER


async def test_a_schema_without_tools_is_the_servers_response_format(server: FakeOpenAIServer) -> None:
    await ask(server, step("block-1", tools=()))
    (received,) = server.requests_for("block-1")
    assert received.body["response_format"]["type"] == "json_schema"
    assert received.body["response_format"]["json_schema"]["schema"] == decision_schema(SPECS)
    assert "tools" not in received.body


async def test_on_token_ids_the_tools_are_the_decisions_schema(tiny_model: Path) -> None:
    # A server with structured outputs writes the decision the schema admits (the fake's model
    # "generates" it); no chat template, so no tool parser: the schema is the constraint.
    decision = json.dumps({"name": "kube_logs", "arguments": {"namespace": "shop", "pod": "api-1"}})
    with FakeOpenAIServer(tiny_model, served_model_name=MODEL, answer=decision) as srv:
        request = step("ids-1")
        request.prompt_token_ids = [1, 2, 3, 4]
        result = await ask(srv, request, prompt="token_ids")
        (received,) = srv.requests_for("ids-1")
    assert received.path == "/v1/completions"
    assert received.body["prompt"] == [1, 2, 3, 4]
    assert received.body["response_format"]["json_schema"]["schema"] == decision_schema(SPECS)
    assert "tools" not in received.body and "tool_choice" not in received.body
    call = parse_decision(result.text, SPECS)
    assert (call.name, call.arguments) == ("kube_logs", {"namespace": "shop", "pod": "api-1"})
