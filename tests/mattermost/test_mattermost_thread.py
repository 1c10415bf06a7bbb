"""The thread as context on Mattermost, end to end: the fake server's ``GET /posts/{id}/thread``
(``perPage`` / ``direction=up`` / ``fromCreateAt`` / ``fromPost`` pages), ``GET /users/{id}``,
``GET /channels/{id}``, ``POST /files`` and ``file_ids`` posts, through the adapter's REST client;
the real pipeline on the CPU engine."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fakes.kubernetes_server import sample_cluster
from fakes.mattermost_server import FakeMattermost
from fakes.recording_engine import RecordingEngine
from mm_helpers import SLASH_TOKEN, BotFactory

from bot.config import Settings, ThreadSettings
from bot.context.gatherer import ContextGatherer
from bot.store import AlertThread
from inference.config import EngineConfig
from inference.cpu_engine import CpuEngine

pytestmark = pytest.mark.timeout(120)
FOOTER_MARK = "request `"


@pytest.fixture
async def engine(tiny_model: Path) -> AsyncIterator[RecordingEngine]:
    """The CPU engine of the other Mattermost tests, every request it is given kept."""
    inner = CpuEngine(
        EngineConfig(model=str(tiny_model), cpu_max_concurrency=2, cpu_threads=1, max_model_len=1024)
    )
    await inner.start()
    try:
        yield RecordingEngine(inner)
    finally:
        await inner.shutdown(1.0)


def answers_in(fake: FakeMattermost, root_id: str) -> list[dict[str, Any]]:
    return [p for p in fake.bot_posts() if p["root_id"] == root_id and FOOTER_MARK in p["message"]]


async def incident(fake: FakeMattermost) -> tuple[dict[str, Any], dict[str, str]]:
    """#inc-payments-db: alice reports, opsbot answered, dana and a CI bot wrote since."""
    alice, dana, bob = fake.add_user("alice"), fake.add_user("dana"), fake.add_user("bob")
    ci = fake.add_user("ci-bot", is_bot=True)
    channel = fake.add_channel("inc-payments-db", [alice, dana, bob, ci, fake.bot_user_id])
    who = {"alice": alice, "dana": dana, "bob": bob, "channel": channel}
    root = await fake.user_posts(alice, channel, "checkout returns 503s since 13:55")
    await fake.user_posts(alice, channel, "db graphs look odd", root_id=root["id"])
    await fake.user_posts(fake.bot_user_id, channel, "The database pool looks exhausted.", root_id=root["id"])
    await fake.user_posts(dana, channel, "I rolled back payments-api at 14:02", root_id=root["id"])
    await fake.user_posts(ci, channel, "build 4411 deployed", root_id=root["id"])
    await fake.user_posts(dana, channel, "creds: DB_PASSWORD=hunter2secretpw", root_id=root["id"])
    return root, who


async def test_a_follow_up_reads_the_thread_newest_first_page_by_page_and_sees_dana(
    fake: FakeMattermost, start_bot: BotFactory, engine: RecordingEngine
) -> None:
    bot = await start_bot()
    bot.pipeline.thread = ThreadSettings(page_size=2)
    root, w = await incident(fake)
    await fake.user_posts(
        w["bob"], w["channel"], "@opsbot given what Dana found, is the DB the cause?", root_id=root["id"]
    )
    await fake.wait_for(lambda: len(answers_in(fake, root["id"])) == 1)
    pages = fake.calls_to("GET", rf"/api/v4/posts/{root['id']}/thread")
    assert len(pages) == 4  # 7 posts, 2 a page, newest first
    assert all(c.query.get("direction") == "up" and c.query.get("perPage") == "2" for c in pages)
    assert "fromCreateAt" not in pages[0].query and all(c.query["fromPost"] for c in pages[1:])
    prompt = engine.last_prompt()
    assert "] dana: I rolled back payments-api at 14:02" in prompt
    assert "hunter2secretpw" not in prompt and "[REDACTED]" in prompt
    assert "build 4411" not in prompt  # another bot: the bot policy
    assert "opsbot: The database pool looks exhausted." in prompt  # not in the store: read back
    assert "_thinking" not in prompt


async def test_rca_summary_with_a_permalink_posts_a_catch_up_in_that_thread(
    fake: FakeMattermost, start_bot: BotFactory, engine: RecordingEngine
) -> None:
    bot = await start_bot()
    root, w = await incident(fake)
    reply = next(p for p in fake.thread(root["id"]) if p["message"].startswith("I rolled back"))
    link = f"{fake.url}/ops/pl/{reply['id']}"
    status, _, _ = await fake.send_slash_command(
        bot.command_url, token=SLASH_TOKEN, user_id=w["bob"], channel_id=w["channel"], text=f"summary {link}"
    )
    assert status == 200
    await fake.wait_for(lambda: len(answers_in(fake, root["id"])) == 1)
    request = engine.requests[-1]
    assert request.scenario == "thread_summary" and request.lane.value == "urgent"
    assert "Thread transcript (oldest first)" in engine.last_prompt()
    assert fake.calls_to("GET", rf"/api/v4/posts/{reply['id']}")


async def test_a_postmortem_is_attached_as_a_markdown_file_in_the_thread(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    await start_bot()
    root, w = await incident(fake)
    await fake.user_posts(w["bob"], w["channel"], "@opsbot draft a postmortem", root_id=root["id"])
    await fake.wait_for(lambda: len(answers_in(fake, root["id"])) == 1)
    (file,) = fake.files.values()
    assert file["name"].startswith("postmortem-") and file["name"].endswith(".md")
    assert file["size"] == len(file["data"]) > 0 and file["channel_id"] == w["channel"]
    (carrier,) = [p for p in fake.bot_posts() if p.get("file_ids")]
    assert carrier["root_id"] == root["id"] and carrier["file_ids"] == [file["id"]]
    assert carrier["metadata"]["files"][0]["name"] == file["name"]
    (answer,) = answers_in(fake, root["id"])
    assert "Postmortem draft attached" in answer["message"] and file["name"] in answer["message"]


async def test_a_refused_upload_leaves_the_draft_inline(fake: FakeMattermost, start_bot: BotFactory) -> None:
    await start_bot(retry={"initial_s": 0.01, "max_s": 0.05, "max_retries": 0})
    fake.add_fault("POST", "/api/v4/files", 413)
    root, w = await incident(fake)
    await fake.user_posts(w["bob"], w["channel"], "@opsbot postmortem", root_id=root["id"])
    await fake.wait_for(lambda: len(answers_in(fake, root["id"])) == 1)
    (answer,) = answers_in(fake, root["id"])
    assert "could not be attached as a file (POST /files: 413" in answer["message"]
    assert fake.files == {}


async def test_a_channel_scope_by_name_and_the_alerts_runbook_show_in_the_footer(
    fake: FakeMattermost, start_bot: BotFactory, tmp_path: Path, store: Any
) -> None:
    cluster = sample_cluster()
    await cluster.start()
    folder = tmp_path / "runbooks"
    folder.mkdir()
    (folder / "CheckoutDown.md").write_text("# CheckoutDown\n1. look at the payments api pods\n")
    bot = await start_bot()
    gatherer = ContextGatherer.from_settings(
        Settings(
            kubernetes={"enabled": True, "kubeconfig": cluster.write_kubeconfig(tmp_path / "kc")},
            context={"default_cluster": "eu-west"},
            scope={"channels": [{"match": ["#inc-payments-*"], "namespaces": ["payments"]}]},
            runbooks={"enabled": True, "folder": folder},
        )
    )
    bot.pipeline.context = gatherer
    try:
        root, w = await incident(fake)
        await store.save_alert_thread(
            AlertThread('{}:{alertname="CheckoutDown"}', "mattermost", w["channel"], root["id"], "firing")
        )
        await fake.user_posts(w["bob"], w["channel"], "@opsbot what is broken in web?", root_id=root["id"])
        await fake.wait_for(lambda: len(answers_in(fake, root["id"])) == 1)
    finally:
        await gatherer.close()
        await cluster.stop()
    (answer,) = answers_in(fake, root["id"])
    assert "scope: cluster eu-west, namespaces payments" in answer["message"]
    assert f"runbook: {(folder / 'CheckoutDown.md').resolve()}" in answer["message"]
    assert len(fake.calls_to("GET", rf"/api/v4/channels/{w['channel']}")) >= 1
    assert not any("/namespaces/web/" in r for r in cluster.requests)


async def test_a_bot_in_allowed_bots_is_kept_in_the_thread_context(
    fake: FakeMattermost, start_bot: BotFactory, engine: RecordingEngine
) -> None:
    await start_bot(allowed_bots=["ci-bot"])
    root, w = await incident(fake)
    await fake.user_posts(w["bob"], w["channel"], "@opsbot did the deploy finish?", root_id=root["id"])
    await fake.wait_for(lambda: len(answers_in(fake, root["id"])) == 1)
    assert "] ci-bot (bot): build 4411 deployed" in engine.last_prompt()
