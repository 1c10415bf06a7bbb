"""The closed set: command words become checked specs; anything outside a kind's schema is refused."""

from __future__ import annotations

import pytest

from bot.actions.catalog import KINDS, SCHEMAS, ActionError, ActionSpec, parse_command, tool_schema


@pytest.mark.parametrize(
    ("words", "action", "params"),
    [
        (
            "restart deployment/api -n shop",
            "rollout_restart",
            {"kind": "deployment", "name": "api", "namespace": "shop"},
        ),
        (
            "restart sts/db -n shop",
            "rollout_restart",
            {"kind": "statefulset", "name": "db", "namespace": "shop"},
        ),
        (
            "rollback deploy/api -n shop --to-revision 3",
            "rollback",
            {"kind": "deployment", "name": "api", "namespace": "shop", "revision": 3},
        ),
        (
            "scale deployment/api -n shop --replicas 0",
            "scale",
            {"kind": "deployment", "name": "api", "namespace": "shop", "replicas": 0},
        ),
        ("delete pod/api-1 -n shop", "delete_pod", {"kind": "pod", "name": "api-1", "namespace": "shop"}),
        ("cordon node/worker-1", "cordon", {"kind": "node", "name": "worker-1"}),
        ("uncordon worker-1", "uncordon", {"kind": "node", "name": "worker-1"}),
        (
            "expire silence/0b2c7c7e-1111-2222-3333-444455556666",
            "expire_silence",
            {"silence_id": "0b2c7c7e-1111-2222-3333-444455556666"},
        ),
    ],
)
def test_command_words_become_a_checked_spec(words: str, action: str, params: dict[str, object]) -> None:
    assert parse_command(words) == ActionSpec(action, params)


def test_a_silence_reads_matchers_duration_and_comment() -> None:
    spec = parse_command('silence alertname=X namespace=shop --for 2h --comment "known, rolling back"')
    assert spec.params == {
        "matchers": [
            {"name": "alertname", "value": "X", "isRegex": False, "isEqual": True},
            {"name": "namespace", "value": "shop", "isRegex": False, "isEqual": True},
        ],
        "duration_m": 120,
        "comment": "known, rolling back",
    }


@pytest.mark.parametrize(
    "words",
    [
        "reboot node/worker-1",
        "scale deployment/api -n shop --replicas lots",
        "scale deployment/api -n shop --replicas -1",
        "scale daemonset/agent -n kube-system --replicas 2",
        "delete deployment/api -n shop",
        "restart deployment/API -n shop",
        "restart deployment/a;rm -n shop",
        "restart deployment/api deployment/web -n shop",
        "rollback statefulset/db -n shop",
        "cordon pod/x",
        "silence --for 1h",
        "expire silence/not-an-id!",
    ],
)
def test_anything_outside_the_catalog_or_a_kinds_schema_is_refused(words: str) -> None:
    with pytest.raises(ActionError):
        parse_command(words)


def test_a_spec_with_an_extra_or_missing_parameter_is_refused() -> None:
    with pytest.raises(ActionError, match="unknown parameter"):
        ActionSpec("cordon", {"kind": "node", "name": "n1", "force": True})
    with pytest.raises(ActionError, match="replicas is required"):
        ActionSpec("scale", {"kind": "deployment", "namespace": "a", "name": "b"})
    with pytest.raises(ActionError, match="expected an integer"):
        ActionSpec("scale", {"kind": "deployment", "namespace": "a", "name": "b", "replicas": True})


def test_the_tool_schema_offers_the_kubernetes_kinds_and_the_digest_changes_with_any_parameter() -> None:
    schema = tool_schema()
    assert schema["properties"]["action"]["enum"] == [
        k for k in KINDS if k not in ("silence", "expire_silence")
    ]
    assert list(KINDS) == list(SCHEMAS)
    a = ActionSpec("scale", {"kind": "deployment", "namespace": "a", "name": "b", "replicas": 1})
    b = ActionSpec("scale", {"kind": "deployment", "namespace": "a", "name": "b", "replicas": 2})
    assert a.digest() != b.digest() and ActionSpec.from_json(a.canonical()) == a


def test_actions_cannot_be_enabled_without_a_secret_nor_name_an_unknown_group() -> None:
    from pydantic import ValidationError

    from bot.config import ActionsSettings

    with pytest.raises(ValidationError, match="actions.secret is required"):
        ActionsSettings(enabled=True)
    with pytest.raises(ValidationError, match="names no group"):
        ActionsSettings(secret="s", policies=[{"match": ["C1"], "approvers": ["@sre"]}])
    assert ActionsSettings(
        secret="s", groups={"sre": ["U1"]}, policies=[{"match": ["C1"], "approvers": ["@sre"]}]
    )
