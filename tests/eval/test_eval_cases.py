"""Case files: the built-in set, clear errors for bad files, and the Prometheus snapshot as the real
Prometheus provider reads it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.config import PrometheusSettings
from bot.context.base import ContextRequest
from bot.context.entities import extract
from bot.context.prometheus import PrometheusProvider
from bot.eval.cases import BUILTIN_CASES, CaseError, load_cases
from bot.eval.prom_api import PrometheusSnapshotServer, Series


def test_the_built_in_cases_are_at_least_20_and_each_says_what_a_right_answer_names():
    cases = load_cases([BUILTIN_CASES])
    assert len(cases) >= 20
    assert len({c.id for c in cases}) == len(cases)
    for case in cases:
        assert case.expect.objects and case.expect.reasons and case.expect.numbers, case.id
        assert case.cluster is not None, case.id
    assert sum(c.alert is not None for c in cases) >= 3  # alert notifications, not only questions
    reasons = " ".join(r for c in cases for options in c.expect.reasons for r in options)
    for reason in (
        "OOMKilled",
        "ImagePullBackOff",
        "readiness probe",
        "connection pool",
        "ProgressDeadlineExceeded",
        "MemoryPressure",
    ):
        assert reason in reasons


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("id: x\nquestion: q\nclustr: {}\n", "unknown case key(s) clustr"),
        ("id: x\nquestion: q\nalert: {labels: {alertname: A}}\n", "exactly one of question or alert"),
        ("id: Bad Id\nquestion: q\n", "needs an id"),
        (
            "id: x\nquestion: q\ncluster: {pods: [{name: p, containers: [{restrats: 3}]}]}\n",
            "unknown container key",
        ),
        ("id: x\nquestion: q\nexpect: {numbers: [[]]}\n", "must be text or a list of texts"),
        ("id: x\nquestion: [unclosed\n", "not valid YAML"),
    ],
)
def test_a_bad_case_file_is_refused_with_the_file_and_the_problem(tmp_path: Path, text: str, message: str):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(CaseError) as caught:
        load_cases([path])
    assert message in str(caught.value) and str(path) in str(caught.value)


def test_a_repeated_case_id_is_refused(tmp_path: Path):
    (tmp_path / "a.yaml").write_text("id: same\nquestion: q\n")
    (tmp_path / "b.yaml").write_text("id: same\nquestion: q2\n")
    with pytest.raises(CaseError, match="already used"):
        load_cases([tmp_path])


async def test_the_prometheus_snapshot_answers_the_providers_queries_with_the_recorded_series():
    server = PrometheusSnapshotServer(
        series=[
            Series(
                "container_memory_working_set_bytes",
                {"namespace": "payments", "pod": "api-7f9c8d6b5-x2x9q"},
                [268435456, 536870912],
            ),
            Series(
                "container_memory_working_set_bytes",
                {"namespace": "web", "pod": "api-1b2c3d4e5-aaaaa"},
                [1.0],
            ),
            Series("up", {"instance": "worker-3:9100", "job": "node"}, [0]),
        ]
    )
    await server.start()
    provider = PrometheusProvider(PrometheusSettings(enabled=True, url=server.url, timeout_s=5))
    try:
        question = "why is pod api-7f9c8d6b5-x2x9q in namespace payments slow?"
        result = await provider.fetch(
            ContextRequest(question, "root_cause", extract(question, None, ["payments"]))
        )
    finally:
        await provider.close()
        await server.stop()
    body = "\n".join(s.body for s in result.sections)
    assert 'memory {namespace="payments", pod="api-7f9c8d6b5-x2x9q"}: min 256.0 MiB, max 512.0 MiB' in body
    assert 'namespace="web"' not in body  # the query's namespace matcher filtered it out
    assert 'targets_down up{instance="worker-3:9100", job="node"}: 0' in body
    assert any("container_memory_working_set_bytes" in q for q in server.queries)
