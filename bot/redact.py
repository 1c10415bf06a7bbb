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
import contextvars
import logging
import re
import threading
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
        "sessionid",
        "dsn",
        # Flag and variable names of particular clients (keytool, sshpass, redis-cli, htpasswd).
        "storepass",
        "keypass",
        "srcstorepass",
        "deststorepass",
        "srckeypass",
        "destkeypass",
        "sshpass",
        "rediscliauth",
        "psk",
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
        "seconds",
        "minutes",
        "hours",
        "days",
        "ms",
        "duration",
        "limit",
        "usage",
        "budget",
        "prefix",
        "hint",
        "strategy",
        "algorithm",
        "method",
        "scope",
        "scopes",
        "audience",
        "aud",
        "issuer",
        "iss",
        "stdin",
        "prompt",
        "helper",
    }
)
# Words before a final "key" that make it an address of data, not a credential.
_NOT_SECRET_KEYS = frozenset(
    {
        "public",
        "primary",
        "sort",
        "hot",
        "cache",
        "routing",
        "partition",
        "idempotency",
        "idempotence",
        "dedup",
        "dedupe",
        "deduplication",
        "group",
        "grouping",
        "shard",
        "sharding",
        "hash",
        "range",
        "row",
        "foreign",
        "unique",
        "lookup",
        "lock",
        "object",
        "message",
        "event",
        "index",
        "label",
        "map",
        "metric",
        "config",
        "cluster",
        "tenant",
        "bucket",
        "cursor",
        "page",
        "join",
        "composite",
        "distribution",
        "affinity",
        "correlation",
        "trace",
        "request",
        "order",
        "redis",
        "s3",
        "topology",
        "node",
        "selector",
        "match",
        "tolerations",
        "toleration",
        "pod",
        "sticky",
        "consistent",
    }
)
# Words before a final "data" that make the value key or certificate material.
_MATERIAL_WORDS = frozenset(
    {"key", "cert", "certificate", "crt", "token", "secret", "password", "pem", "keystore", "p12", "pfx"}
)
_WORD_SPLIT = re.compile(r"[_.\-/\s]+|(?<=[a-z0-9])(?=[A-Z])")


def is_secret_name(name: str) -> bool:
    """True when a key or variable named ``name`` holds a secret (``DB_PASSWORD``, ``apiKey``,
    ``ENCRYPTION_KEY``), false for metadata about secrets (``TOKEN_TTL``, ``password_file``)."""
    parts = [p.lower() for p in _WORD_SPLIT.split(name.strip("\"'-")) if p]
    if not parts:
        return False
    last = parts[-1]
    # Bitnami-style references to a Secret ("existingSecret", "existingSecretPasswordKey") name
    # the Secret or its key, never hold the value.
    if parts[0] == "existing":
        return False
    # Kubeconfig and Secret fields holding base64 key or certificate material ("client-key-data",
    # "client-certificate-data", "tls-key-data"); the CA bundle ("certificate-authority-data") is public.
    if last == "data" and len(parts) >= 2:
        return "authority" not in parts and bool(_MATERIAL_WORDS.intersection(parts[:-1]))
    # "api_key", "ENCRYPTION_KEY", "accountKey": a compound ending in key; bare "key" is too common
    # (tolerations, label selectors) to count, and so are keys that address data, not unlock it
    # ("cache_key", "routing_key", "partition_key", "idempotency_key").
    if last in {"key", "keys"} and len(parts) >= 2 and parts[-2] not in _NOT_SECRET_KEYS:
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
    return joined in _SECRET_WORDS or any(p in _SECRET_WORDS for p in parts)


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


# A file path: every segment lower case, or a key / certificate file name at the end.
_FILE_PATH = re.compile(
    r"(?:/|~/|\./)(?:[a-z0-9_.\-]+/)*(?:[a-z0-9_.\-]+|[\w.\-]+\.(?:key|pem|crt|cer|p12|pfx|jks|json|conf|txt|ya?ml))\Z"
)


def _is_user_password(value: str) -> bool:
    """True when ``value`` is base64 of ``user:password`` (Docker's and npm's ``auth`` fields)."""
    if len(value) < 8:
        return False
    try:
        plain = base64.b64decode(value + "=" * (-len(value) % 4), validate=True).decode("utf-8")
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return False
    user, colon, password = plain.partition(":")
    return bool(colon and user and password) and plain.isprintable()


def _named_value(match: re.Match[str]) -> str:
    name = match.group("name")
    value = match.group("value")
    if name.strip("\"'_-").lower().endswith("auth") and _is_user_password(value.strip("\"'")):
        return _keep_group(match.re.groupindex["value"])(match)
    if not value.strip("\\\"'") or value.startswith(REDACTED) or not is_secret_name(name):
        return match.group(0)
    if value.lower() in {"true", "false", "null", "none", "nil", "''", '""', "<none>", "***", "*****"}:
        return match.group(0)
    if _FILE_PATH.match(value.strip("\"'")):  # client-key: /etc/kubernetes/pki/admin.key names a file
        return match.group(0)
    return _keep_group(match.re.groupindex["value"])(match)


# -- command lines of database, cache, HTTP, SSH and registry clients ------------------------------
# A shell-ish token: quoted, unquoted, or a flag with a quoted value glued on (-p'pw').
_TOKEN = re.compile(r"""'[^'\n]*'|"[^"\n]*"|(?:[^\s'"]+|'[^'\n]*'|"[^"\n]*")+""")
_NEXT, _ATTACHED, _USERPASS, _PASS_PREFIX, _AUTH = "next", "attached", "userpass", "pass:", "auth"
_NEXT_ONLY, _COOKIE = "next-only", "cookie"  # value only as the next word; a name=value cookie string
_CLIENT_FLAGS: list[tuple[str, dict[str, str]]] = [
    # mysql's -p takes its value glued on only ("-p pw" prompts, and "pw" is the database).
    (
        r"mysql|mysqldump|mysqladmin|mysqlimport|mysqlcheck|mysqlpump|mysqlshow|mysqlbinlog|mysqlsh"
        r"|mariadb|mariadb-dump|mariadb-admin",
        {"-p": _ATTACHED, "--password": _NEXT},
    ),
    (r"redis-cli|valkey-cli|keydb-cli", {"-a": _NEXT, "--pass": _NEXT, "--password": _NEXT}),
    (
        r"curl",
        {
            "-u": _USERPASS,
            "--user": _USERPASS,
            "-U": _USERPASS,
            "--proxy-user": _USERPASS,
            "-E": _USERPASS,
            "--cert": _USERPASS,
            "--oauth2-bearer": _NEXT,
            "-b": _COOKIE,
            "--cookie": _COOKIE,
            "--pass": _NEXT,
            "--proxy-pass": _NEXT,
        },
    ),
    (
        r"wget",
        {"--password": _NEXT, "--http-password": _NEXT, "--ftp-password": _NEXT, "--proxy-password": _NEXT},
    ),
    # httpie and xh: "-a user:pw", or "-a TOKEN" with --auth-type=bearer
    (r"(?:^|(?<=\n)|(?<=[$#;&|(]\s)|(?<=[$#;&|(]))[ \t]*(?:http|https|xh)", {"-a": _AUTH, "--auth": _AUTH}),
    (r"sshpass", {"-p": _NEXT}),
    (r"plink|pscp|psftp", {"-pw": _NEXT}),
    (
        r"mongo|mongosh|mongodump|mongorestore|mongoexport|mongoimport|mongostat|mongotop|mongofiles",
        {"-p": _NEXT, "--password": _NEXT},
    ),
    (
        r"(?:docker|podman|nerdctl|buildah|oras|cosign|helm\s+registry|crane\s+auth)\s+login",
        {"-p": _NEXT, "--password": _NEXT},
    ),
    (r"skopeo", {"--creds": _USERPASS, "--src-creds": _USERPASS, "--dest-creds": _USERPASS, "-p": _NEXT}),
    (r"kubectl|helm|argocd|flux", {"--token": _NEXT, "--password": _NEXT}),
    (r"oc", {"--token": _NEXT, "--password": _NEXT, "-p": _NEXT}),
    (r"ldapsearch|ldapadd|ldapmodify|ldapdelete|ldapwhoami|ldappasswd|ldapcompare", {"-w": _NEXT}),
    (r"sqlcmd|bcp|osql|isql", {"-P": _NEXT}),
    (
        r"openssl",
        {"-passin": _PASS_PREFIX, "-passout": _PASS_PREFIX, "-pass": _PASS_PREFIX, "-k": _NEXT_ONLY},
    ),
    (r"smbclient|rpcclient|smbget|smbcacls|smbmap|net\s+ads", {"-U": "%", "--user": "%", "-p": _NEXT}),
    (r"lftp", {"-u": ","}),
    (
        r"keytool",
        {
            "-storepass": _NEXT,
            "-keypass": _NEXT,
            "-srcstorepass": _NEXT,
            "-deststorepass": _NEXT,
            "-srckeypass": _NEXT,
            "-destkeypass": _NEXT,
        },
    ),
    (r"ssh-keygen", {"-N": _NEXT, "-P": _NEXT}),
    (r"zip|unzip", {"-P": _NEXT}),
    (r"7z|7za", {"-p": _ATTACHED}),
    (r"etcdctl", {"--user": _USERPASS, "--password": _NEXT}),
    (r"az\s+login", {"-p": _NEXT, "--password": _NEXT}),
    (r"influx", {"-password": _NEXT, "-token": _NEXT, "--token": _NEXT, "-t": _NEXT_ONLY}),
    (r"rabbitmqadmin", {"-p": _NEXT, "--password": _NEXT}),
    (r"vault\s+login", {}),
    (r"rabbitmqctl\s+(?:add_user|change_password|authenticate_user)", {}),
    (r"htpasswd", {}),
    (r"mc\s+(?:alias\s+set|config\s+host\s+add)", {}),
    (r"aws\s+configure\s+set", {}),
]
_CLIENT_SEGMENT = re.compile(
    r"(?<![\w\-.])(?P<cmd>"
    + "|".join(f"(?:{names})" for names, _ in _CLIENT_FLAGS)
    + r")(?![\w\-])(?P<args>(?:'[^'\n]*'|\"[^\"\n]*\"|\\\n|[^\n;|&'\"])*)"
)
_CLIENT_COMMANDS = [(re.compile(rf"(?:{names})\Z"), flags) for names, flags in _CLIENT_FLAGS]


def _is_literal(value: str) -> bool:
    """A value worth hiding: not empty, not a shell / Helm / Kubernetes reference to one elsewhere."""
    bare = value.strip("\"'")
    return bool(bare) and not bare.startswith(("$", "{{", "<", REDACTED)) and bare not in ("-", "''")


def _hide(token: str, start: int = 0) -> str:
    """``token`` with ``token[start:]`` replaced (quotes around the value kept)."""
    value = token[start:]
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return token[:start] + value[0] + REDACTED + value[0]
    return token[:start] + REDACTED


def _hide_after(token: str, start: int, separator: str) -> str:
    """``user:password`` (or ``user%password``): only what follows the separator is replaced."""
    value = token[start:].strip("\"'")
    cut = value.find(separator)
    if cut < 0 or not _is_literal(value[cut + 1 :]):
        return token
    offset = token.index(value, start) + cut + 1
    end = offset + len(value) - cut - 1
    return token[:offset] + REDACTED + token[end:]


def _positional_secrets(cmd: str, words: list[str]) -> list[int]:
    """Indexes of the arguments that are secrets for clients taking them by position."""
    args = [i for i, w in enumerate(words) if not w.startswith("-")]
    if cmd.startswith("htpasswd"):
        flags = "".join(w[1:] for w in words if w.startswith("-") and not w.startswith("--"))
        if "b" not in flags:
            return []
        # htpasswd -b FILE USER PASSWORD; with -n there is no file
        index = 1 if "n" in flags else 2
        return [args[index]] if len(args) > index else []
    if cmd.startswith("vault"):
        plain = [i for i in args if "=" not in words[i]]
        return plain[:1]
    if cmd.startswith("rabbitmqctl"):
        return args[1:2]
    if cmd.startswith("mc"):
        return args[3:4]
    if cmd.startswith("aws"):
        return args[1:2] if args and is_secret_name(words[args[0]]) else []
    return []


def _command_flags(word: str, following: str) -> dict[str, str] | None:
    """The flag table of the client ``word`` (or ``word following``) names, if it is one."""
    for candidate in (f"{word} {following}", word):
        for pattern, flags in _CLIENT_COMMANDS:
            if pattern.match(candidate):
                return flags
    return None


def _client_args(match: re.Match[str]) -> str:
    cmd = " ".join(match.group("cmd").split())
    flags = next((f for pattern, f in _CLIENT_COMMANDS if pattern.search(cmd)), {})
    args = match.group("args")
    tokens = list(_TOKEN.finditer(args))
    words = [t.group(0) for t in tokens]
    new = list(words)
    for index, word in enumerate(words):
        following = words[index + 1] if index + 1 < len(words) else ""
        # "kubectl exec redis-0 -- redis-cli -a PW": the inner client's flags from here on
        inner = _command_flags(word.rsplit("/", 1)[-1], following)
        if inner is not None:
            flags = inner
            continue
        if len(word) > 2 and word[0] == word[-1] and word[0] in "'\"" and new[index] == word:
            # sh -c "mysqldump -uroot -pPW ...": a quoted argument can be a command line itself
            quoted = _CLIENT_SEGMENT.sub(_client_args, word[1:-1])
            if quoted != word[1:-1]:
                new[index] = word[0] + quoted + word[0]
                continue
        for flag, mode in flags.items():
            if word == flag:
                if mode == _ATTACHED or not following or following.startswith("-"):
                    continue
                target, start = index + 1, 0
            elif flag.startswith("--") and word.startswith(flag + "="):
                target, start = index, len(flag) + 1
            elif (
                len(flag) == 2
                and word.startswith(flag)
                and len(word) > 2
                and word[2] != "-"
                and mode not in (_AUTH, _NEXT_ONLY)
            ):
                target, start = index, 2
            else:
                continue
            value = words[target][start:]
            if mode in (_NEXT, _ATTACHED, _NEXT_ONLY) or (mode == _COOKIE and "=" in value):
                if _is_literal(value):
                    new[target] = _hide(words[target], start)
            elif mode == _PASS_PREFIX:
                if value.strip("\"'").startswith("pass:"):
                    new[target] = _hide_after(words[target], start, ":")
            elif mode == _AUTH:
                if ":" in value:
                    new[target] = _hide_after(words[target], start, ":")
                elif _is_literal(value):
                    new[target] = _hide(words[target], start)
            elif mode != _COOKIE:
                new[target] = _hide_after(words[target], start, ":" if mode == _USERPASS else mode)
            break
    for index in _positional_secrets(cmd, words):
        if _is_literal(words[index]):
            new[index] = _hide(words[index])
    if new == words:
        return match.group(0)
    out, last = [], 0
    for token, replacement in zip(tokens, new, strict=True):
        out.append(args[last : token.start()])
        out.append(replacement)
        last = token.end()
    out.append(args[last:])
    return match.group(0)[: match.start("args") - match.start()] + "".join(out)


# -- base64-embedded material --------------------------------------------------------------------
_B64_RUN = re.compile(r"(?<![A-Za-z0-9+/=_\-.])[A-Za-z0-9+/]{16,}={0,2}(?![A-Za-z0-9+/=_\-.])")
_B64_PEM = re.compile(
    # "LS0tLS1CRUdJTi" is "-----BEGIN" in base64; wrapped lines (76 columns, \n escapes) follow.
    r"LS0tLS1CRUdJTi[A-Za-z0-9+/]*={0,2}(?:(?:\\n|\r?\n)[ \t]*[A-Za-z0-9+/]+={0,2}(?![^\s\"'\\,}\]]))*"
)


def _b64decode(text: str) -> bytes | None:
    data = re.sub(r"\\n|\s", "", text)
    data = data[: len(data) - len(data) % 4] if not data.endswith("=") else data
    try:
        return base64.b64decode(data + "=" * (-len(data) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None


def _b64_private_key(match: re.Match[str]) -> str:
    decoded = _b64decode(match.group(0))
    if decoded is not None and b"PRIVATE KEY" in decoded[:80]:
        return REDACTED
    return match.group(0)


_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("redact_b64_depth", default=0)
"""How many base64 layers deep the current scan is (log filters run in any thread: not a global)."""


def _b64_embedded(match: re.Match[str]) -> str:
    """A base64 value whose decoded text holds a secret (a Secret's connection URL, a
    ``.dockerconfigjson``, a ``user:password`` pair) is replaced whole."""
    value = match.group(0)
    decoded = _b64decode(value)
    if decoded is None or _DEPTH.get() > 1:
        return value
    try:
        plain = decoded.decode("utf-8")
    except UnicodeDecodeError:
        return value
    if not plain or sum(ch.isprintable() or ch in "\n\r\t" for ch in plain) < len(plain):
        return value
    token = _DEPTH.set(_DEPTH.get() + 1)
    try:
        found = count_secrets_by_kind(plain)[1]
    finally:
        _DEPTH.reset(token)
    return REDACTED if found else value


# -- Kubernetes Secrets: every value under data: / stringData: -----------------------------------
_YAML_SECRET_DATA = re.compile(
    r"(?m)^(?P<indent>[ \t]*)(?:data|stringData):[ \t]*\r?\n"
    r"(?P<body>(?:(?P=indent)[ \t]+\S[^\n]*(?:\n|\Z)|[ \t]*\r?\n(?=(?P=indent)[ \t]+\S))+)"
)
_JSON_SECRET_DATA = re.compile(r"(\"(?:data|stringData)\"\s*:\s*\{)([^{}]*)(\})")
_JSON_PAIR = re.compile(r"(\"[^\"\n]*\"\s*:\s*\")((?:[^\"\\]|\\.)*)(\")")
_KIND_SECRET = re.compile(r"(?m)(?:^[ \t]*kind:[ \t]*[\"']?Secret[\"']?[ \t]*$|\"kind\"\s*:\s*\"Secret\")")


def _in_secret_document(match: re.Match[str]) -> bool:
    text = match.string
    start = text.rfind("\n---", 0, match.start())
    end = text.find("\n---", match.end())
    return bool(_KIND_SECRET.search(text, max(start, 0), end if end >= 0 else len(text)))


def _yaml_secret_data(match: re.Match[str]) -> str:
    if not _in_secret_document(match):
        return match.group(0)
    lines = match.group("body").split("\n")
    child = min((len(ln) - len(ln.lstrip()) for ln in lines if ln.strip()), default=0)
    out = []
    for line in lines:
        depth = len(line) - len(line.lstrip())
        if not line.strip():
            out.append(line)
        elif depth > child:  # continuation of a block scalar (key: |)
            out.append(line[:depth] + REDACTED)
        else:
            key, colon, value = line.partition(":")
            bare = value.strip()
            if colon and bare and bare not in ("|", ">", "|-", ">-") and not bare.startswith(REDACTED):
                out.append(f"{key}: {REDACTED}")
            else:
                out.append(line)
    head = match.group(0)[: match.start("body") - match.start()]
    return head + "\n".join(out)


def _json_secret_data(match: re.Match[str]) -> str:
    if not _in_secret_document(match):
        return match.group(0)
    body = _JSON_PAIR.sub(
        lambda m: m.group(1) + (REDACTED if m.group(2) else "") + m.group(3), match.group(2)
    )
    return match.group(1) + body + match.group(3)


def _yaml_env(match: re.Match[str]) -> str:
    value = match.group("value")
    if not is_secret_name(match.group("name")) or not _is_literal(value):
        return match.group(0)
    return match.group(0)[: match.start("value") - match.start()] + _hide(value)


def _from_literal(match: re.Match[str]) -> str:
    # kubectl create secret ... --from-literal=KEY=VALUE: every literal of a Secret is secret.
    line_start = match.string.rfind("\n", 0, match.start()) + 1
    in_secret = "secret" in match.string[line_start : match.start()]
    if not (in_secret or is_secret_name(match.group("name"))) or not _is_literal(match.group("value")):
        return match.group(0)
    return match.group(1) + _hide(match.group("value"))


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
    # Base64 of a PEM private key (kubeconfig client-key-data, Secret tls.key, Helm values).
    ("base64_private_key", _B64_PEM, _b64_private_key),
    # Kubernetes Secret manifests (kubectl get secret -o yaml / json): every data value.
    ("secret_data", _YAML_SECRET_DATA, _yaml_secret_data),
    ("secret_data", _JSON_SECRET_DATA, _json_secret_data),
    # Base64 whose decoded text carries a secret (.dockerconfigjson, a connection URL).
    ("base64_embedded", _B64_RUN, _b64_embedded),
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
    # Credentials given to command-line clients by flag or position (mysql -pPW, redis-cli -a PW,
    # curl -u user:PW, sshpass -p PW, docker login -p PW, htpasswd -b FILE USER PW, ...).
    ("cli_flag", _CLIENT_SEGMENT, _client_args),
    (
        "cli_flag",
        re.compile(
            r"(--from-(?:literal|env)[= ](?P<name>[A-Za-z0-9_.\-]+)=)(?P<value>'[^'\n]*'|\"[^\"\n]*\"|\S+)"
        ),
        _from_literal,
    ),
    # Oracle's user/password@service (sqlplus, JDBC thin URLs).
    (
        "oracle_password",
        re.compile(
            r"(?i)(\b(?:sqlplus|rman|expdp|impdp|sqlldr|jdbc:oracle:thin:)(?:\s+-\w+)*\s*[\"']?[A-Za-z0-9_$#]+/)"
            r"([^@\s\"'/]+)(?=@|[\"'\s]|$)"
        ),
        _keep_group(2),
    ),
    # ~/.netrc (machine HOST login USER password PW) and ~/.pgpass (host:port:db:user:password).
    ("netrc", re.compile(r"(\bmachine\s+\S+\s+login\s+\S+\s+password\s+)(\S+)"), _keep_group(2)),
    (
        "pgpass",
        re.compile(r"(?m)^([A-Za-z0-9_.\-*]+:(?:\d{2,5}|\*):[A-Za-z0-9_\-*]+:[A-Za-z0-9_.@\-*]+:)(\S+)$"),
        _keep_group(2),
    ),
    # GitHub Actions debug logs print an evaluated secret on the line after its name.
    (
        "ci_debug",
        re.compile(r"(##\[debug\]Evaluating: secrets\.\S+[ \t]*\r?\n[^\n]*##\[debug\]Result: ')([^'\n]+)"),
        _keep_group(2),
    ),
    # Cookie headers: the whole cookie string is a session.
    (
        "cookie",
        re.compile(r"(?im)(\b(?:set-)?cookie[\"']?[ \t]*:[ \t]*[\"']?)((?=[^\n\"']*=)[^\n\"']+)"),
        _keep_group(2),
    ),
    # Signatures of pre-signed URLs (Azure SAS, S3, GCS) grant access until they expire.
    (
        "presigned_url",
        re.compile(r"(?i)([?&](?:sig|x-amz-signature|x-goog-signature)=)([^&\s\"'#>|]+)"),
        _keep_group(2),
    ),
    # Kubernetes env lists in YAML: - name: DB_PASSWORD / value: ...
    (
        "named_value",
        re.compile(
            r"(?m)^(?P<i>[ \t]*)-[ \t]+name:[ \t]*[\"']?(?P<name>[^\"'\n]+?)[\"']?[ \t]*\r?\n"
            r"(?P=i)[ \t]+value:[ \t]*(?P<value>\"[^\"\n]*\"|'[^'\n]*'|[^\n]+)"
        ),
        _yaml_env,
    ),
    # Passwords in URLs: scheme://user:password@host (user kept).
    (
        "url_password",
        # Greedy up to the last "@" before the host: a raw "@" inside the password is kept hidden.
        re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.\-]*://[^:/@\s\"']*:)([^\s/\"'<>|]+)(@)"),
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
            rf"(?<![\w.\-$])-{{0,2}}(?P<name>{_NAME})\s*=\s*(?P<bs>\\*)(?P<q>[\"'])(?P<value>[^\"'\n\\]+)(?P=bs)(?P=q)"
        ),
        _named_value,
    ),
    # key=value (env, logfmt, connection strings, query strings, --flag=value).
    (
        "named_value",
        re.compile(rf"(?<![\w.\-$])-{{0,2}}(?P<name>{_NAME})\s*=\s*(?P<value>{_VALUE})"),
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
            r"(?<![\w.\-$])(?P<name>[A-Za-z][A-Za-z0-9]*(?:[_.\-][A-Za-z0-9]+)+|[a-z]+[A-Z][A-Za-z0-9]*|[A-Z][A-Z0-9]+)"
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


def _needs_of(rules: list[_Rule]) -> dict[re.Pattern[str], tuple[str, ...]]:
    """Per rule, lowercase ASCII strings one of which every match contains (the rule is skipped on
    an ASCII text holding none of them). Found by the rule's own pattern text, so a rule edited out
    of these shapes simply loses its shortcut; tests/reliability/test_secrets_corpus.py checks each
    against the redaction corpus."""
    needs: dict[re.Pattern[str], tuple[str, ...]] = {}
    for _, pattern, _ in rules:
        for shape, literal in _NEED_SHAPES:
            if shape in pattern.pattern:
                needs[pattern] = literal
                break
    return needs


_NEED_SHAPES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("(?:proxy-)?authorization", ("authorization",)),
    (r"(bearer\s+)", ("bearer",)),
    (r"(basic\s+)", ("basic",)),
    ("(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA|ABIA|ACCA)",
     ("akia", "asia", "agpa", "aida", "aroa", "anpa", "anva", "aipa", "abia", "acca")),
    (r"\bAIza", ("aiza",)),
    (r"\bya29\.", ("ya29.",)),
    (r"\bgh[pousr]_", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")),
    (r"\bgithub_pat_", ("github_pat_",)),
    (r"\bglpat-", ("glpat-",)),
    (r"\bxox[abposre]-", ("xox",)),
    (r"\bxapp-", ("xapp-",)),
    (r"(?:sk|rk|pk)_(?:live|test)_", ("_live_", "_test_")),
    (r"\bsk-(?:proj-", ("sk-",)),
    (r"\bSG\.", ("sg.",)),
    (r"\bnpm_", ("npm_",)),
    (r"\bhf_", ("hf_",)),
    (r"\beyJ", ("eyj",)),
    ("(?:sqlplus|rman|expdp|impdp|sqlldr|jdbc:oracle:thin:)",
     ("sqlplus", "rman", "expdp", "impdp", "sqlldr", "jdbc:oracle:thin:")),
    (r"(\bmachine\s+", ("machine",)),
    ("(?:set-)?cookie", ("cookie",)),
    ("://[^:/@", ("://",)),
    (r")\s*=\s*(", ("=",)),  # key=value, key="value"
    (r")[ \t]*:[ \t]*(", (":",)),  # key: value
    ("--(?P<name>", ("--",)),  # --password value
)  # fmt: skip
"""(a piece of a rule's pattern text, what every match of that rule contains, lowercased)."""


def count_secrets(text: str) -> tuple[str, int]:
    """``text`` with secrets replaced, and how many replacements were made (no metrics)."""
    new, by_kind = count_secrets_by_kind(text)
    return new, sum(by_kind.values())


def count_secrets_by_kind(text: str) -> tuple[str, dict[str, int]]:
    """``text`` with secrets replaced, and the replacements per kind of secret (no metrics)."""
    counts: dict[str, int] = {}
    # On ASCII text a rule whose every match holds a known string is skipped where none is present
    # (most rules, on most answers: the full passes were 10% of the event loop under a burst).
    # Only on ASCII: Unicode case folding lets (?i) match letters that lower() does not produce.
    lowered = text.lower() if text.isascii() else None
    for kind, pattern, replace in _RULES:
        if not text:
            break
        needs = _NEEDS.get(pattern)
        if needs is not None and lowered is not None and not any(n in lowered for n in needs):
            continue

        def counting(
            match: re.Match[str], replace: Callable[[re.Match[str]], str] = replace, kind: str = kind
        ) -> str:
            new = replace(match)
            if new != match.group(0):
                counts[kind] = counts.get(kind, 0) + 1
            return new

        new = pattern.sub(counting, text)
        if new != text:
            text = new
            lowered = text.lower() if lowered is not None and text.isascii() else None
    return text, counts


_NEEDS = _needs_of(_RULES)


_CLEAN_MAX_ENTRIES = 512
_CLEAN_MAX_CHARS = 32_768
_clean: dict[str, None] = {}
"""Texts a full pass found nothing to redact in, most recent last (bounded). The same text comes
back on purpose: the pipeline redacts the question and the answer, then the store redacts every
turn it keeps (its own rule, whoever calls it) and the replay inputs redact the question again;
a text with no secret is its own redaction, so a second full pass over it is skipped. Texts with
a secret are never kept: each pass redacts and counts them."""
_clean_lock = threading.Lock()


def _remember_clean(text: str) -> None:
    with _clean_lock:  # redact runs in worker threads too (context gathering, log filters)
        _clean[text] = None
        while len(_clean) > _CLEAN_MAX_ENTRIES:
            del _clean[next(iter(_clean))]


def redact(text: str, *, where: str = "text") -> str:
    """``text`` with every secret replaced by ``[REDACTED]`` (key names kept); replacements are
    counted in ``opsbot_secrets_redacted_total{where=..., kind=...}``."""
    if not text or text in _clean:
        return text
    new, by_kind = count_secrets_by_kind(text)
    for kind, count in by_kind.items():
        metrics.SECRETS_REDACTED.labels(where=where, kind=kind).inc(count)
    if not by_kind and new == text and len(text) <= _CLEAN_MAX_CHARS:
        _remember_clean(text)
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
