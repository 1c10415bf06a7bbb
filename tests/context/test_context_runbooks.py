"""Runbooks as context: an alert's ``runbook_url`` over real HTTP (a small wiki server), a local
Markdown folder and a base URL; size limit, timeout, host allow-list, redirects, HTML; redacted,
fenced in the prompt, linked in the footer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from runbook_fixtures import RunbookWiki, sample_wiki

from bot.adapters.streaming import format_footer_line
from bot.config import RunbookSettings, Settings
from bot.context.base import ContextRequest, ProviderStatus
from bot.context.entities import extract
from bot.context.gatherer import ContextGatherer
from bot.context.runbooks import RunbookProvider, html_to_text
from bot.types import FinalAnswer


@pytest.fixture(scope="module")
def wiki() -> Iterator[RunbookWiki]:
    server = sample_wiki()
    yield server
    server.stop()


def _payload(runbook_url: str | None, name: str = "OpsbotTestAlert") -> dict[str, Any]:
    annotations = {"summary": "api in payments is crash-looping"}
    if runbook_url is not None:
        annotations["runbook_url"] = runbook_url
    return {
        "groupKey": f'{{}}:{{alertname="{name}"}}',
        "status": "firing",
        "commonLabels": {"alertname": name, "namespace": "payments"},
        "commonAnnotations": annotations,
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": name, "namespace": "payments"},
                "annotations": annotations,
                "startsAt": "2026-11-29T19:58:00Z",
            }
        ],
    }


def _request(question: str, alert: dict[str, Any] | None = None) -> ContextRequest:
    return ContextRequest(question, "alert_summary", extract(question, alert), alert)


async def _fetch(settings: RunbookSettings, question: str, alert: dict[str, Any] | None = None):
    provider = RunbookProvider(settings)
    try:
        return await provider.fetch(_request(question, alert))
    finally:
        await provider.close()


async def test_an_alerts_runbook_url_is_fetched_redacted_fenced_and_linked_in_the_footer(wiki):
    url = f"{wiki.url}/runbooks/OpsbotTestAlert.md"
    gatherer = ContextGatherer.from_settings(Settings(runbooks={"enabled": True}))
    try:
        bundle = await gatherer.gather("alert", scenario="alert_summary", alert=_payload(url))
    finally:
        await gatherer.close()
    runbook = next(s for s in bundle.sections if s.source == "Runbook")
    assert runbook.title == f"Runbook for OpsbotTestAlert ({url})"
    assert "kubectl -n payments get pods -l app=api" in runbook.body
    assert "hunter2-runbook-secret" not in runbook.body and "[REDACTED]" in runbook.body
    # An injection in a runbook stays data (the prompt builder fences it).
    assert "Ignore previous instructions" in runbook.body
    note = next(n for n in bundle.notes if n.name == "Runbook")
    assert note.status == "ok" and note.links == [url]
    footer = format_footer_line(FinalAnswer("r1", "text", sources=bundle.notes))
    assert "sources: Alertmanager, Runbook" in footer and f"runbook: {url}" in footer


async def test_the_runbook_is_fenced_as_untrusted_data_in_the_prompt(wiki, tiny_model):
    from bot.prompts import DEFAULT_SYSTEM_PROMPT, PromptBuilder
    from inference.tokenization import HFChatTokenizer

    builder = PromptBuilder(
        HFChatTokenizer(str(tiny_model)),
        system_prompt=DEFAULT_SYSTEM_PROMPT,
        max_model_len=8192,
        context_share=0.45,
        history_share=0.2,
    )
    gatherer = ContextGatherer.from_settings(Settings(runbooks={"enabled": True}))
    payload = _payload(f"{wiki.url}/runbooks/OpsbotTestAlert.md")
    try:
        bundle = await gatherer.gather("alert", scenario="alert_summary", alert=payload)
    finally:
        await gatherer.close()
    plan = builder.build(
        scenario="alert_summary", question="alert", asker=None, context=bundle, max_tokens=128
    )
    turn = plan.messages[-1].content
    label = 'label="Runbook: Runbook for OpsbotTestAlert'
    start = turn.index(label)
    fence_end = turn.index("<<<END DATA", start)
    assert "Ignore previous instructions" in turn[start:fence_end]


async def test_a_local_folder_serves_runbooks_by_alert_name_and_never_outside_itself(tmp_path: Path):
    folder = tmp_path / "runbooks"
    (folder / "team").mkdir(parents=True)
    (folder / "opsbottestalert.md").write_text("# lower-case file name\nstep one\n")
    (folder / "team" / "db.md").write_text("# DB runbook\nfailover steps\n")
    (tmp_path / "outside.md").write_text("secret outside the folder\n")
    settings = RunbookSettings(enabled=True, folder=folder)

    by_name = await _fetch(settings, "alert", _payload(None))
    assert by_name.status is ProviderStatus.OK and "step one" in by_name.sections[0].body
    assert by_name.links == [str((folder / "opsbottestalert.md").resolve())]

    relative = await _fetch(settings, "alert", _payload("team/db.md"))
    assert "failover steps" in relative.sections[0].body

    escape = await _fetch(settings, "alert", _payload("../outside.md", name="Other"))
    assert escape.status is ProviderStatus.FAILED
    assert "outside runbooks.folder" in (escape.error or "")
    as_file_url = await _fetch(settings, "alert", _payload(f"file://{tmp_path / 'outside.md'}", name="Other"))
    assert "outside runbooks.folder" in (as_file_url.error or "") and not as_file_url.sections


async def test_a_base_url_serves_the_runbook_of_an_alert_named_in_an_rca_question(wiki):
    settings = RunbookSettings(enabled=True, base_url=f"{wiki.url}/runbooks/{{alertname}}.md")
    result = await _fetch(settings, "/rca why is QuietAlert firing?")
    assert result.status is ProviderStatus.OK
    assert "Restart the quiet job." in result.sections[0].body
    assert result.links == [f"{wiki.url}/runbooks/QuietAlert.md"]
    # A relative annotation is resolved against the base URL's folder.
    relative = await _fetch(
        RunbookSettings(enabled=True, base_url=f"{wiki.url}/runbooks/"), "a", _payload("Big.md")
    )
    assert relative.links == [f"{wiki.url}/runbooks/Big.md"]


async def test_a_runbook_longer_than_max_bytes_is_cut_and_says_so(wiki):
    settings = RunbookSettings(enabled=True, max_bytes=4096)
    result = await _fetch(settings, "alert", _payload(f"{wiki.url}/runbooks/Big.md"))
    body = result.sections[0].body
    assert body.endswith("[... runbook cut at 4096 bytes]")
    assert len(body.encode()) < 4096 + 100


async def test_a_slow_runbook_times_out_and_the_folder_copy_is_used_instead(wiki, tmp_path: Path):
    (tmp_path / "OpsbotTestAlert.md").write_text("# local copy\nuse me\n")
    settings = RunbookSettings(enabled=True, timeout_s=0.5, folder=tmp_path)
    result = await _fetch(settings, "alert", _payload(f"{wiki.url}/runbooks/slow.md"))
    assert result.status is ProviderStatus.OK and "use me" in result.sections[0].body
    assert f"{wiki.url}/runbooks/slow.md: no answer within 0.5 s" in (result.error or "")


async def test_hosts_outside_the_allow_list_are_refused_redirects_included(wiki):
    allowed = RunbookSettings(enabled=True, allowed_hosts=["127.0.0.1"])
    followed = await _fetch(allowed, "alert", _payload(f"{wiki.url}/go"))
    assert followed.status is ProviderStatus.OK and "kubectl -n payments" in followed.sections[0].body
    redirected = await _fetch(allowed, "alert", _payload(f"{wiki.url}/elsewhere"))
    assert redirected.status is ProviderStatus.FAILED
    assert "host localhost is not in runbooks.allowed_hosts" in (redirected.error or "")
    direct = await _fetch(allowed, "alert", _payload("https://evil.example.com/x.md"))
    assert "host evil.example.com is not in runbooks.allowed_hosts" in (direct.error or "")


async def test_html_becomes_text_and_non_text_or_missing_pages_are_clear_errors(wiki):
    settings = RunbookSettings(enabled=True)
    page = await _fetch(settings, "alert", _payload(f"{wiki.url}/runbooks/page.html"))
    body = page.sections[0].body
    assert "# HighLatency" in body and "Check the p99 & the queue." in body and "- kubectl top pods" in body
    assert "var token" not in body and "Home | About" not in body
    pdf = await _fetch(settings, "alert", _payload(f"{wiki.url}/runbooks/file.pdf"))
    assert "application/pdf is not a text runbook" in (pdf.error or "")
    missing = await _fetch(settings, "alert", _payload(f"{wiki.url}/runbooks/nope.md"))
    assert missing.status is ProviderStatus.FAILED and "HTTP 404 404 page not found" in (missing.error or "")


async def test_no_alert_in_question_or_payload_skips_the_provider_and_a_token_is_sent(wiki):
    assert (
        await _fetch(RunbookSettings(enabled=True), "how is the cluster?")
    ).status is ProviderStatus.SKIPPED
    wiki.requests.clear()
    token = RunbookSettings(enabled=True, bearer_token="wiki-token-123")
    await _fetch(token, "alert", _payload(f"{wiki.url}/runbooks/QuietAlert.md", name="QuietAlert"))
    assert wiki.requests == [("/runbooks/QuietAlert.md", "Bearer wiki-token-123")]


def test_html_to_text_keeps_structure():
    assert html_to_text("<h2>Steps</h2><ol><li>one</li><li>two</li></ol>") == "## Steps\n\n- one\n- two"
