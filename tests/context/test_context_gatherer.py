"""ContextGatherer: providers concurrently, per-provider timeouts, an overall deadline, a short cache,
redaction of everything gathered, and notes instead of failures."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from corpus import INJECTIONS, SECRETS, corpus_alert, corpus_cluster
from test_context_budget import WordTokenizer

from bot.config import Settings
from bot.context.budget import fit_to_budget
from bot.context.gatherer import ContextGatherer


def _dead_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def _settings(kubeconfig: Path | None, prometheus_url: str | None = None, **context: float) -> Settings:
    return Settings(
        kubernetes={"enabled": kubeconfig is not None, "kubeconfig": kubeconfig, "timeout_s": 3.0},
        prometheus={
            "enabled": prometheus_url is not None,
            "url": prometheus_url or "http://x",
            "timeout_s": 1.0,
        },
        context={"timeout_s": 4.0, "cache_ttl_s": 15.0, **context},
    )


async def test_rca_about_a_crash_looping_pod_gathers_status_events_and_log_tail_with_source_notes(kubeconfig):
    dead = _dead_url()
    gatherer = ContextGatherer.from_settings(_settings(kubeconfig, dead))
    try:
        bundle = await gatherer.gather(
            "/rca api-7f9c8d6b5-x2x9q in payments keeps crashing", scenario="root_cause"
        )
    finally:
        await gatherer.close()
    text = "\n".join(f"{s.title}\n{s.body}" for s in bundle.sections)
    assert "CrashLoopBackOff" in text and "BackOff x31" in text and "exiting (exit code 1)" in text
    notes = {n.name: n for n in bundle.notes}
    assert notes["Kubernetes"].status == "ok" and "Log of" in notes["Kubernetes"].detail
    # The provider pointed at a dead address is a note, not a failure of the whole answer.
    assert notes["Prometheus"].status == "failed"
    assert notes["Prometheus"].detail.startswith(f"Prometheus failed at {dead}: ")
    assert bundle.elapsed_ms > 0


async def test_a_slow_provider_times_out_with_a_note_naming_seconds_and_address(kubeconfig, fake_k8s):
    fake_k8s.delay(r"/pods$", 5.0)
    settings = _settings(kubeconfig)
    settings.kubernetes.timeout_s = 0.5
    gatherer = ContextGatherer.from_settings(settings)
    try:
        bundle = await gatherer.gather("what is broken?", scenario="chat")
    finally:
        await gatherer.close()
    (note,) = bundle.notes
    assert note.status == "timeout"
    assert note.detail == f"Kubernetes timed out after 0.5 s at {fake_k8s.url}"
    assert bundle.sections == []


async def test_the_overall_deadline_bounds_every_provider(kubeconfig, fake_k8s):
    fake_k8s.delay(r"/pods$", 5.0)
    gatherer = ContextGatherer.from_settings(_settings(kubeconfig, timeout_s=0.3))
    try:
        bundle = await gatherer.gather("what is broken?", scenario="chat")
    finally:
        await gatherer.close()
    assert bundle.notes[0].status == "timeout" and "after 0.3 s" in bundle.notes[0].detail


async def test_a_burst_of_questions_about_one_incident_asks_the_api_once(kubeconfig, fake_k8s):
    gatherer = ContextGatherer.from_settings(_settings(kubeconfig))
    try:
        question = "why is api-7f9c8d6b5-x2x9q crashing in namespace payments?"
        bundles = await asyncio.gather(*(gatherer.gather(question, scenario="root_cause") for _ in range(5)))
        await gatherer.gather(question, scenario="root_cause")  # cached
    finally:
        await gatherer.close()
    pod_lists = [r for r in fake_k8s.requests if r.split("?")[0].endswith("/pods")]
    assert len(pod_lists) == 1
    assert all(b.sections == bundles[0].sections for b in bundles)


async def test_no_gatherer_without_providers_still_turns_an_alert_into_context():
    gatherer = ContextGatherer.from_settings(_settings(None))
    payload = {
        "groupKey": '{}:{alertname="X"}',
        "status": "firing",
        "commonLabels": {"alertname": "X"},
        "alerts": [{"status": "firing", "labels": {"alertname": "X"}, "annotations": {"summary": "s"}}],
    }
    bundle = await gatherer.gather("alert", scenario="alert_summary", alert=payload)
    await gatherer.close()
    assert bundle.sections[0].source == "Alertmanager" and bundle.sections[0].priority == 0


async def test_planted_secrets_served_by_the_cluster_and_alert_never_reach_a_section(tmp_path):
    fake = corpus_cluster()
    await fake.start()
    try:
        settings = _settings(fake.write_kubeconfig(tmp_path / "kubeconfig"))
        settings.kubernetes.log_tail_lines = 5000
        gatherer = ContextGatherer.from_settings(settings)
        try:
            bundle = await gatherer.gather(
                "why is leaky-7d9f8c6b5-q8w2e failing in namespace corpus?",
                scenario="alert_summary",
                alert=corpus_alert(),
            )
        finally:
            await gatherer.close()
    finally:
        await fake.stop()
    text = "\n".join(f"{s.title}\n{s.body}" for s in bundle.sections) + "\n".join(
        n.detail for n in bundle.notes
    )
    # Everything was gathered: the planted places are all in the context, only the values are gone.
    assert "example.com/injection-0" in text and "LeakyServiceDown" in text and "env DB_PASSWORD=" in text
    leaked = [item for item in SECRETS if item.secret in text]
    assert leaked == [], f"{len(leaked)} secrets leaked, e.g. {leaked[0]}"
    # Injection strings arrive intact, as data inside sections, for the prompt builder to fence.
    for injection in INJECTIONS:
        assert injection.splitlines()[0] in text


async def test_what_does_not_fit_the_budget_is_listed_for_the_footer(kubeconfig):
    gatherer = ContextGatherer.from_settings(_settings(kubeconfig))
    try:
        bundle = await gatherer.gather("what is broken?", scenario="chat")
    finally:
        await gatherer.close()
    kept, left_out = fit_to_budget(bundle, WordTokenizer(), 400)
    assert kept[0].title.startswith("Cluster overview")
    assert left_out and any("older" in note or "more" in note for note in left_out)
