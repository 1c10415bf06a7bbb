"""Feedback becomes eval cases: request rows keep their replay inputs (migration 0003, SQLite and
PostgreSQL), ``opsbot feedback export`` writes rated answers as JSONL, ``opsbot eval`` runs it."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fixtures_pg import pg_url  # noqa: F401  (re-exported fixture)
from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import create_async_engine

from bot.cli import main
from bot.config import StoreSettings
from bot.eval.feedback import grounded_expectation
from bot.replay import bundle_from_dict, decode
from bot.store import RequestRecord, Store, migrate

GOOD_ANSWER = (
    "Pod worker-6d5f7c9b8-kq2lp is OOMKilled (exit code 137): its memory climbs to the 512Mi limit "
    "while it allocates a 2Gi buffer. Raise the limit or shrink the buffer."
)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'opsbot.db'}"
    return str(request.getfixturevalue("pg_url"))


async def _columns(url: str) -> set[str]:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            cols = await conn.run_sync(lambda sync: inspect(sync).get_columns("opsbot_requests"))
            return {c["name"] for c in cols}
    finally:
        await engine.dispose()


async def test_migration_0003_adds_replay_inputs_keeps_older_rows_and_goes_back_down(db_url: str):
    settings = StoreSettings(retry={"initial_s": 0.02, "max_s": 0.2})
    assert await migrate.upgrade(db_url, settings, revision="0001") == "0001"
    engine = create_async_engine(db_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO opsbot_requests (request_id, platform, scenario, lane, status, "
                    "prompt_tokens, cached_tokens, output_tokens, created_at) "
                    "VALUES ('old', 'slack', 'chat', 'normal', 'ok', 0, 0, 0, :at)"
                ),
                {"at": datetime(2026, 11, 30, tzinfo=UTC)},
            )
        # Up to head: the store writes with today's columns (later revisions add more than 0003).
        assert await migrate.upgrade(db_url, settings) == migrate.head_revision()
        assert "replay_inputs" in await _columns(db_url)
        store = await Store.open(db_url, settings, upgrade=False)
        try:
            await store.record_request(
                RequestRecord(
                    "new", "slack", "C1", "t", "U1", "chat", "normal", "ok", replay_inputs='{"version": 1}'
                )
            )
            await store.close()
        except BaseException:
            await store.close()
            raise
        async with engine.connect() as conn:
            rows = dict(
                (await conn.execute(text("SELECT request_id, replay_inputs FROM opsbot_requests"))).all()
            )
        assert rows == {"old": None, "new": '{"version": 1}'}
        assert await migrate.downgrade(db_url, "0001", settings) == "0001"
        assert "replay_inputs" not in await _columns(db_url)
        async with engine.connect() as conn:
            assert (await conn.execute(text("SELECT count(*) FROM opsbot_requests"))).scalar() == 2
    finally:
        await engine.dispose()


def test_grounded_expectation_keeps_only_facts_the_context_shows():
    context = (
        "payments/worker-6d5f7c9b8-kq2lp | Running | restarts 4 | last terminated OOMKilled exit code 137\n"
        "limits {'memory': '512Mi'}\ndeployment payments/worker | revision 3"
    )
    answer = GOOD_ANSWER + " The worker deployment on node worker-9 uses 99 MiB."
    expect = grounded_expectation(answer, context)
    assert expect.objects == [["worker-6d5f7c9b8-kq2lp"], ["worker"]]  # worker-9 is not in the context
    assert expect.reasons == [["OOMKilled"]]
    assert expect.numbers == [["137"], ["512Mi"]]  # 2Gi and 99 are not in the context


def test_rated_answers_export_as_jsonl_that_opsbot_eval_replays(
    eval_env: Path,
    tiny_engine_config: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
):
    import asyncio

    # 1. A real answer through the pipeline: its row keeps the replay inputs.
    first = eval_env / "first"
    code = main(
        [
            "eval",
            "--out",
            str(first),
            "--engine-config",
            str(tiny_engine_config),
            "--case",
            "oom-worker",
            "--max-tokens",
            "3",
        ]
    )
    assert code == 0, capsys.readouterr().err
    db = f"sqlite+aiosqlite:///{first / 'eval.db'}"
    report = json.loads((first / "report.json").read_text())
    answered_id = report["cases"][0]["request_id"]

    async def rate() -> dict[str, object]:
        store = await Store.open(db, StoreSettings())
        try:
            rows = await store.requests_between(datetime(2020, 1, 1, tzinfo=UTC))
            assert [r.request_id for r in rows] == [answered_id]
            rated = await store.rated_requests(datetime(2020, 1, 1, tzinfo=UTC))
            assert rated == []  # nobody voted yet
            engine = store.engine
            async with engine.connect() as conn:
                stored = (
                    await conn.execute(
                        text("SELECT replay_inputs FROM opsbot_requests WHERE request_id = :id"),
                        {"id": answered_id},
                    )
                ).scalar()
            inputs = decode(stored)
            # A second request with the same stored context and a good answer, and a disliked one.
            for request_id, answer, vote in (
                ("goodanswer1", GOOD_ANSWER, 1),
                ("badanswer1", "It is DNS.", -1),
            ):
                await store.record_request(
                    RequestRecord(
                        request_id,
                        "slack",
                        "C1",
                        "t1",
                        "U1",
                        "root_cause",
                        "normal",
                        "ok",
                        model="m",
                        replay_inputs=stored,
                    )
                )
                await store.append_message(
                    "slack", "C1", request_id, "assistant", answer, request_id=request_id
                )
                await store.record_feedback(request_id, "slack", "U1", vote)
            await store.record_feedback(answered_id, "eval", "U2", 1)
            return inputs
        finally:
            await store.close()

    inputs = asyncio.run(rate())
    assert "worker-6d5f7c9b8-kq2lp" in inputs["question"] and inputs["scenario"] == "root_cause"
    bundle = bundle_from_dict(inputs["context"])
    assert any("OOMKilled exit code 137" in s.body for s in bundle.sections)
    assert {n.name for n in bundle.notes} == {"Kubernetes", "Prometheus"}

    # 2. Export the rated answers.
    monkeypatch.setenv("OPSBOT_STORE__URL", db)
    cases_file = eval_env / "rated.jsonl"
    assert main(["feedback", "export", "--out", str(cases_file)]) == 0
    assert "wrote 3 rated answers" in capsys.readouterr().err
    lines = [json.loads(line) for line in cases_file.read_text().splitlines()]
    by_id = {line["request_id"]: line for line in lines}
    good = by_id["goodanswer1"]
    assert good["feedback"] == 1 and good["reference_answer"] == GOOD_ANSWER
    assert good["expect"]["objects"][0] == ["worker-6d5f7c9b8-kq2lp"]
    assert ["OOMKilled"] in good["expect"]["reasons"]
    assert ["512Mi"] in good["expect"]["numbers"] and ["137"] in good["expect"]["numbers"]
    assert by_id["badanswer1"]["expect"] == {"objects": [], "reasons": [], "numbers": []}
    assert main(["feedback", "export", "--out", str(eval_env / "up.jsonl"), "--rating", "up"]) == 0
    assert len((eval_env / "up.jsonl").read_text().splitlines()) == 2

    # 3. opsbot eval replays them with their stored context.
    second = eval_env / "second"
    code = main(
        [
            "eval",
            str(cases_file),
            "--out",
            str(second),
            "--engine-config",
            str(tiny_engine_config),
            "--max-tokens",
            "3",
        ]
    )
    assert code == 0, capsys.readouterr().err
    replayed = json.loads((second / "report.json").read_text())
    assert len(replayed["cases"]) == 3
    for case in replayed["cases"]:
        assert case["status"] == "ok"
        assert "last terminated OOMKilled exit code 137" in case["prompt"]
        assert "worker-6d5f7c9b8-kq2lp in payments keep restarting" in case["prompt"]
        assert case["sources"] == ["Kubernetes ok", "Prometheus ok"]
    scored = {c["id"]: c for c in replayed["cases"]}
    assert scored["feedback-goodanswer1"]["not_in_context"] == []
    assert scored["feedback-goodanswer1"]["score"]["numbers_expected"] == len(good["expect"]["numbers"])
    # No expectation: neither passed nor failed, unless the (random, 3-token) answer itself failed
    # (empty or an echo after cleaning), which counts as a failure whatever was expected.
    bad = scored["feedback-badanswer1"]["score"]
    assert bad["passed"] is (None if bad["failure"] is None else False)
    judged = {c["id"] for c in lines if any(c["expect"].values())}
    judged |= {case_id for case_id, case in scored.items() if case["score"]["failure"] is not None}
    assert replayed["totals"]["passed"]["of"] == len(judged)


def test_replay_inputs_are_redacted_and_round_trip_the_bundle():
    from bot.context.base import ContextBundle, ContextSection
    from bot.replay import encode
    from bot.store.records import ThreadMessage
    from bot.types import SourceNote

    key = "AKIA" + "Q7RT2XK9ZL4MWB8N"
    bundle = ContextBundle(
        sections=[ContextSection("Kubernetes", "Log tail of shop/a-1/app", f"using key {key}\nok", 30)],
        notes=[SourceNote("Kubernetes", "ok", "Log tail")],
        elapsed_ms=12.0,
    )
    history = [ThreadMessage("user", f"my key is {key}", "U1", datetime(2026, 12, 1, tzinfo=UTC), None)]
    stored = encode(
        question=f"why? {key}",
        asker="alice",
        scenario="root_cause",
        max_tokens=512,
        system_prompt="be brief",
        history=history,
        bundle=bundle,
    )
    assert key not in stored
    back = bundle_from_dict(decode(stored)["context"])
    assert back.sections[0].title == "Log tail of shop/a-1/app" and back.sections[0].body.endswith("\nok")
    assert back.sections[0].priority == 30 and back.notes[0].name == "Kubernetes"
    with pytest.raises(ValueError, match="unknown format"):
        decode('{"version": 99}')
