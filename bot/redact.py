"""Secret redaction: everything opsbot puts in a prompt, a stored row, a log line or a chat message
passes through :func:`redact` first.

What is replaced (by ``[REDACTED]``; names of keys, URL users and auth schemes are kept so the text
still reads): private key blocks; bearer / basic / token ``Authorization`` credentials; tokens of
known shapes (AWS access key ids, GCP API keys and OAuth tokens, GitHub, GitLab, Slack, Stripe,
npm, Hugging Face, OpenAI-style ``sk-`` keys, SendGrid, JWTs, Slack webhook URLs); passwords in
URLs (``scheme://user:pw@host``); and the value of any ``key=value`` / ``key: value`` /
``"key": "value"`` / ``--key value`` whose key is named like a secret (``*secret*``, ``*token*``,
``*password*``, ``*credential*``, ``api_key``, ``*_KEY``), including Kubernetes env entries
(``{"name": "DB_PASSWORD", "value": ...}``).

Ordinary text is left alone on purpose: there is no "high entropy string" rule, because pod-name
hashes, image digests, commit SHAs and UUIDs are what an incident is about.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from collections.abc import Callable

from bot import metrics

REDACTED = "[REDACTED]"
"""What a secret is replaced by."""

# Name components that mark a key as secret ("DB_PASSWORD", "clientSecret", "x-api-key").
_SECRET_WORDS = frozenset(
    {
        "secret",
        "secrets",
        "token",
        "password",
        "passwords",
        "passwd",
        "pwd",
        "passphrase",
        "credential",
        "credentials",
        "creds",
        "apikey",
        "privatekey",
        "accesskey",
        "secretkey",
        "accountkey",
        "authtoken",
        "sas",
        "cookie",
        "session",
        "sessionid",
        "dsn",
    }
)
# A last component that says the value is metadata about a secret, not the secret itself.
_METADATA_WORDS = frozenset(
    {
        "ttl",
        "expiry",
        "expires",
        "expiration",
        "length",
        "len",
        "count",
        "size",
        "timeout",
        "interval",
        "file",
        "path",
        "dir",
        "name",
        "names",
        "ref",
        "type",
        "enabled",
        "id",
        "ids",
        "version",
        "kind",
        "mode",
        "format",
        "age",
        "lifetime",
        "endpoint",
        "url",
        "uri",
        "header",
        "source",
        "provider",
        "policy",
        "rotation",
        "namespace",
        "key",
    }
)
_WORD_SPLIT = re.compile(r"[_.\-/\s]+|(?<=[a-z0-9])(?=[A-Z])")


def is_secret_name(name: str) -> bool:
    """True when a key or variable named ``name`` holds a secret (``DB_PASSWORD``, ``apiKey``,
    ``ENCRYPTION_KEY``), false for metadata about secrets (``TOKEN_TTL``, ``password_file``)."""
    parts = [p.lower() for p in _WORD_SPLIT.split(name.strip("\"'-")) if p]
    if not parts:
        return False
    last = parts[-1]
    # "api_key", "ENCRYPTION_KEY", "accountKey": a compound ending in key; bare "key" is too common
    # (tolerations, label selectors) to count.
    if last in {"key", "keys"} and len(parts) >= 2 and parts[-2] not in {"public", "primary", "sort", "hot"}:
        return True
    # "DB_PASS", "SMTP_PASS"; bare "pass" is test-runner talk ("pass=12 fail=0").
    if last == "pass" and len(parts) >= 2:
        return True
    if last in _METADATA_WORDS:
        return False
    joined = "".join(parts)
    if joined.endswith("token"):  # "accesstoken", "authToken"; not "tokenizer" nor "max_tokens"
        return True
    if any(word in joined for word in ("password", "passwd", "secret", "credential", "apikey", "privatekey")):
        return True
    return any(p in _SECRET_WORDS for p in parts)


_Rule = tuple[str, re.Pattern[str], Callable[[re.Match[str]], str]]
"""(kind of secret, pattern, replacement): the kind labels ``opsbot_secrets_redacted_total``."""


def _keep_group(group: int) -> Callable[[re.Match[str]], str]:
    """Replacement keeping everything before ``group`` and after it, replacing only ``group``."""

    def replace(match: re.Match[str]) -> str:
        start, end = match.span(group)
        whole_start = match.start()
        text = match.group(0)
        return text[: start - whole_start] + REDACTED + text[end - whole_start :]

    return replace


def _whole(match: re.Match[str]) -> str:
    return REDACTED


def _basic(match: re.Match[str]) -> str:
    # "Basic authentication" is prose; a Basic credential decodes to "user:password".
    try:
        decoded = base64.b64decode(match.group(2) + "=" * (-len(match.group(2)) % 4), validate=True)
    except (binascii.Error, ValueError):
        return match.group(0)
    try:
        plain = decoded.decode("utf-8")
    except UnicodeDecodeError:
        return match.group(0)
    if ":" not in plain or not plain.isprintable():
        return match.group(0)
    return match.group(1) + REDACTED


def _named_value(match: re.Match[str]) -> str:
    name = match.group("name")
    value = match.group("value")
    if not value.strip("\\\"'") or value.startswith(REDACTED) or not is_secret_name(name):
        return match.group(0)
    if value.lower() in {"true", "false", "null", "none", "nil", "''", '""', "<none>", "***", "*****"}:
        return match.group(0)
    return _keep_group(match.re.groupindex["value"])(match)


# Names may carry a domain prefix (annotation keys such as "example.com/db-password").
_NAME = r"[A-Za-z_][A-Za-z0-9_.\-/]{0,120}"
_VALUE = r"[^\s\"'`,;&<>(){}\[\]]+"
_RULES: list[_Rule] = [
    # Private key blocks (PEM, OpenSSH, PGP), also with JSON-escaped newlines or cut off by a log tail.
    (
        "private_key",
        re.compile(
            r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
            r"(?:[\s\S]*?-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|[\s\S]*?(?=\n\s*\n|\"|\Z))"
        ),
        _whole,
    ),
    # Slack incoming webhooks carry their secret in the path.
    (
        "slack_webhook",
        re.compile(r"https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9/_-]+"),
        _whole,
    ),
    # Authorization headers: keep the scheme, drop the credential.
    (
        "authorization",
        re.compile(
            r"(?i)\b((?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?(?:bearer|token|digest|apikey|negotiate|sso-key)\s+)"
            r"([^\s\"',;]+)"
        ),
        _keep_group(2),
    ),
    # A bearer credential has a digit or symbol in it, or is long: "bearer authentication" is prose.
    (
        "bearer",
        re.compile(r"(?i)\b(bearer\s+)((?=[A-Za-z]*[0-9._~+/=\-])[A-Za-z0-9._~+/=\-]{8,}|[A-Za-z]{24,})"),
        _keep_group(2),
    ),
    ("basic_auth", re.compile(r"(?i)\b(basic\s+)([A-Za-z0-9+/]{6,}={0,2})(?![A-Za-z0-9+/=])"), _basic),
    # Tokens of known shapes.
    (
        "aws_access_key",
        re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA|ABIA|ACCA)[A-Z0-9]{16}\b"),
        _whole,
    ),
    ("gcp_api_key", re.compile(r"\bAIza[0-9A-Za-z_\-]{35}(?![0-9A-Za-z_\-])"), _whole),
    ("gcp_oauth_token", re.compile(r"\bya29\.[0-9A-Za-z_\-]{20,}"), _whole),
    ("github_token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,255}\b"), _whole),
    ("github_token", re.compile(r"\bgithub_pat_[A-Za-z0-9_]{22,255}\b"), _whole),
    ("gitlab_token", re.compile(r"\bglpat-[A-Za-z0-9_\-]{20,}"), _whole),
    ("slack_token", re.compile(r"\bxox[abposre]-[A-Za-z0-9\-]{10,}"), _whole),
    ("slack_token", re.compile(r"\bxapp-\d-[A-Za-z0-9\-]{10,}"), _whole),
    ("stripe_key", re.compile(r"\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}"), _whole),
    ("openai_key", re.compile(r"\bsk-(?:proj-|ant-|svcacct-)?[A-Za-z0-9_\-]{20,}"), _whole),
    ("sendgrid_key", re.compile(r"\bSG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}"), _whole),
    ("npm_token", re.compile(r"\bnpm_[A-Za-z0-9]{36}\b"), _whole),
    ("huggingface_token", re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"), _whole),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*"), _whole),
    # Passwords in URLs: scheme://user:password@host (user kept).
    (
        "url_password",
        re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.\-]*://[^:/@\s\"']*:)([^@\s/\"']+)(@)"),
        _keep_group(2),
    ),
    # Kubernetes env entries and similar name/value pairs in JSON.
    (
        "named_value",
        re.compile(
            r"(\"name\"\s*:\s*\"(?P<name>[^\"]{1,80})\"\s*,\s*\"value\"\s*:\s*\")"
            # \\\\" first: inside a bytes repr an escaped quote shows as two backslashes and a quote.
            r"(?P<value>(?:[^\"\\]|\\\\\"|\\.)*)(\")"
        ),
        _named_value,
    ),
    # "key": "value" (JSON), 'key': 'value' (Python reprs) and key="value" / key='value' (logfmt,
    # shells, labels).
    (
        "named_value",
        re.compile(rf"(?P<q>[\"'])(?P<name>{_NAME})(?P=q)\s*:\s*\"(?P<value>(?:[^\"\\]|\\.)+)\""),
        _named_value,
    ),
    (
        "named_value",
        re.compile(rf"(?P<q>[\"'])(?P<name>{_NAME})(?P=q)\s*:\s*'(?P<value>(?:[^'\\]|\\.)+)'"),
        _named_value,
    ),
    # JSON inside a JSON string or a bytes repr: \"key\": \"value\" (any number of backslashes).
    (
        "named_value",
        re.compile(rf"(?P<bs>\\+)\"(?P<name>{_NAME})(?P=bs)\"\s*:\s*(?P=bs)\"(?P<value>[^\"\n]*?)(?P=bs)\""),
        _named_value,
    ),
    (
        "named_value",
        re.compile(
            rf"(?<![\w.\-])-{{0,2}}(?P<name>{_NAME})\s*=\s*(?P<bs>\\*)(?P<q>[\"'])(?P<value>[^\"'\n\\]+)(?P=bs)(?P=q)"
        ),
        _named_value,
    ),
    # key=value (env, logfmt, connection strings, query strings, --flag=value).
    (
        "named_value",
        re.compile(rf"(?<![\w.\-])-{{0,2}}(?P<name>{_NAME})\s*=\s*(?P<value>{_VALUE})"),
        _named_value,
    ),
    # key: value at the start of a line (YAML, HTTP headers) or after { , ; - so prose such as
    # "failed to refresh token: context deadline exceeded" is not taken for a secret.
    (
        "named_value",
        re.compile(
            rf"(?m)(?:^|(?<=[{{,;|])|(?<=: ))[ \t]*(?:-[ \t]+)?(?P<name>{_NAME})[ \t]*:[ \t]*"
            rf"(?P<value>\"[^\"\n]+\"|'[^'\n]+'|{_VALUE})"
        ),
        _named_value,
    ),
    # IDENTIFIER: value anywhere (DB_PASSWORD, x-api-key, apiKey, TOKEN): names shaped like code,
    # not like prose, so "refresh token: context deadline exceeded" stays as it is.
    (
        "named_value",
        re.compile(
            r"(?<![\w.\-])(?P<name>[A-Za-z][A-Za-z0-9]*(?:[_.\-][A-Za-z0-9]+)+|[a-z]+[A-Z][A-Za-z0-9]*|[A-Z][A-Z0-9]+)"
            rf"[ \t]*:[ \t]*(?P<value>\"[^\"\n]+\"|'[^'\n]+'|{_VALUE})"
        ),
        _named_value,
    ),
    # --password value / --token value (command lines).
    (
        "named_value",
        re.compile(rf"(?<![\w-])--(?P<name>{_NAME})[ \t]+(?P<value>(?!-){_VALUE})"),
        _named_value,
    ),
]


def count_secrets(text: str) -> tuple[str, int]:
    """``text`` with secrets replaced, and how many replacements were made (no metrics)."""
    new, by_kind = count_secrets_by_kind(text)
    return new, sum(by_kind.values())


def count_secrets_by_kind(text: str) -> tuple[str, dict[str, int]]:
    """``text`` with secrets replaced, and the replacements per kind of secret (no metrics)."""
    counts: dict[str, int] = {}
    for kind, pattern, replace in _RULES:
        if not text:
            break

        def counting(
            match: re.Match[str], replace: Callable[[re.Match[str]], str] = replace, kind: str = kind
        ) -> str:
            new = replace(match)
            if new != match.group(0):
                counts[kind] = counts.get(kind, 0) + 1
            return new

        text = pattern.sub(counting, text)
    return text, counts


def redact(text: str, *, where: str = "text") -> str:
    """``text`` with every secret replaced by ``[REDACTED]`` (key names kept); replacements are
    counted in ``opsbot_secrets_redacted_total{where=..., kind=...}``."""
    if not text:
        return text
    new, by_kind = count_secrets_by_kind(text)
    for kind, count in by_kind.items():
        metrics.SECRETS_REDACTED.labels(where=where, kind=kind).inc(count)
    return new


class RedactingFilter(logging.Filter):
    """A logging filter that redacts every record's rendered message and traceback text.

    Attach it to handlers (``handler.addFilter(RedactingFilter())``): handler filters see records
    from every logger, including third-party libraries, which logger filters would not.
    """

    def __init__(self, name: str = "") -> None:
        super().__init__(name)
        self._formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite ``record`` in place with secrets removed; never drops a record."""
        try:
            message = record.getMessage()
        except Exception:  # a broken %-format: keep the raw template rather than lose the line
            message = str(record.msg)
        cleaned = redact(message, where="log")
        if cleaned != message or record.args:
            record.msg = cleaned
            record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, where="log")
        if record.stack_info:
            record.stack_info = redact(record.stack_info, where="log")
        return True
