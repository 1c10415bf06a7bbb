"""Constrained JSON outputs: the token ceiling fits the longest instance a grammar admits, and a cut
output keeps only whole entries (never a half-written name)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bot.investigate import citation_line, read_root_cause, root_cause_schema
from inference.engine import ToolSpec
from inference.structured import complete_prefix, token_ceiling
from inference.tool_calls import decision_schema, final_answer_spec


def longest(schema: dict[str, Any]) -> str:
    """The longest instance of ``schema`` as llama.cpp's grammar could write it: every optional
    member present, every string and list at its maximum, one space wherever a space may go."""
    return _write(schema)


def _write(schema: dict[str, Any]) -> str:
    if "const" in schema:
        return json.dumps(schema["const"]) + " "
    if "enum" in schema:
        return max((json.dumps(v) for v in schema["enum"]), key=len) + " "
    if "anyOf" in schema:
        return max((_write(o) for o in schema["anyOf"]), key=len)
    kind = schema["type"]
    if kind == "object":
        members = [json.dumps(k) + " : " + _write(v) for k, v in schema["properties"].items()]
        return "{ " + ", ".join(members) + "} "
    if kind == "array":
        return "[ " + ", ".join(_write(schema["items"]) for _ in range(schema["maxItems"])) + "] "
    if kind == "string":
        return json.dumps("x" * schema["maxLength"]) + " "
    if kind == "integer":
        return str(max((schema["minimum"], schema["maximum"]), key=lambda n: len(str(n)))) + " "
    if kind == "boolean":
        return "false "
    raise AssertionError(kind)


def test_the_longest_root_cause_block_fits_its_ceiling_one_token_per_character() -> None:
    schema = root_cause_schema(6)
    text = longest(schema)
    assert json.loads(text)["claims"][2]["claim"] == "x" * 100  # really the longest one
    ceiling = token_ceiling(schema)
    assert ceiling is not None and len(text) < ceiling <= len(text) + 1


def test_a_decision_among_tools_fits_the_ceiling_of_its_longest_tool() -> None:
    tools = [
        ToolSpec("short", "", {"type": "object", "properties": {}, "additionalProperties": False}),
        ToolSpec(
            "logs",
            "",
            {
                "type": "object",
                "properties": {
                    "pod": {"type": "string", "maxLength": 253},
                    "container": {"type": "string", "enum": ["app", "sidecar"]},
                    "lines": {"type": "integer", "minimum": 1, "maximum": 200},
                },
                "required": ["pod"],
                "additionalProperties": False,
            },
        ),
        final_answer_spec(),
    ]
    schema = decision_schema(tools)
    ceiling = token_ceiling(schema)
    assert ceiling is not None and len(longest(schema)) < ceiling
    assert ceiling > 253  # the pod name alone may take 253 tokens


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string"},
        {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}},
        {"type": "object", "properties": {"a": {"type": "boolean"}}},  # open: more members may come
        {"$ref": "#/definitions/x"},
    ],
)
def test_an_unbounded_schema_has_no_ceiling(schema: dict[str, Any]) -> None:
    assert token_ceiling(schema) is None


BLOCK = (
    '{ "conclusive": false, "root_cause": [{"kind": "Deployment", "namespace": "shop", "name": "api"},'
    ' {"kind": "ConfigMap", "namespace": "shop", "name": "api-config"}] ,"claims": [{"claim": '
    '"the \\"DB_URL\\" key [is] missing", "steps": [1, 2]}, {"claim": "exit code 1 {x}", "steps": [3]}]}'
)


def test_whole_text_is_read_as_it_is() -> None:
    assert complete_prefix(BLOCK) == json.loads(BLOCK)


def test_a_cut_output_keeps_its_whole_entries_and_drops_the_half_written_one() -> None:
    cuts = {}
    for end in range(len(BLOCK)):
        value = complete_prefix(BLOCK[:end])
        if value is not None:
            cuts[end] = value
    whole = json.loads(BLOCK)
    names = {e["name"] for e in whole["root_cause"]}
    claims = [c["claim"] for c in whole["claims"]]
    for value in cuts.values():
        assert isinstance(value, dict)
        for entity in value.get("root_cause", []):
            # an entity is whole or missing keys, never a cut name
            assert entity.get("name", "api") in names
        for claim in value.get("claims", []):
            assert claim.get("claim", claims[0]) in claims
            assert set(claim.get("steps", [])) <= {1, 2, 3}
    # cut inside the second claim's text: the first claim and both entities are kept whole
    inside = BLOCK.index("exit code") + 4
    kept = complete_prefix(BLOCK[:inside])
    assert kept == {"conclusive": False, "root_cause": whole["root_cause"], "claims": whole["claims"][:1]}


def test_nothing_to_keep_is_none() -> None:
    assert complete_prefix("") is None
    assert complete_prefix("the answer is") is None
    assert complete_prefix('"a string cut') is None


def test_a_cut_root_cause_block_keeps_whole_entities_and_real_step_references() -> None:
    cut = BLOCK[: BLOCK.index("api-config") + 3]  # the second entity's name half-written
    block = read_root_cause(cut, last_step=2, cluster="eu-west")
    assert block == {
        "conclusive": False,
        "root_cause": [{"kind": "Deployment", "namespace": "shop", "name": "api", "cluster": "eu-west"}],
        "claims": [],
    }
    whole = read_root_cause(BLOCK, last_step=2, cluster="eu-west")
    assert whole is not None
    assert [c["steps"] for c in whole["claims"]] == [[1, 2], []]  # step 3 never ran
    # a cluster-wide entity (a node) has an empty namespace and is kept
    node = json.dumps(
        {
            "conclusive": True,
            "root_cause": [{"kind": "Node", "namespace": "", "name": "worker-3"}],
            "claims": [],
        }
    )
    assert read_root_cause(node, last_step=1, cluster="c") == {
        "conclusive": True,
        "root_cause": [{"kind": "Node", "namespace": "", "name": "worker-3", "cluster": "c"}],
        "claims": [],
    }
    # a block cut before any whole entity names nothing
    assert read_root_cause(BLOCK[: BLOCK.index('"shop"')], last_step=2, cluster="eu-west") is None


def test_a_name_that_repeats_its_namespace_or_kind_names_the_object_once() -> None:
    """Kubernetes names hold no "/": ``payments/worker-1`` in namespace ``payments`` (SmolLM2 wrote
    it, and the citation read "Pod payments/payments/worker-1") and kubectl's ``pod/worker-1`` are
    the object ``worker-1``; any other prefix is kept as the model wrote it."""

    def entity(kind: str, namespace: str, name: str) -> dict[str, str]:
        text = json.dumps(
            {"conclusive": True, "root_cause": [{"kind": kind, "namespace": namespace, "name": name}]}
        )
        block = read_root_cause(text, last_step=0, cluster="c")
        assert block is not None
        return block["root_cause"][0]

    assert entity("Pod", "payments", "payments/worker-1")["name"] == "worker-1"
    assert entity("Deployment", "shop", "deployment/api")["name"] == "api"
    assert entity("Node", "", "Node/worker-3") == {
        "kind": "Node",
        "namespace": "",
        "name": "worker-3",
        "cluster": "c",
    }
    assert entity("Pod", "shop", "other/api-1")["name"] == "other/api-1"
    assert citation_line({"root_cause": [entity("Pod", "payments", "payments/worker-1")]}) == (
        "Root cause: Pod payments/worker-1"
    )
