"""Secret redaction: the planted corpus, key names kept, no false positives on ordinary ops text."""

from __future__ import annotations

import logging

import pytest
from corpus import INJECTIONS, SECRETS
from prometheus_client import REGISTRY

from bot.redact import REDACTED, RedactingFilter, is_secret_name, redact


def test_the_corpus_plants_at_least_200_secrets_in_every_place_and_50_injections():
    places = {item.where for item in SECRETS}
    assert len(SECRETS) >= 200
    assert places == {"logs", "events", "annotations", "env", "alert_labels"}
    assert len(INJECTIONS) >= 50


@pytest.mark.parametrize("item", SECRETS, ids=lambda item: f"{item.where}-{item.secret[:6]}")
def test_no_planted_secret_survives_redaction(item):
    assert item.secret not in redact(item.text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("DB_PASSWORD=hunter2x", "DB_PASSWORD=[REDACTED]"),
        ('{"client_secret": "abc def"}', '{"client_secret": "[REDACTED]"}'),
        ("  password: s3cr3t!", "  password: [REDACTED]"),
        ("Authorization: Bearer abc.def-123456", "Authorization: Bearer [REDACTED]"),
        ("postgres://app:pw-123@db:5432/app", "postgres://app:[REDACTED]@db:5432/app"),
        ("--api-key=zz9-plural", "--api-key=[REDACTED]"),
        ('{"name":"STRIPE_KEY","value":"sk_9a"}', '{"name":"STRIPE_KEY","value":"[REDACTED]"}'),
        ("Server=x;Password=p4ss;Encrypt=true", "Server=x;Password=[REDACTED];Encrypt=true"),
        ("{'user': 'bob', 'password': 'a b c'}", "{'user': 'bob', 'password': '[REDACTED]'}"),
        ("      DB_PASSWORD:  s3cr3t-value", "      DB_PASSWORD:  [REDACTED]"),
        ("GET /cb?code=1&access_token=abc.def&x=1", "GET /cb?code=1&access_token=[REDACTED]&x=1"),
    ],
)
def test_key_names_and_schemes_are_kept_and_only_the_value_is_replaced(text, expected):
    assert redact(text) == expected


ORDINARY = [
    "NAME                     READY   STATUS             RESTARTS      AGE\n"
    "api-7f9c8d6b5-x2x9q      0/1     CrashLoopBackOff   7 (2m ago)    1h\n"
    "worker-6d5f7c9b8-kq2lp   1/1     Running            4 (3m ago)    2h",
    "Back-off restarting failed container app in pod "
    "api-7f9c8d6b5-x2x9q_payments(5a1b2c3d-4e5f-6789-abcd-ef0123456789)",
    'Failed to pull image "registry.example.com/api@sha256:'
    '9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"',
    "commit 3b18e512dba79e4c8300dd08aeb37f8e728b8dad deployed to production",
    'container_memory_working_set_bytes{namespace="payments",pod="api-7f9c8d6b5-x2x9q"} 2.147483648e+09',
    'rate(http_requests_total{code=~"5.."}[5m]) = 0.042',
    "  tolerations:\n  - key: node.kubernetes.io/not-ready\n    operator: Exists",
    "failed to refresh token: context deadline exceeded",
    'Error: secret "db-creds" not found',
    "we use basic authentication and bearer authentication for the ingress",
    "tokenizer: llama3 max_tokens=512 prompt_tokens=1200 output_tokens=80",
    "TOKEN_TTL=30s password_min_length=12 SECRET_NAME=api-db PASSWORD_FILE=/run/secrets/db",
    "valueFrom:\n  secretKeyRef:\n    name: api-db\n    key: password",
    "tests: pass=12 fail=0",
    "      DB_PASSWORD:  <set to the key 'password' in secret 'api-db'>  Optional: false",
    "requests {'cpu': '250m', 'memory': '256Mi'}; limits {'cpu': '1', 'memory': '512Mi'}",
    "0/3 nodes are available: 3 Insufficient memory. preemption: 0/3 nodes are available",
    "kubelet has MemoryPressure; node worker-3 NotReady (NodeStatusUnknown)",
]


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_kubectl_output_and_metrics_are_left_alone(text):
    assert redact(text) == text


@pytest.mark.parametrize("text", INJECTIONS)
def test_injection_strings_are_not_mangled_by_redaction(text):
    # They must reach the prompt intact, to be fenced there as data.
    assert redact(text) == text


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("DB_PASSWORD", True),
        ("apiKey", True),
        ("x-api-key", True),
        ("ENCRYPTION_KEY", True),
        ("accessToken", True),
        ("db_pass", True),
        ("key", False),
        ("public_key", False),
        ("TOKEN_TTL", False),
        ("max_tokens", False),
        ("tokenizer", False),
        ("secret_name", False),
    ],
)
def test_secret_names_are_told_from_metadata_about_secrets(name, secret):
    assert is_secret_name(name) is secret


def _redacted_count(where: str, kind: str | None = None) -> float:
    """Replacements counted for ``where`` (of one ``kind``, or summed over every kind)."""
    total = 0.0
    for family in REGISTRY.collect():
        for sample in family.samples:
            labels = sample.labels
            named = sample.name == "opsbot_secrets_redacted_total" and labels.get("where") == where
            if named and (kind is None or labels.get("kind") == kind):
                total += sample.value
    return total


def test_each_replacement_is_counted_in_the_metric():
    before = _redacted_count("unit-test")
    redact("DB_PASSWORD=abc123x and API_TOKEN=zzz999y", where="unit-test")
    assert _redacted_count("unit-test") - before == 2


def test_replacements_are_counted_by_kind_of_secret():
    before_jwt = _redacted_count("unit-test-kind", "jwt")
    before_named = _redacted_count("unit-test-kind", "named_value")
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJl"
    redact(f"token {jwt} and DB_PASSWORD=abc123x", where="unit-test-kind")
    assert _redacted_count("unit-test-kind", "jwt") - before_jwt == 1
    assert _redacted_count("unit-test-kind", "named_value") - before_named == 1


def test_the_logging_filter_removes_secrets_from_messages_arguments_and_tracebacks():
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(self.format(record))

    handler = Collect()
    handler.addFilter(RedactingFilter())
    log = logging.getLogger("opsbot.test.redaction")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("connecting with %s", "postgres://app:pw-9876@db/app")
        log.warning("token=%s user=%s", "tok-abcdef-123", "alice")
        try:
            raise RuntimeError("Authorization: Bearer abcdef0123456789")
        except RuntimeError:
            log.exception("call failed")
    finally:
        log.removeHandler(handler)
    text = "\n".join(records)
    assert "pw-9876" not in text and "tok-abcdef-123" not in text and "abcdef0123456789" not in text
    assert "user=alice" in text and REDACTED in text and "Traceback" in text
