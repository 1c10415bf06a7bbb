"""Grouping before generation: instance-like labels, replica hashes, repeated firings, and what it
saves (counted with the real tokenizer of the tiny test model)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bot.analyze.grouping import group_records, normalise_name, normalise_value, template
from bot.analyze.readers import read_bytes
from bot.analyze.records import Record
from bot.analyze.work import describe_group, item_id, plan_work
from bot.prompts import DEFAULT_SYSTEM_PROMPT, PromptBuilder
from inference.tokenization import HFChatTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from gen_alerts import generate_alerts, webhook_payloads  # noqa: E402


def firing(name: str, start: str = "2026-11-30T10:00:00Z", **labels: str) -> dict:
    full = {"alertname": name, "namespace": "payments", "severity": "warning", **labels}
    return {
        "labels": full,
        "annotations": {"summary": f"{name} on {labels.get('pod', '?')}"},
        "startsAt": start,
        "fingerprint": "fp-" + "-".join(f"{k}={v}" for k, v in sorted(full.items())),
    }


def records(*alerts: dict) -> list[Record]:
    result = read_bytes(json.dumps(list(alerts)).encode(), "alerts.json")
    assert not result.bad_lines
    return result.records


def test_alerts_differing_only_in_instance_like_labels_are_one_group() -> None:
    grouped = group_records(
        records(
            firing(
                "KubePodCrashLooping",
                pod="api-7d9f8b6c4-x2x9z",
                instance="10.42.0.7:8080",
                node="ip-10-0-1-2",
            ),
            firing(
                "KubePodCrashLooping",
                pod="api-7d9f8b6c4-q7w2k",
                instance="10.42.3.9:8080",
                node="ip-10-0-4-5",
            ),
            firing(
                "KubePodCrashLooping",
                pod="api-5c8d9f7b6-m4n5p",
                instance="10.42.1.1:8080",
                pod_ip="10.42.1.1",
            ),
        )
    )
    (group,) = grouped.groups
    assert group.occurrences == 3 and group.instances == 3
    assert group.labels == {"namespace": "payments", "severity": "warning"}
    assert sorted(group.varying) == ["instance", "node", "pod", "pod_ip"]
    assert len(group.varying["pod"]) == 3


def test_a_different_alertname_severity_or_service_is_a_different_group() -> None:
    grouped = group_records(
        records(
            firing("HighErrorRate", service="payments-api", pod="a-7d9f8b6c4-x2x9z"),
            firing("HighErrorRate", service="payments-api", pod="a-7d9f8b6c4-q7w2k", severity="critical"),
            firing("HighErrorRate", service="checkout-api", pod="c-7d9f8b6c4-x2x9z"),
            firing("HighLatencyP99", service="payments-api", pod="a-7d9f8b6c4-x2x9z"),
        )
    )
    assert len(grouped.groups) == 4


def test_replica_hashes_in_other_label_values_are_masked() -> None:
    assert normalise_value("checkout-api-7d9f8b6c4-x2x9z") == "checkout-api-*"
    assert normalise_value("checkout-api-7d9f8b6c4") == "checkout-api-*"
    assert normalise_value("report-export-29411520") == "report-export-*"
    assert normalise_value("fluent-bit-x2x9z") == "fluent-bit-*"
    assert normalise_value("10.42.0.7:8080") == "*" and normalise_value("payments") == "payments"
    assert normalise_name("ledger-db-2") == "ledger-db-*"
    grouped = group_records(
        records(
            firing("KubeJobFailed", job_name="report-export-29411520"),
            firing("KubeJobFailed", job_name="report-export-29411580"),
            firing("KubeReplicaSetStuck", replicaset="api-7d9f8b6c4"),
            firing("KubeReplicaSetStuck", replicaset="api-5c8d9f7b6"),
        )
    )
    assert [g.occurrences for g in grouped.groups] == [2, 2]
    assert grouped.groups[0].labels["job_name"] == "report-export-*"


def test_a_repeated_firing_joins_its_group_and_a_repeated_notification_counts_once() -> None:
    again = firing("TargetDown", start="2026-11-30T12:00:00Z", instance="10.0.0.1:9100")
    first = firing("TargetDown", start="2026-11-30T10:00:00Z", instance="10.0.0.1:9100")
    grouped = group_records(records(first, again, dict(first), dict(again)))
    (group,) = grouped.groups
    assert group.occurrences == 2 and group.instances == 1  # fired twice, one target
    assert grouped.repeats_merged == 2 and group.repeats_merged == 2
    assert [r.at.hour for r in group.records if r.at] == [10, 12]


def test_a_webhook_dump_of_a_shift_groups_to_the_same_firings_as_the_api_export() -> None:
    alerts = generate_alerts(300)
    api = group_records(read_bytes(json.dumps(alerts).encode(), "api.json").records)
    dump = read_bytes(json.dumps(webhook_payloads(alerts)).encode(), "dump.json").records
    assert len(dump) > 2 * len(alerts)  # every notification repeats the group's active alerts
    hooks = group_records(dump)
    assert hooks.items == api.items == 300
    assert len(hooks.groups) == len(api.groups) < 30
    assert {g.name: g.occurrences for g in hooks.groups} == {g.name: g.occurrences for g in api.groups}


UID = "3f2a9c1e-1111-2222-3333-444455556666"


def test_kubernetes_events_of_one_deployment_group_and_a_newer_copy_replaces_the_older() -> None:
    def event(pod: str, uid: str, count: int) -> dict:
        return {
            "kind": "Event",
            "metadata": {"uid": uid, "namespace": "payments"},
            "involvedObject": {"kind": "Pod", "name": pod, "namespace": "payments"},
            "reason": "BackOff",
            "message": f"Back-off restarting failed container api in pod {pod}_payments({UID})",
            "type": "Warning",
            "count": count,
            "lastTimestamp": "2026-11-30T10:05:00Z",
        }

    lines = [
        event("api-7d9f8b6c4-x2x9z", "u1", 3),
        event("api-7d9f8b6c4-x2x9z", "u1", 9),  # the watch saw it again, count went up
        event("api-7d9f8b6c4-q7w2k", "u2", 4),
    ]
    result = read_bytes("\n".join(json.dumps(e) for e in lines).encode(), "events.jsonl")
    (group,) = group_records(result.records).groups
    assert group.occurrences == 13 and group.instances == 2 and group.repeats_merged == 1
    assert group.labels["object"] == "api-*"


def test_log_lines_group_by_their_template() -> None:
    assert template("payment 42 failed after 3000 ms from 10.1.2.3:443") == template(
        "payment 7 failed after 12 ms from 10.9.9.9:443"
    )
    text = "\n".join(
        [
            "2026-11-30T10:00:01Z ERROR payment 42 failed after 3000 ms",
            "2026-11-30T10:00:02Z ERROR payment 43 failed after 2500 ms",
            "2026-11-30T10:00:03Z INFO payment 44 settled",
        ]
    )
    grouped = group_records(read_bytes(text.encode(), "api.log").records)
    assert [(g.labels["level"], g.occurrences) for g in grouped.groups] == [("ERROR", 2), ("INFO", 1)]


def test_savings_are_counted_with_the_model_tokenizer_and_item_ids_are_stable(tiny_model: Path) -> None:
    tokenizer = HFChatTokenizer(str(tiny_model))
    builder = PromptBuilder(
        tokenizer,
        system_prompt=DEFAULT_SYSTEM_PROMPT,
        max_model_len=2048,
        context_share=0.45,
        history_share=0.2,
    )
    alerts = generate_alerts(200, seed=3)
    grouped = group_records(read_bytes(json.dumps(alerts).encode(), "a.json").records)
    plan = plan_work(grouped.groups, "alert_summary", builder, 64)
    s = plan.savings
    assert s.items == 200 and s.groups == len(grouped.groups) == len(plan.items)
    assert s.items_saved == 200 - s.groups
    assert s.tokens_grouped == sum(i.prompt_tokens for i in plan.items)
    system_tokens = tokenizer.count(DEFAULT_SYSTEM_PROMPT)
    assert s.tokens_each > 200 * system_tokens  # every lone item would have carried the system prompt
    assert 0 < s.tokens_saved < s.tokens_each
    assert all(i.prompt_tokens <= 2048 - 64 for i in plan.items)
    again = plan_work(
        group_records(read_bytes(json.dumps(alerts).encode(), "a.json").records).groups,
        "alert_summary",
        builder,
        64,
    )
    assert [i.id for i in again.items] == [i.id for i in plan.items]
    assert item_id("timeline", grouped.groups[0], 64) != plan.items[0].id
    body = describe_group(grouped.groups[0])
    assert "Shared labels:" in body and "Varies by" in body and "oldest first" in body
