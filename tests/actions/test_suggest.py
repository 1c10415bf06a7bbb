"""What an answer's ``kubectl`` commands may become: exactly the catalog's forms, on targets the
evidence names, in the channel's namespaces; and the ``propose_action`` tool's own checks."""

from __future__ import annotations

import json

import pytest

from bot.actions.catalog import PROPOSABLE, tool_schema
from bot.actions.suggest import named_in, suggested_actions
from bot.tools.actions import ProposeAction
from bot.tools.base import ClusterTools, OutOfScope, ToolError, ToolScope
from inference.structured import token_ceiling

EVIDENCE = named_in(
    [
        "deployment shop/api: 3/3 replicas, revision 2",
        "pod shop/api-bbb222-0 CrashLoopBackOff; node worker-1 DiskPressure",
        "statefulset shop/db 2/2",
    ]
)


def described(answer: str, namespaces: list[str] | None = None, most: int = 10) -> list[str]:
    return [
        s.spec.describe()
        for s in suggested_actions(
            answer, known=EVIDENCE, namespaces=["shop"] if namespaces is None else namespaces, most=most
        )
    ]


@pytest.mark.parametrize(
    ("command", "action"),
    [
        (
            "kubectl rollout undo deployment/api -n shop",
            "Roll back deployment/api -n shop to the previous revision",
        ),
        (
            "kubectl -n shop rollout undo deploy api --to-revision=1",
            "Roll back deployment/api -n shop to revision 1",
        ),
        ("kubectl rollout restart sts/db", "Rollout restart statefulset/db -n shop"),  # the only namespace
        (
            "kubectl scale --replicas=5 deployment/api --namespace shop",
            "Scale deployment/api -n shop to 5 replicas",
        ),
        ("kubectl delete pod api-bbb222-0 -n shop", "Delete pod/api-bbb222-0 -n shop"),
        ("kubectl cordon worker-1", "Cordon node/worker-1"),
    ],
)
def test_each_catalog_form_is_read_in_its_usual_spellings(command: str, action: str) -> None:
    namespaces = [] if "cordon" in command else None  # a node action only where no namespace is set
    assert described(f"Try `{command}` now.", namespaces) == [action]


@pytest.mark.parametrize(
    "command",
    [
        "kubectl rollout status deployment/api -n shop",  # a read
        "kubectl delete deployment api -n shop",  # not a pod
        "kubectl delete pod <pod-name> -n shop",  # a placeholder
        "kubectl delete pod api-bbb222-0 -n shop --force --grace-period=0",  # options the catalog lacks
        "kubectl scale deployment/api -n shop",  # no replica count
        "kubectl rollout restart deployment/web -n shop",  # named nowhere in the evidence
        "kubectl rollout restart deployment/api -n data",  # outside the channel's namespaces
        "kubectl rollout restart deployment/ap -n shop",  # a part of a name is not the name
        "kubectl cordon worker-1",  # a node, in a channel scoped to namespaces
        "kubectl drain worker-1",  # not in the catalog
    ],
)
def test_anything_else_is_not_offered(command: str) -> None:
    assert described(f"```\n{command}\n```") == []


def test_without_a_namespace_and_several_readable_the_command_is_skipped_and_repeats_count_once() -> None:
    assert described("kubectl rollout restart deployment/api", ["shop", "web"]) == []
    twice = "kubectl rollout restart deployment/api -n shop\n`kubectl rollout restart deploy/api -n shop`"
    assert described(twice) == ["Rollout restart deployment/api -n shop"]
    many = "\n".join(f"kubectl scale deployment/api -n shop --replicas={n}" for n in range(1, 6))
    assert len(described(many, most=2)) == 2


def test_the_tool_schema_is_closed_bounded_and_namespaced_by_the_scope() -> None:
    schema = tool_schema(["shop"])
    assert schema["type"] == "object" and schema["additionalProperties"] is False  # OpenAI's tools form
    assert schema["properties"]["action"]["enum"] == list(PROPOSABLE)
    assert token_ceiling(schema) is not None
    options = schema["properties"]["params"]["anyOf"]
    assert len(options) == len(PROPOSABLE) - 1  # cordon and uncordon share theirs
    for option in options:
        params = option["properties"]
        if "namespace" in params:
            assert params["namespace"]["enum"] == ["shop"]
        assert params["name"]["maxLength"] == 63 and "{0,61}" in params["name"]["pattern"]


async def test_propose_action_records_a_checked_proposal_and_refuses_outside_the_scope() -> None:
    tool = ProposeAction()
    scope = ToolScope(clusters=[ClusterTools("c", ("shop",))], may_propose=True)
    assert tool.available(scope) and not tool.available(ToolScope(clusters=scope.clusters))
    out = await tool.run(
        {
            "action": "scale",
            "params": {"kind": "deployment", "namespace": "shop", "name": "api", "replicas": 4},
            "why": "p99 latency doubled with 2 replicas",
            "steps": [2, 1, 2],
        },
        scope,
    )
    assert (
        out.proposal is not None
        and out.proposal.spec.describe() == "Scale deployment/api -n shop to 4 replicas"
    )
    assert out.proposal.steps == (1, 2) and "a person approves" in out.text
    with pytest.raises(OutOfScope, match="namespace data"):
        await tool.run(
            {
                "action": "delete_pod",
                "params": {"kind": "pod", "namespace": "data", "name": "x"},
                "steps": [1],
            },
            scope,
        )
    with pytest.raises(OutOfScope, match="node action"):
        await tool.run(
            {"action": "cordon", "params": {"kind": "node", "name": "worker-1"}, "steps": [1]}, scope
        )
    with pytest.raises(ToolError, match="not a proposable action"):
        await tool.run({"action": "apply", "params": {"manifest": json.dumps({})}, "steps": [1]}, scope)
