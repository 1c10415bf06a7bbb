"""Redacting the same text again: a clean text is passed over, a text with a secret is redacted
and counted every time (the pipeline, the store and the replay inputs each redact the same turns)."""

from __future__ import annotations

from prometheus_client import REGISTRY

from bot import redact as redaction
from bot.redact import REDACTED, redact


def redacted_total(where: str, kind: str) -> float:
    return REGISTRY.get_sample_value("opsbot_secrets_redacted_total", {"where": where, "kind": kind}) or 0.0


def test_a_clean_text_is_remembered_and_comes_back_unchanged_without_another_pass() -> None:
    text = "pod payments-api-7d9f restarted 4 times: OOMKilled at 512Mi, limit 512Mi"
    assert redact(text) == text
    assert text in redaction._clean  # the store's second pass over this turn is a lookup
    assert redact(text, where="store") == text


def test_a_text_with_a_secret_is_never_remembered_and_every_pass_redacts_and_counts_it() -> None:
    text = "connect with postgres://app:hunter2-not-real@db:5432/pay please"
    before = redacted_total("store", "url_password")
    first = redact(text, where="store")
    second = redact(text, where="store")
    assert first == second and "hunter2" not in first and REDACTED in first
    assert text not in redaction._clean
    assert redacted_total("store", "url_password") - before == 2


def test_the_memory_of_clean_texts_is_bounded() -> None:
    for k in range(redaction._CLEAN_MAX_ENTRIES + 50):
        redact(f"deployment web-{k} rolled out")
    assert len(redaction._clean) <= redaction._CLEAN_MAX_ENTRIES
    assert "deployment web-0 rolled out" not in redaction._clean  # the oldest went first
    long = "x " * redaction._CLEAN_MAX_CHARS
    assert redact(long) == long and long not in redaction._clean
