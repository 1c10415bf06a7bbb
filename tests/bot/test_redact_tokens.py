"""The vendor token table (bot/redact_tokens.py): every row finds a token built from its own data,
checksums tell real tokens from look-alikes, weak prefixes need a random-looking rest, and what
redaction leaves alone (placeholders, ids near secret words) stays as it is."""

from __future__ import annotations

import random
import re
import zlib

import pytest

from bot.redact import REDACTED, redact
from bot.redact_tokens import _ALPHABETS, SHAPES, TOKENS, WEBHOOKS, crc32_base62, find_tokens, looks_random


def _alphabet(name: str) -> str:
    """The characters of a named alphabet (its regular-expression class expanded)."""
    return "".join(chr(c) for c in range(33, 127) if re.fullmatch(f"[{_ALPHABETS[name]}]", chr(c)))


def _random_body(alphabet: str, length: int, rng: random.Random, weak: bool) -> str:
    while True:
        body = "".join(rng.choice(alphabet) for _ in range(length))
        # a weak prefix's body must read as random (letters and digits, see looks_random); no
        # body ends in a separator that would end the token before it
        if (looks_random(body) or not weak) and body[-1] not in "-_.=":
            return body


@pytest.mark.parametrize("row", TOKENS, ids=lambda t: f"{t.kind}:{t.prefix}")
def test_every_row_finds_a_token_made_from_its_own_prefix_alphabet_and_length(row) -> None:
    rng = random.Random(row.prefix)
    length = (row.min_len + row.max_len) // 2 if row.max_len < 400 else row.min_len + 20
    token = row.prefix + _random_body(_alphabet(row.alphabet), length, rng, row.weak)
    text = f"here it is: {token} (do not share)"
    spans = find_tokens(text)
    assert [(text[s:e], kind) for s, e, kind in spans] == [(token, row.kind)]
    assert token not in redact(text) and REDACTED in redact(text)


def test_a_row_does_not_take_a_run_longer_than_its_length_nor_a_shorter_one() -> None:
    # npm_ tokens are 36 characters after the prefix: 35 or 37 is some other string
    body = "Ab3dEf5hIj7lMn9pQr1tUv3xYz5bCd7fGh9j"
    assert find_tokens(f"npm_{body} x")
    for length in (35, 37):
        assert not find_tokens(f"npm_{(body + 'K')[:length]} x")


def test_the_github_checksum_accepts_a_real_shape_and_rejects_one_changed_character() -> None:
    body = "Ab3dEf5hIj7lMn9pQr1tUv3xYz5bCd"
    number, check = zlib.crc32(body.encode()), ""
    alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    while number:
        number, digit = divmod(number, 62)
        check = alphabet[digit] + check
    token = "ghp_" + body + check.rjust(6, "0")
    assert crc32_base62(token)
    assert not crc32_base62(token[:-1] + ("A" if token[-1] != "A" else "B"))


def test_a_weak_prefix_needs_a_random_rest_or_a_checksum() -> None:
    # "key-" + 32 hex is Mailgun's format, and also what a cache key can look like
    assert not find_tokens("cache key-" + "0" * 32)
    assert find_tokens("MAILGUN=key-" + "3f9a1c7e5b2d4f6a8c0e1b3d5f7a9c2e")


@pytest.mark.parametrize(
    ("kind", "token"),
    [
        ("jwt", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjaS1ib3QifQ.c2lnbmF0dXJlLXNpZ25hdHVyZQ"),
        ("telegram_bot_token", "123456789:AAH7d9Kf2LmN4pQ6rS8tU0vW2xY4zA6bC8d"),
        ("google_refresh_token", "1//0gAbCdEfGhIjKlMnOpQrStUvWxYz0123456789AbCdEfGhIjKlMn"),
        ("discord_bot_token", "MTA5ODc2NTQzMjEwOTg3NjU0Mw.GhIjKl.AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"),
        ("kubeadm_token", "abcdef.0123456789abcdef"),
        ("azure_client_secret", "Abc8Q~defGhIjKlMnOpQrStUvWxYz0123456789"),
        ("terraform_token", "abcdefgh012345.atlasv1." + "Ab1Cd2Ef3Gh4" * 5 + "Ab1Cd"),
        ("newrelic_key", "0123456789abcdef0123456789abcdef0123NRAL"),
        ("maxmind_key", "Ab12Cd_" + "Ef34Gh56Ij78Kl90Mn12Op34Qr56S" + "_mmk"),
        ("airtable_token", "patAbCdEfGhIjKlMn." + "0123456789abcdef" * 4),
    ],
)
def test_every_shape_row_finds_its_example(kind: str, token: str) -> None:
    assert kind in {row[0] for row in SHAPES}
    text = f"value {token} end"
    assert [(text[s:e], k) for s, e, k in find_tokens(text)] == [(token, kind)]


@pytest.mark.parametrize(
    ("kind", "url", "secret"),
    [
        ("slack_webhook", "https://hooks.slack.com/services/T000/B000/XXXXsecret", "T000/B000/XXXXsecret"),
        ("discord_webhook", "https://discord.com/api/webhooks/123456/AbC-dEf_123", "AbC-dEf_123"),
        (
            "teams_webhook",
            "https://acme.webhook.office.com/webhookb2/a@b/IncomingWebhook/0123abcd/4567-ef",
            "0123abcd/4567-ef",
        ),
        ("telegram_bot_token", "https://api.telegram.org/bot12345:AAbcd/sendMessage", "12345:AAbcd"),
        ("zapier_webhook", "https://hooks.zapier.com/hooks/catch/123/abcXYZ/", "abcXYZ"),
        (
            "pagerduty_key",
            "https://events.pagerduty.com/integration/0123456789abcdef0123/enqueue",
            "0123456789abcdef0123",
        ),
        ("ifttt_key", "https://maker.ifttt.com/trigger/deploy/with/key/AbC123xyz", "AbC123xyz"),
        ("azure_function_key", "https://fn.azurewebsites.net/api/run?code=Ab12Cd==&x=1", "Ab12Cd=="),
        (
            "google_chat_webhook",
            "https://chat.googleapis.com/v1/spaces/AAA/messages?key=AIzaK&token=T0k",
            "AIzaK",
        ),
    ],
)
def test_every_webhook_row_hides_its_secret_and_keeps_the_host(kind: str, url: str, secret: str) -> None:
    assert kind in {row[0] for row in WEBHOOKS}
    out = redact(f"notify: {url}")
    assert secret not in out and REDACTED in out and url.split("/")[2] in out


@pytest.mark.parametrize(
    "text",
    [
        "password: ${DB_PASSWORD}",
        "  password: {{ .Values.postgresql.auth.password | quote }}",
        "  token: ${{ secrets.DEPLOY_TOKEN }}",
        "password: ****",
        "DB_PASSWORD: ref+vault://secret/data/payments/db#password",
        "    checksum/secret: 8bce85cd2cd3e00dfac7c3607b17f70a98975cbe6709572d66e10e453bdce77c",
        "kubeadm join 10.0.0.10:6443 --token $JOIN_TOKEN --discovery-token-ca-cert-hash sha256:"
        "8bce85cd2cd3e00dfac7c3607b17f70a98975cbe6709572d66e10e453bdce77c",
        "the token refresh fix landed in 3f2b9c1e8a4d4e1f9c2a5b7d0e6f1a2c3b4d5e6f",
        "token validation slow: trace_id=4bf92f3577b34da6a3ce929d0e0e4736 span_id=00f067aa0ba902b7",
        "idempotency_key=9b2f1c6e-1d7a-4c1e-b0b4-2f0d3c1e5a77 level=info",
        "the password is rotated every 30 days by the operator",
        "Authorization: Bearer $TOKEN",
    ],
)
def test_placeholders_and_ids_near_secret_words_stay(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        (
            "datadog api key for the new org is 3f9c2a7b1e4d6f8a0c2e4b6d8f0a1c3e",
            "3f9c2a7b1e4d6f8a0c2e4b6d8f0a1c3e",
        ),
        ("nomad token 5b7d0e6f-1a2c-4e1f-9c2a-3f2b9c1e8a4d", "5b7d0e6f-1a2c-4e1f-9c2a-3f2b9c1e8a4d"),
        ('{"routing_key": "t5gydn047zw8ocau6mnqkjemftu57ig6"}', "t5gydn047zw8ocau6mnqkjemftu57ig6"),
    ],
)
def test_the_entropy_fallback_hides_a_random_string_right_after_a_secret_word(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out and REDACTED in out
