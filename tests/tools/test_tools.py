"""The tool registry over the eval's in-process Kubernetes and Prometheus APIs: what each tool reads,
and the one path every call takes (scope, repeats, redaction, the output cap)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from fakes.shop_cluster import SECRET, SHOP_TOOLS

from bot.context.gatherer import ContextGatherer
from bot.context.scope import ChannelRef
from bot.eval.kube_api import KubernetesSnapshotServer
from bot.tools.registry import ToolBox, ToolRegistry
from inference.tool_calls import (
    FINAL_ANSWER,
    ToolCall,
    ToolCallError,
    decision_schema,
    decision_text,
    final_answer_spec,
    parse_decision,
)


async def shop_box(
    gatherer: ContextGatherer, max_output_tokens: int = 400, timeout_s: float = 5.0
) -> ToolBox:
    """The tool box of a question asked in the shop channel (scope: namespace shop only)."""
    bundle = await gatherer.gather(
        "why is api crashing?", scenario="root_cause", channel=ChannelRef("slack", "C-SHOP")
    )
    registry = ToolRegistry(gatherer)
    return registry.box(
        registry.scope_for(bundle),
        max_output_tokens=max_output_tokens,
        count=lambda t: len(t.split()),
        timeout_s=timeout_s,
    )


async def test_the_box_offers_each_tool_with_a_closed_schema_and_scoped_namespaces(
    gatherer: ContextGatherer,
) -> None:
    box = await shop_box(gatherer)
    names = [s.name for s in box.specs]
    assert names == list(SHOP_TOOLS)
    logs = next(s for s in box.specs if s.name == "kube_logs")
    assert logs.parameters["additionalProperties"] is False
    assert logs.parameters["properties"]["namespace"]["enum"] == ["shop"]
    assert "cluster" not in logs.parameters["properties"]  # one cluster in scope: nothing to choose
    assert "secret" not in json.dumps(next(s for s in box.specs if s.name == "kube_get").parameters).lower()


async def test_logs_of_the_previous_run_are_redacted_filtered_and_fenced_by_the_caller(
    gatherer: ContextGatherer,
) -> None:
    box = await shop_box(gatherer)
    result = await box.call(
        ToolCall(
            "kube_logs",
            {
                "namespace": "shop",
                "pod": "api-7f9c8d6b5-x2x9q",
                "previous": True,
                "tail": 50,
                "grep": "error",
            },
        )
    )
    assert result.status == "ok", result.text
    assert "payment client token=[REDACTED]" in result.text
    assert SECRET not in result.text
    assert "served in" not in result.text  # grep kept only the error line
    assert result.source == "Kubernetes default"
    assert result.summary.startswith("1 log lines of shop/api-7f9c8d6b5-x2x9q/app (previous)")


async def test_a_call_outside_the_channel_scope_is_a_tool_error_the_model_reads(
    gatherer: ContextGatherer, kube: KubernetesSnapshotServer
) -> None:
    box = await shop_box(gatherer)
    before = len(kube.requests)
    result = await box.call(ToolCall("kube_events", {"namespace": "data", "name": "postgres-0"}))
    assert result.status == "error"
    assert "namespace data is outside this channel's scope" in result.text
    assert len(kube.requests) == before  # refused before any API call
    node = await box.call(ToolCall("kube_node", {"node": "worker-1"}))
    assert "shop/api-7f9c8d6b5-x2x9q" in node.text and "postgres-0" not in node.text


async def test_a_repeated_identical_call_is_refused_with_a_note(gatherer: ContextGatherer) -> None:
    box = await shop_box(gatherer)
    call = ToolCall("kube_get", {"kind": "pod", "namespace": "shop", "name": "api-7f9c8d6b5-x2x9q"})
    first = await box.call(call)
    assert first.status == "ok" and "OOMKilled" in first.text
    again = await box.call(ToolCall("kube_get", dict(reversed(list(call.arguments.items())))))
    assert again.status == "repeated" and "already made" in again.text
    unknown = await box.call(ToolCall("exec_shell", {}))
    assert unknown.status == "unknown"


async def test_rollout_history_shows_revisions_and_the_template_diff(gatherer: ContextGatherer) -> None:
    box = await shop_box(gatherer)
    result = await box.call(ToolCall("kube_rollout", {"namespace": "shop", "deployment": "api"}))
    assert result.status == "ok", result.text
    assert "changes revision 1 -> 2:" in result.text
    assert "app memory limit: 1Gi -> 256Mi" in result.text


async def test_an_output_over_the_cap_is_cut_by_whole_lines_with_a_note(gatherer: ContextGatherer) -> None:
    box = await shop_box(gatherer, max_output_tokens=60)
    result = await box.call(
        ToolCall(
            "kube_logs",
            {"namespace": "shop", "pod": "api-7f9c8d6b5-x2x9q", "previous": True, "tail": 500, "grep": ""},
        )
    )
    assert result.cut_tokens > 0
    first, *rest = result.text.splitlines()
    assert first.startswith("[cut: ") and "older lines" in first and "60-token cap" in first
    assert rest[-1].endswith("FATAL out of memory")  # the newest lines are kept
    assert result.output_tokens <= 60


async def test_a_range_query_is_summarised_and_other_namespaces_are_dropped(
    gatherer: ContextGatherer,
) -> None:
    box = await shop_box(gatherer)
    result = await box.call(
        ToolCall(
            "prom_query", {"query": "container_memory_working_set_bytes", "minutes": 30, "unit": "bytes"}
        )
    )
    assert result.status == "ok", result.text
    assert "api-7f9c8d6b5-x2x9q" in result.text and "min " in result.text and "last " in result.text
    assert "postgres-0" not in result.text
    assert "1 series of namespaces outside this channel's scope dropped" in result.text


def test_decisions_parse_against_the_offered_tools_only() -> None:
    specs = (final_answer_spec(),)
    assert parse_decision(json.dumps({"name": FINAL_ANSWER, "arguments": {}}), specs).is_final
    with pytest.raises(ToolCallError, match="not one of the offered tools"):
        parse_decision('{"name": "kube_logs", "arguments": {}}', specs)
    with pytest.raises(ToolCallError, match="not JSON"):
        parse_decision('{"name": "final_', specs)
    assert decision_schema(specs)["properties"]["name"] == {"const": FINAL_ANSWER}
    assert json.loads(decision_text("kube_get", '{"kind": "pod"}')) == {
        "name": "kube_get",
        "arguments": {"kind": "pod"},
    }


async def test_a_slow_source_is_a_timeout_the_model_reads(
    gatherer: ContextGatherer, kube: KubernetesSnapshotServer
) -> None:
    box = await shop_box(gatherer, timeout_s=0.3)
    kube.delay(r".*/nodes/worker-1$", 2.0)
    result = await box.call(ToolCall("kube_node", {"node": "worker-1"}))
    assert result.status == "timeout"
    assert result.text == "kube_node took longer than 0.3 s and was stopped"


async def test_a_recorded_investigation_replays_its_calls_without_the_cluster(
    gatherer: ContextGatherer, kube: KubernetesSnapshotServer
) -> None:
    from bot.eval.cases import parse_replay
    from bot.eval.feedback import export_lines
    from bot.investigate import Investigation
    from bot.replay import encode, with_investigation
    from bot.store import RatedRequest
    from bot.tools.recorded import NOT_RECORDED, recorded_registry

    live = await shop_box(gatherer)
    call = ToolCall(
        "kube_logs",
        {"namespace": "shop", "pod": "api-7f9c8d6b5-x2x9q", "previous": True, "tail": 5, "grep": ""},
    )
    result = await live.call(call)
    found = Investigation([], [], specs=live.specs)
    recorded = {"name": call.name, "arguments": call.arguments, "status": result.status}
    found.outputs.append(
        {**recorded, "text": result.text, "source": result.source, "summary": result.summary}
    )
    # The row's replay inputs carry the recording; feedback export writes it into the case.
    inputs = encode(
        question="why?",
        asker="sre",
        scenario="root_cause",
        max_tokens=64,
        system_prompt="s",
        history=[],
        bundle=None,
    )
    stored = with_investigation(inputs, found.replay_record())
    rated = RatedRequest(
        "req-1", "root_cause", "smollm2", "ok", datetime.now(UTC), stored, "an answer", {"U1": 1}
    )
    (line,), _ = export_lines([rated])
    case = parse_replay(json.loads(line), "feedback.jsonl")
    assert case.replay is not None and case.replay.investigation is not None
    registry = recorded_registry(ContextGatherer(), case.replay.investigation)
    replayed = registry.box(registry.scope_for(None), max_output_tokens=400, count=lambda t: len(t.split()))
    assert replayed.specs == live.specs  # the same schemas: the same grammar, the same choices
    asked = len(kube.requests)
    again = await replayed.call(call)
    assert (again.status, again.text, again.source) == ("ok", result.text, result.source)
    other = await replayed.call(ToolCall("kube_events", {"namespace": "shop", "name": ""}))
    assert (other.status, other.text) == ("error", NOT_RECORDED)
    assert len(kube.requests) == asked  # nothing asked of the cluster


async def test_a_name_written_with_its_namespace_or_kind_finds_the_object(gatherer: ContextGatherer) -> None:
    """``shop/api-...`` in namespace shop and ``pod/api-...`` are the pod ``api-...`` (SmolLM2's calls
    ``kube_get name=payments/worker-...`` were answered "not found" and the loop went in circles)."""
    box = await shop_box(gatherer)
    for name in ("shop/api-7f9c8d6b5-x2x9q", "pod/api-7f9c8d6b5-x2x9q"):
        got = await box.call(ToolCall("kube_get", {"kind": "pod", "namespace": "shop", "name": name}))
        assert got.status == "ok" and "api-7f9c8d6b5-x2x9q" in got.text, got.text
    logs = await box.call(
        ToolCall(
            "kube_logs",
            {"namespace": "shop", "pod": "shop/api-7f9c8d6b5-x2x9q", "previous": True, "tail": 5, "grep": ""},
        )
    )
    assert logs.status == "ok", logs.text


def test_a_name_that_repeats_its_namespace_or_kind_is_the_object_itself() -> None:
    from bot.tools.base import object_name

    assert object_name("payments/worker-1", "payments", "pod") == "worker-1"
    assert object_name("payments/payments/worker-1", "payments") == "worker-1"
    assert object_name("pod/worker-1", "shop", "pod") == "worker-1"
    assert object_name("deployments/api", "shop", "Deployment") == "api"
    assert object_name("Node/worker-3", kind="node") == "worker-3"
    assert object_name("other/api-1", "shop", "pod") == "other/api-1"  # not ours to guess
    assert object_name("payments", "payments") == "payments"  # a name equal to its namespace stays
