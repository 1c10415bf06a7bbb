"""Every input format opsbot analyze reads, and bad lines reported with their line numbers."""

from __future__ import annotations

import gzip
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bot.analyze.readers import InputError, filter_window, parse_time, parse_when, read_bytes, read_path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from gen_alerts import generate_alerts, webhook_payloads  # noqa: E402


def alert(
    name: str = "KubePodCrashLooping", pod: str = "api-7d9f8b6c4-x2x9z", start: str = "2026-11-30T10:00:00Z"
):
    return {
        "labels": {"alertname": name, "namespace": "payments", "pod": pod, "severity": "warning"},
        "annotations": {"summary": f"Pod payments/{pod} is crash looping"},
        "startsAt": start,
        "endsAt": "2026-11-30T10:30:00Z",
        "fingerprint": f"fp-{pod}",
        "status": {"state": "active", "silencedBy": [], "inhibitedBy": []},
    }


def event(reason: str = "BackOff", name: str = "api-7d9f8b6c4-x2x9z", count: int = 3, uid: str = "u1"):
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.17a", "namespace": "payments", "uid": uid},
        "involvedObject": {"kind": "Pod", "name": name, "namespace": "payments"},
        "reason": reason,
        "message": f"Back-off restarting failed container api in pod {name}",
        "type": "Warning",
        "count": count,
        "firstTimestamp": "2026-11-30T10:00:00Z",
        "lastTimestamp": "2026-11-30T10:05:00Z",
        "source": {"component": "kubelet"},
    }


def test_an_alertmanager_api_export_is_a_list_of_alerts_with_times_and_fingerprints() -> None:
    alerts = generate_alerts(50)
    result = read_bytes(json.dumps(alerts, indent=1).encode(), "alerts.json")
    assert result.format == "json" and not result.bad_lines
    assert len(result.records) == 50
    first = result.records[0]
    assert first.kind == "alert" and first.name == alerts[0]["labels"]["alertname"]
    assert first.at == datetime.fromisoformat(alerts[0]["startsAt"].replace("Z", "+00:00"))
    assert first.identity == alerts[0]["fingerprint"] and first.status == "firing"


def test_a_webhook_notification_and_a_dump_of_several_give_every_alert() -> None:
    payloads = webhook_payloads(generate_alerts(30))
    one = read_bytes(json.dumps(payloads[0], indent=2).encode(), "notification.json")
    assert len(one.records) == len(payloads[0]["alerts"]) and not one.bad_lines
    dump = read_bytes(json.dumps(payloads).encode(), "dump.json")
    assert len(dump.records) == sum(len(p["alerts"]) for p in payloads)
    resolved = dict(payloads[0], status="resolved")
    resolved["alerts"] = [
        dict(a, status="resolved", endsAt="2026-11-30T11:00:00Z") for a in payloads[0]["alerts"]
    ]
    back = read_bytes(json.dumps(resolved).encode(), "r.json").records
    assert all(r.status == "resolved" and r.ends_at is not None for r in back)


def test_jsonl_mixes_alerts_notifications_events_watch_events_and_structured_logs() -> None:
    lines = [
        alert(),
        webhook_payloads([alert(pod="api-7d9f8b6c4-abcde")])[0],
        event(),
        {"type": "MODIFIED", "object": event(count=5)},
        {"type": "DELETED", "object": event(uid="gone")},
        {  # events.k8s.io/v1
            "regarding": {"kind": "Deployment", "name": "api", "namespace": "payments"},
            "reason": "ScalingReplicaSet",
            "note": "Scaled up replica set api-5c8d9f7b6 to 3",
            "type": "Normal",
            "eventTime": "2026-11-30T10:01:00.000000Z",
            "reportingController": "deployment-controller",
            "metadata": {"uid": "u9"},
        },
        {
            "ts": 1796032800.5,
            "level": "error",
            "msg": "payment declined: upstream timeout",
            "logger": "charges",
        },
    ]
    text = "\n".join(json.dumps(v) for v in lines) + "\n"
    result = read_bytes(text.encode(), "mixed.jsonl")
    assert not result.bad_lines, result.bad_lines
    kinds = [r.kind for r in result.records]
    assert kinds == ["alert", "alert", "event", "event", "event", "log"]
    modern = result.records[4]
    assert modern.name == "ScalingReplicaSet" and modern.labels["component"] == "deployment-controller"
    assert modern.at == datetime(2026, 11, 30, 10, 1, tzinfo=UTC)
    log = result.records[5]
    assert log.labels == {"file": "charges", "level": "ERROR"} and log.at is not None


def test_kubectl_get_events_json_is_an_event_list() -> None:
    doc = {"apiVersion": "v1", "kind": "List", "items": [event(uid="a"), event(uid="b", name="db-0")]}
    result = read_bytes(json.dumps(doc, indent=2).encode(), "events.json")
    assert [r.labels["object"] for r in result.records] == ["api-7d9f8b6c4-x2x9z", "db-0"]
    assert all(r.count == 3 for r in result.records)


def test_bad_jsonl_lines_are_reported_with_their_line_numbers_and_skipped() -> None:
    text = "\n".join(
        [
            json.dumps(alert()),
            "{not json",
            "",
            json.dumps({"labels": {"severity": "warning"}, "startsAt": "2026-11-30T10:00:00Z"}),
            json.dumps(alert(start="yesterday")),
            json.dumps([1, 2]),
            json.dumps({"hello": "world"}),
            json.dumps(alert(pod="api-7d9f8b6c4-zzzzz")),
        ]
    )
    result = read_bytes(text.encode(), "alerts.jsonl")
    assert len(result.records) == 2
    by_line = {b.line: b.reason for b in result.bad_lines}
    assert set(by_line) == {2, 4, 5, 6, 7}
    assert "not JSON" in by_line[2]
    assert "alertname" in by_line[4]
    assert "startsAt" in by_line[5] and "yesterday" in by_line[5]
    assert "expected a JSON object" in by_line[6]
    assert "not an alert" in by_line[7]
    assert str(result.bad_lines[0]).startswith("alerts.jsonl line 2: ")


def test_bad_elements_of_a_json_array_carry_the_line_they_start_on() -> None:
    items = [alert(), {"labels": {}}, alert(pod="b-7d9f8b6c4-qqqqq")]
    text = json.dumps(items, indent=2)
    expected_line = text.splitlines().index("  {", 10) + 1  # the second element's opening brace
    result = read_bytes(text.encode(), "export.json")
    assert len(result.records) == 2
    (bad,) = result.bad_lines
    assert bad.line == expected_line and "alertname" in bad.reason


def test_a_json_file_broken_midway_keeps_what_came_before_and_names_the_line() -> None:
    good = json.dumps([alert(), alert(pod="b-7d9f8b6c4-qqqqq")], indent=2)
    broken = good[: good.rindex("{")] + '{"labels": {"alertname": "X"}, oops\n]'
    result = read_bytes(broken.encode(), "cut.json")
    assert len(result.records) == 1
    (bad,) = result.bad_lines
    assert bad.line == broken[: broken.index("oops")].count("\n") + 1
    assert "rest of the file was skipped" in bad.reason


def test_a_folder_of_logs_reads_iso_klog_syslog_json_and_gzip_with_stack_traces_joined(
    tmp_path: Path,
) -> None:
    logs = tmp_path / "logs"
    (logs / "api").mkdir(parents=True)
    (logs / "api" / "api-2026-11-30.log").write_text(
        "2026-11-30T10:00:01.123Z ERROR payment 42 failed: timeout after 3000 ms\n"
        "Traceback (most recent call last):\n"
        '  File "app.py", line 3, in charge\n'
        "TimeoutError: upstream\n"
        "2026-11-30 10:00:02,500 [WARN] retrying payment 42\n"
        "no timestamp here at all\n"
    )
    (logs / "kubelet.log").write_text(
        "E1130 10:00:03.000001    1234 pod_workers.go:1298] Error syncing pod api-7d9f8b6c4-x2x9z\n"
    )
    (logs / "syslog").write_text("Nov 30 10:00:04 ip-10-0-1-2 kernel: Out of memory: Killed process 4242\n")
    (logs / "app.log.1.gz").write_bytes(
        gzip.compress(b'{"time": "2026-11-30T10:00:05Z", "level": "info", "msg": "deployed v2.3.1"}\n')
    )
    (logs / "core.bin").write_bytes(b"\x00\x01\x02garbage")
    (logs / ".hidden.log").write_text("2026-11-30T10:00:00Z ERROR never read\n")
    result = read_path(logs)
    texts = {r.text.splitlines()[0]: r for r in result.records}
    assert result.files == 5
    first = texts["payment 42 failed: timeout after 3000 ms"]
    assert first.labels == {"file": "api", "level": "ERROR"} and "TimeoutError: upstream" in first.text
    assert texts["retrying payment 42"].labels["level"] == "WARNING"
    assert texts["no timestamp here at all"].at is None and result.without_time == 1
    klog = texts["Error syncing pod api-7d9f8b6c4-x2x9z"]
    assert klog.labels["level"] == "ERROR" and klog.at is not None and klog.at.hour == 10
    assert texts["Out of memory: Killed process 4242"].labels["file"] == "kernel"
    assert texts["deployed v2.3.1"].labels == {"file": "app", "level": "INFO"}
    (binary,) = result.bad_lines
    assert binary.source == "core.bin" and "binary" in binary.reason


def test_an_input_that_cannot_be_read_at_all_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        read_path(tmp_path / "missing.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="empty folder"):
        read_path(tmp_path / "empty")


def test_times_windows_and_when_arguments() -> None:
    assert parse_time("0001-01-01T00:00:00Z") is None
    assert parse_time("2026-11-30T10:00:00.123456789Z") == datetime(
        2026, 11, 30, 10, 0, 0, 123456, tzinfo=UTC
    )
    assert parse_time(1796032800000) == parse_time(1796032800)
    now = datetime(2026, 11, 30, 16, 0, tzinfo=UTC)
    assert parse_when("8h", now=now) == datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    assert parse_when("2026-11-30T09:00") == datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_when("last tuesday")
    records = read_bytes(
        "\n".join(
            json.dumps(alert(pod=f"p{i}", start=f"2026-11-30T{h:02d}:00:00Z"))
            for i, h in enumerate((8, 12, 15))
        ).encode(),
        "a.jsonl",
    ).records
    kept, dropped = filter_window(records, parse_when("2026-11-30T09:00Z"), parse_when("2026-11-30T15:00Z"))
    assert [r.at.hour for r in kept if r.at] == [12] and dropped == 2
