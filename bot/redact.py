"""Secret redaction: everything opsbot puts in a prompt, a stored row, a log line or a chat message
passes through :func:`redact` first.

What is replaced (by ``[REDACTED]``; names of keys, URL users and auth schemes are kept so the text
still reads), in one pass of rules over the text:

- vendor tokens, wherever they stand: one table of formats (prefix, alphabet, length, checksum;
  :mod:`bot.redact_tokens`), incoming-webhook and bot URLs, JWTs, private key blocks (PEM, base64
  of PEM, OpenSSH, PuTTY, OpenVPN);
- values a name marks as secret (:func:`bot.redact_words.is_secret_name`: ``*password*``,
  ``*secret*``, ``*token*``, ``api_key``, ``*_KEY``, ``requirepass``, ``Unseal Key 1``, ...) in any
  syntax: ``key=value`` and whole ``NAME=value`` lines, YAML, JSON (also escaped, in arrays and
  lists), INI / TOML, XML elements and attributes, HTTP headers, Go / Java / Python struct dumps,
  flags with their value in the same or the next word or line, argument arrays, setters, SQL
  (``IDENTIFIED BY``, ``PASSWORD '..'``, ``INSERT`` into secret columns), URL-encoded pairs;
- command lines of database, cache, HTTP, SSH and registry clients; passwords in URLs;
- secret managers' and cluster tools' output (``vault operator init`` / ``read`` / ``kv get``,
  ``aws ssm`` / ``secretsmanager``, ``az keyvault``, ``gcloud secrets``, ``terraform output``,
  ``kubeadm token list``, ``kubectl get secret``): by their labels, tables, JSON markers and the
  lines a secret-printing command writes;
- chat prose in the major languages ("the new prod db password is ...", "das Passwort lautet",
  "密码：...") when the value reads like a secret (:func:`bot.redact_words.plausible_secret`);
- and, last, a random-looking string shortly after a secret-like word on its line (the entropy
  fallback), unless its shape is an id an incident is about (SHA, UUID, digest, trace id, pod
  hash) and the word is not right before it.

Left alone on purpose: placeholders and references (``${VAR}``, ``{{ .Values.x }}``,
``${{ secrets.X }}``, ``****``, ``ref+vault://..``, ``secretKeyRef`` names, ``checksum/secret``,
``--discovery-token-ca-cert-hash sha256:..``), and the hashes, digests and ids that an incident is
about. On ASCII text a rule is skipped where its literals (or any secret-like word) are absent,
so a text with no secret costs little (bench/redact_bench.py).
"""

from __future__ import annotations

import base64
import binascii
import contextvars
import logging
import re
import threading
from collections.abc import Callable
from typing import TypeVar

from bot import metrics
from bot.redact_scan import Anchored, Matcher, keyword_positions, lowercased
from bot.redact_tokens import WEBHOOKS, find_tokens, looks_random
from bot.redact_words import (
    NOT_SECRET_KEYS,
    PROSE_LINKS,
    PROSE_WORDS,
    SECRET_HINTS,
    WORD_SPLIT,
    is_placeholder,
    is_secret_name,
    looks_like_path,
    plausible_secret,
)

__all__ = [
    "REDACTED",
    "RedactingFilter",
    "count_secrets",
    "count_secrets_by_kind",
    "is_secret_name",
    "redact",
]

REDACTED = "[REDACTED]"
"""What a secret is replaced by."""


_Rule = tuple[str, Matcher, Callable[[re.Match[str]], str]]
"""(kind of secret, pattern, replacement): the kind labels ``opsbot_secrets_redacted_total``."""

_M = TypeVar("_M", bound=Matcher)
_RULE_NEEDS: dict[Matcher, tuple[str, ...]] = {}
"""Per rule declared with :func:`_gated`: lowercase ASCII strings one of which every match holds."""
_WORD_GATED: set[Matcher] = set()
"""Rules that only ever hide a value a secret-like name or word marks (``is_secret_name``, the
prose keywords): skipped on an ASCII text holding none of :data:`bot.redact_words.SECRET_HINTS`."""


def _by_name(
    pattern: re.Pattern[str],
    *needs: str,
    replace: Callable[[re.Match[str]], str] | None = None,
    starts: str = "",
    follow: str = "",
) -> _Rule:
    """A ``named_value`` rule: it hides only what a secret-like name or word marks, so it is
    skipped on ASCII text holding none (:data:`_WORD_GATED`); ``replace`` defaults to
    :func:`_named_value`. With ``starts`` (variants of :func:`secret_name_starts`), its matches
    are tried only where a secret name starts (:class:`Anchored`; ``follow``: and is followed by
    one of these characters), not at every ``name value`` pair of the text."""
    matcher: Matcher = pattern if not starts else Anchored(pattern, SECRET_HINTS, names=starts, follow=follow)
    return ("named_value", _gated(matcher, *needs, words=True), replace or _named_value)


def _gated(pattern: _M, *needs: str, words: bool = False) -> _M:
    """``pattern``, registered with the strings one of which each of its matches holds (``needs``)
    and, with ``words``, as a rule whose replacements all need a secret-like word in the text."""
    if needs:
        _RULE_NEEDS[pattern] = needs
    if words:
        _WORD_GATED.add(pattern)
    return pattern


def _keep_group(group: int) -> Callable[[re.Match[str]], str]:
    """Replacement keeping everything before ``group`` and after it, replacing only ``group``."""

    def replace(match: re.Match[str]) -> str:
        start, end = match.span(group)
        whole_start = match.start()
        text = match.group(0)
        return text[: start - whole_start] + REDACTED + text[end - whole_start :]

    return replace


def _keep_literal(group: int) -> Callable[[re.Match[str]], str]:
    """Like :func:`_keep_group`, but a placeholder (``$TOKEN``, ``${{ secrets.X }}``) stays."""
    keep = _keep_group(group)
    return lambda match: match.group(0) if is_placeholder(match.group(group)) else keep(match)


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
    # "pass": "pw" in JSON / YAML is a password; bare pass=12 is a test runner's count
    quoted_name = "q" in match.re.groupindex and match.group("q") is not None
    secret_name = is_secret_name(name) or (quoted_name and name.lower() == "pass" and not value.isdigit())
    if not value.strip("\\\"'") or value.startswith(REDACTED) or not secret_name:
        return match.group(0)
    if not _is_value(value):
        return match.group(0)
    if value.isdigit() and match.string.startswith(" bytes", match.end("value")):
        return match.group(0)  # kubectl describe secret: "password:  16 bytes"
    if match.string[match.end("value") : match.end("value") + 1] in ("(", "{"):
        return match.group(0)  # a call or a template cut at its bracket: lookup(...), %{hiera(..)}
    if "plausible" in match.re.groupindex and not (plausible_secret(value) and not value.isalpha()):
        return match.group(0)  # a bare "name value" pair: only a value with a digit or symbol
    return _keep_group(match.re.groupindex["value"])(match)


# Values of secret-named keys that are settings, not secrets ("PasswordAuthentication no",
# "password:  16 bytes" in kubectl describe, YAML block-scalar headers).
_NOT_VALUES = frozenset(
    {"true", "false", "yes", "no", "on", "off", "enabled", "disabled", "required", "optional", "<none>"}
    | {"|", ">", "|-", ">-", "|+", ">+", "''", '""', "-", "~", "{}", "[]", "(none)", "<nil>"}
)
_BYTES = re.compile(r"\d+ bytes\Z")


def _is_value(value: str) -> bool:
    """True when ``value`` (of a secret-named key) is a value to hide: not a setting word, a
    placeholder or reference (:func:`bot.redact_words.is_placeholder`), a file path or a size."""
    bare = value.strip().strip("\"'`")
    if value.strip().lower() in _NOT_VALUES or bare.lower() in _NOT_VALUES or REDACTED in bare:
        return False
    if _CALL.match(bare):  # password => lookup('db_password'), Secret(...): code that fetches one
        return False
    # client-key: /etc/kubernetes/pki/admin.key names a file; --secret-id prod/db names a secret
    return not (
        is_placeholder(bare) or _FILE_PATH.match(bare) or _BYTES.match(bare) or _NAME_PATH.match(bare)
    )


_CALL = re.compile(r"(?:=?>\s*)?[A-Za-z_][\w.:]*\(")
_NAME_PATH = re.compile(r"[a-z][a-z0-9_.\-]*(?:/[a-z][a-z0-9_.\-]*)+/?\Z")
"""A relative path of lowercase words: the name of a secret in a manager, not its value."""


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
    (r"vault\s+login|vault\s+operator\s+unseal", {}),
    (r"rabbitmqctl\s+(?:add_user|change_password|authenticate_user)", {}),
    (r"htpasswd", {}),
    (r"mc\s+(?:alias\s+set|config\s+host\s+add)", {}),
    (r"aws\s+configure\s+set", {}),
    (r"(?:npm|yarn|pnpm)\s+config\s+set|git\s+config", {}),
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
    return (
        bool(bare) and not bare.startswith(REDACTED) and bare not in ("-", "''") and not is_placeholder(bare)
    )


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
        # vault login TOKEN / vault operator unseal KEY (a base64 key ends in "="; a pair is k=v)
        plain = [i for i in args if not re.match(r"[A-Za-z_][\w.\-]*=[^=]", words[i])]
        return plain[:1]
    if cmd.startswith("rabbitmqctl"):
        return args[1:2]
    if cmd.startswith("mc"):
        return args[3:4]
    if cmd.startswith(("aws", "npm", "yarn", "pnpm", "git")):
        # aws configure set NAME VALUE, npm config set //registry/:_authToken VALUE
        return args[1:2] if args and is_secret_name(words[args[0]].rsplit(":", 1)[-1]) else []
    return []


def _command_flags(word: str, following: str) -> dict[str, str] | None:
    """The flag table of the client ``word`` (or ``word following``) names, if it is one."""
    for candidate in (f"{word} {following}", word):
        for pattern, flags in _CLIENT_COMMANDS:
            if pattern.match(candidate):
                return flags
    return None


def _client_args(match: re.Match[str]) -> str:
    args = match.group("args")
    tokens = list(_TOKEN.finditer(args))
    words = [t.group(0) for t in tokens]
    new = _hidden_arguments(" ".join(match.group("cmd").split()), words)
    if new == words:
        return match.group(0)
    out, last = [], 0
    for token, replacement in zip(tokens, new, strict=True):
        out.append(args[last : token.start()])
        out.append(replacement)
        last = token.end()
    out.append(args[last:])
    return match.group(0)[: match.start("args") - match.start()] + "".join(out)


def _hidden_arguments(cmd: str, words: list[str]) -> list[str]:
    """``words`` (the arguments of client ``cmd``) with the secrets among them hidden."""
    flags = next((f for pattern, f in _CLIENT_COMMANDS if pattern.search(cmd)), {})
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
    return new


_ARRAY_ITEM = re.compile(r"""(?P<q>["'])(?P<item>(?:(?!(?P=q))[^\\\n]|\\.)*)(?P=q)""")


def _argument_array(match: re.Match[str]) -> str:
    """A command line written as an array (``["mysql", "-uroot", "-pPW"]``, Docker's ``Args``,
    ``subprocess.run([...])``): its items read like the words of a shell command line."""
    items = list(_ARRAY_ITEM.finditer(match.group(0)))
    words = [item.group("item") for item in items]
    command = words[0].rsplit("/", 1)[-1] if words else ""
    following = words[1] if len(words) > 1 else ""
    if _command_flags(command, following) is None:
        return match.group(0)
    cmd = f"{command} {following}" if _command_flags(f"{command} {following}", "") is not None else command
    new = _hidden_arguments(cmd, words[1:])
    if new == words[1:]:
        return match.group(0)
    text, out, last = match.group(0), [], 0
    for item, replacement in zip(items[1:], new, strict=True):
        out.append(text[last : item.start("item")])
        out.append(replacement)
        last = item.end("item")
    out.append(text[last:])
    return "".join(out)


# -- base64-embedded material --------------------------------------------------------------------
_B64_RUN = re.compile(r"(?<![A-Za-z0-9+/=_\-.])[A-Za-z0-9+/]{16,}={0,2}(?![A-Za-z0-9+/=_\-.])")
_B64_PEM = re.compile(
    # "LS0tLS1CRUdJTi" is "-----BEGIN" in base64; wrapped lines (76 columns, \n escapes) follow.
    r"LS0tLS1CRUdJTi[A-Za-z0-9+/]*={0,2}(?:(?:\\n|\r?\n)[ \t]*[A-Za-z0-9+/]+={0,2}(?![^\s\"'\\,}\]]))*"
)


_USER_PASSWORD = re.compile(r"[\w.@+\-]{1,64}:(?=[^\s:]*[A-Za-z])(?=[^\s:]*[^A-Za-z\s:])[^\s:]{4,128}")
"""Decoded text that is ``user:password`` (a password with a letter and a non-letter)."""


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
    if _USER_PASSWORD.fullmatch(plain):  # echo dXNlcjpwYXNz | base64 -d, a Basic credential
        return REDACTED
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


# -- context in other syntaxes: XML, SQL, struct dumps, argument lists, prose ---------------------
def _named_xml(match: re.Match[str]) -> str:
    """``<password>v</password>``, ``<entry key="db.password">v</entry>``: the element's text."""
    name = match.group("name")
    key = _XML_KEY_ATTR.search(match.group("attrs") or "")
    if not (is_secret_name(name) or (key is not None and is_secret_name(key.group(1)))):
        return match.group(0)
    value = match.group("value")
    if not _is_value(value.strip()):
        return match.group(0)
    lead = value[: len(value) - len(value.lstrip())]
    trail = value[len(value.rstrip()) :]
    start = match.start("value") - match.start()
    return (
        match.group(0)[:start]
        + lead
        + REDACTED
        + trail
        + match.group(0)[match.end("value") - match.start() :]
    )


_LOWER_IDENTIFIER = re.compile(r"[a-z]+(?:[_\-][a-z]+)+")
"""``pg_shadow``, ``user-accounts``: lower-case words joined by ``_`` or ``-``, no digit: a table or
object name after a weak link ("from", "to"), not a value."""


def _prose(match: re.Match[str]) -> str:
    """A value a sentence calls secret; "-o jsonpath='...'" after "secret" is a flag's value (a
    word glued to "=" between the keyword and the value), not prose."""
    between = match.string[match.start() : match.start("value")]
    if re.search(r"\w[ \t]+\S*\w=", between):
        return match.group(0)
    if "\n" in between:  # a value on the next line is that line's only word ("secret:\n  name: x" is YAML)
        line_end = match.string.find("\n", match.end("value"))
        rest = match.string[match.end("value") : line_end if line_end >= 0 else len(match.string)]
        if rest.strip() or match.group("value").endswith(":"):
            return match.group(0)
    value = match.group("value")
    if match.group("link").lower() in ("to", "from") and (
        not plausible_secret(value.strip("`'\"")) or _LOWER_IDENTIFIER.fullmatch(value.rstrip(".,;:)!?"))
    ):
        # "secrets from `opsbot-secrets`", "has_password FROM pg_shadow": a name, even quoted, after
        # a weak link
        return match.group(0)
    out = _quoted_literal(match)
    second = match.group("value2")
    if second:  # "... from OLD to NEW": the new one as well
        bare = second.rstrip(".,;:)!?")
        if plausible_secret(bare) and _is_value(bare) and out.endswith(second):
            out = out[: len(out) - len(second)] + REDACTED + second[len(bare) :]
    return out


def _quoted_literal_any(match: re.Match[str]) -> str:
    """The value (quotes kept) whatever it reads like: its place says it is a secret."""
    value = match.group("value")
    if not _is_value(value):
        return match.group(0)
    start = match.start("value") - match.start()
    return match.group(0)[:start] + _hide(value) + match.group(0)[match.end("value") - match.start() :]


def _stored_value(match: re.Match[str]) -> str:
    """``put KEY VALUE`` into a key-value store: hidden when the key's last segment is a secret
    name (``service/db/password``, ``app:api_token``)."""
    last = re.split(r"[/:.]", match.group("name"))[-1]
    return _quoted_literal_any(match) if is_secret_name(last) else match.group(0)


_XML_KEY_ATTR = re.compile(r"""\b(?:key|name)\s*=\s*["']([^"']{1,120})["']""")


def _quoted_literal(match: re.Match[str]) -> str:
    """A SQL / prose value: quoted ones are hidden inside the quotes; a bare one only when it reads
    like a secret (``identified by tiger1``, not ``identified by the team``)."""
    value = match.group("value")
    quoted = value[:1] in "'\"`" and value[-1:] == value[:1] and len(value) >= 2
    bare = value[1:-1] if quoted else value.rstrip(".,;:)!?")
    if not bare or not _is_value(bare) or not (quoted or plausible_secret(bare)):
        return match.group(0)
    if quoted and value[0] == "`" and looks_like_path(bare):
        return match.group(0)  # "did pass there: `tests/gpu/test_x.py`": code, not a password
    if not quoted and match.string[match.end("value") : match.end("value") + 1] in ("(", "{"):
        return match.group(0)  # lookup('db_password'), a template
    head = match.group(0)[: match.start("value") - match.start()]
    tail = match.group(0)[match.end("value") - match.start() :]
    if quoted:
        return head + value[0] + REDACTED + value[-1] + tail
    return head + REDACTED + value[len(bare) :] + tail


_LIST_ITEM = re.compile(
    r"""(?P<q>["'])(?P<value>(?:(?!(?P=q))[^\\\n]|\\.)+)(?P=q)"""
    r"""|(?m:^(?P<dash>[ \t]*-[ \t]+)(?P<bare>[^\n]*\S))"""
)


def _named_list(match: re.Match[str]) -> str:
    """Every item of a list (JSON array or YAML block) under a secret-named key."""
    if not is_secret_name(match.group("name")):
        return match.group(0)

    def item(found: re.Match[str]) -> str:
        if found.group("q"):
            value = found.group("value")
            return (
                found.group(0) if not _is_value(value) else f"{found.group('q')}{REDACTED}{found.group('q')}"
            )
        value = found.group("bare")
        if not _is_value(value) or re.match(r"[\w.\-]+:(?:\s|$)", value):  # "- name: regcred": a map
            return found.group(0)
        return found.group("dash") + _hide(value)

    body = _LIST_ITEM.sub(item, match.group("body"))
    start = match.start("body") - match.start()
    return match.group(0)[:start] + body + match.group(0)[match.end("body") - match.start() :]


_SQL_LITERAL = re.compile(r"'(?:[^']|'')*'|[^,\s][^,]*")


def _sql_insert(match: re.Match[str]) -> str:
    """The values an INSERT puts in secret-named columns (``password``, ``api_token``)."""
    columns = [c.strip().strip('"`[]') for c in match.group("cols").split(",")]
    values = list(_SQL_LITERAL.finditer(match.group("vals")))
    secret = {i for i, column in enumerate(columns) if is_secret_name(column)}
    if len(values) != len(columns) or not secret:
        return match.group(0)
    vals, out, last = match.group("vals"), [], 0
    for index, value in enumerate(values):
        literal = value.group(0).strip()
        if index in secret and _is_value(literal):
            out.append(vals[last : value.start()])
            out.append(f"'{REDACTED}'" if literal.startswith("'") else REDACTED)
            last = value.end()
    if not out:
        return match.group(0)
    out.append(vals[last:])
    start = match.start("vals") - match.start()
    return match.group(0)[:start] + "".join(out) + match.group(0)[match.end("vals") - match.start() :]


_ACCESSORS = frozenset({
    "get", "has", "is", "load", "read", "fetch", "lookup", "find", "check", "validate", "verify",
    "reset", "rotate", "delete", "remove", "clear", "generate", "new", "create", "update", "encrypt",
    "decrypt", "hash", "compare", "match", "mask", "redact",
})  # fmt: skip
"""First words of a method that takes the name of a secret, not its value (``getPassword("db")``)."""


def _setter(match: re.Match[str]) -> str:
    """``setPassword("pw")``, ``.withApiKey("k")``, ``.password("pw")``: a value handed to a
    secret-named setter (not ``getPassword("db")``, which names what it fetches)."""
    first = WORD_SPLIT.split(match.group("name"))[0].lower() if match.group("name") else ""
    if first in _ACCESSORS:
        return match.group(0)
    return _named_value(match)


def _block_scalar(match: re.Match[str]) -> str:
    """A YAML block scalar (``password: |``) under a secret-named key: every line of it."""
    if not is_secret_name(match.group("name")):
        return match.group(0)
    lines = match.group("body").split("\n")
    hidden = [ln[: len(ln) - len(ln.lstrip())] + REDACTED if ln.strip() else ln for ln in lines]
    return match.group(0)[: match.start("body") - match.start()] + "\n".join(hidden)


_HEADER_CELL = re.compile(r"[A-Z][A-Za-z0-9_()\-]*(?: [A-Z][A-Za-z0-9_()\-]*)*")


def _secret_column(match: re.Match[str]) -> str:
    """A table whose header names a secret column (``TOKEN``, ``SECRET KEY``, ``PASSWORD``; as
    ``kubeadm token list``, ``influx auth list`` print): that column of every row below it."""
    header = match.group("head")
    columns = [(c.start(), c.end(), c.group(0)) for c in _HEADER_CELL.finditer(header)]
    secret = [
        (start, end)
        for start, end, name in columns
        if is_secret_name(name) or name.upper() in ("TOKEN", "SECRET")
    ]
    if not secret:
        return match.group(0)
    rows = []
    for row in match.group("rows").split("\n"):
        for start, _ in reversed(secret):
            if start >= len(row) or row[start].isspace() or (start and not row[start - 1].isspace()):
                continue  # no cell starts under this column's header here
            cell = re.split(r"\s{2,}", row[start:], maxsplit=1)[0].rstrip()
            if _is_value(cell):
                row = row[:start] + REDACTED + row[start + len(cell) :]
        rows.append(row)
    return match.group(0)[: match.start("rows") - match.start()] + "\n".join(rows)


def _table_body(match: re.Match[str]) -> str:
    """``vault kv get``'s Data section: every row's value column (its keys name anything)."""
    out = []
    for line in match.group("body").split("\n"):
        key, sep, value = (re.split(r"([ \t]{2,})", line, maxsplit=1) + ["", ""])[:3]
        if not value.strip() or key.strip() in ("Key", "---") or value.strip().startswith(REDACTED):
            out.append(line)
        else:
            out.append(key + sep + REDACTED)
    return match.group(0)[: match.start("body") - match.start()] + "\n".join(out)


_JSON_VALUE_KEY = re.compile(r"""("(?:Value|value|data|SecretString|secret_string)"\s*:\s*)""")
_JWK_PRIVATE_KEY = re.compile(r"""("(?:d|p|q|dp|dq|qi|k)"\s*:\s*)""")
"""A JSON Web Key's private members (RSA, EC, OKP; ``k`` of a symmetric key)."""


def _json_value_end(text: str, start: int) -> int:
    """Where the JSON value starting at ``text[start]`` ends (a string, a number, or a balanced
    object or array; a value cut off by the end of the text ends there)."""
    if start >= len(text):
        return start
    if text[start] == '"':
        end = start + 1
        while end < len(text) and text[end] != '"':
            end += 2 if text[end] == "\\" else 1
        return min(end + 1, len(text))
    if text[start] in "{[":
        depth, end, in_string = 0, start, False
        while end < len(text):
            ch = text[end]
            if in_string:
                if ch == "\\":
                    end += 1
                elif ch == '"':
                    in_string = False
            elif ch == '"':
                in_string = True
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth == 0:
                    return end + 1
            end += 1
        return end
    end = start
    while end < len(text) and text[end] not in ",}]\n":
        end += 1
    return end


def _marked_values(match: re.Match[str]) -> str:
    """Secret managers' JSON: in the object a marker opens (``"Type": "SecureString"``,
    ``"sensitive": true``, a Key Vault secret id, gcloud's ``"payload"``), every ``value`` /
    ``data`` is hidden whole, whatever its key is called elsewhere."""
    rest = match.group("rest")
    out, last = [], 0
    keys = _JWK_PRIVATE_KEY if match.group("marker").startswith('"kty"') else _JSON_VALUE_KEY
    for key in keys.finditer(rest):
        if key.start() < last:
            continue
        start = key.end()
        end = _json_value_end(rest, start)
        value = rest[start:end]
        if value.strip() in ("", '""', "null") or REDACTED in value:
            continue
        out.append(rest[last:start])
        out.append(f'"{REDACTED}"' if value.startswith('"') else REDACTED)
        last = end
    if not out:
        return match.group(0)
    out.append(rest[last:])
    return match.group(0)[: match.start("rest") - match.start()] + "".join(out)


def _command_output(match: re.Match[str]) -> str:
    """The lines a secret-printing command writes (``gcloud secrets versions access``,
    ``aws ssm get-parameter --with-decryption --output text``, ``terraform output -raw``, ...);
    structured output (JSON, YAML) is left to the rules that read it."""
    out = match.group("out")
    if out.lstrip()[:1] in ("{", "["):
        return match.group(0)
    lines = [REDACTED if line.strip() and not line.startswith(REDACTED) else line for line in out.split("\n")]
    return match.group(0)[: match.start("out") - match.start()] + "\n".join(lines)


# Latin keywords are whole words (not "secrets.X", "/db/password", "password_min_length"); CJK ones
# stand inside a run of word characters ("数据库密码是").
_WORDS_ALT = "|".join(
    (r"(?<![\w\-:/.$])" + re.escape(w) + r"s?\b") if w.isascii() else re.escape(w)
    for w in sorted(PROSE_WORDS, key=len, reverse=True)
)
_LINKS_ALT = "|".join(
    (r"\b" if w.isascii() and w[0].isalpha() else "")
    + re.escape(w)
    + (r"\b" if w.isascii() and w[-1].isalpha() else "")
    for w in sorted(PROSE_LINKS, key=len, reverse=True)
)
# A bare value is one word that is not a flag nor a key=value pair of its own.
# A bare one holds a digit, a symbol or a capital inside (so the scan moves on past "password is
# rotated" to a value that can be one).
_BARE_SECRET = r"(?=[^\s\"'`]*(?:\d|[^\w\s\"'`]|(?-i:[a-z][A-Z])))[^\s\"'`]+"
_PROSE_VALUE = (
    r"(?P<value>`[^`\n]+`|\"[^\"\n]+\"|'[^'\n]+'|«[^»\n]+»"
    rf"|(?!(?-i:[A-Z][A-Z0-9_]*|[a-z][a-z0-9_]*)=)(?!-){_BARE_SECRET})"
)
_PROSE_REST = (
    r"[*_]*"
    # up to six words in between ("for staging redis", "für den Admin", "de la base de datos")
    r"(?:[ \t]+(?![\"'`])[\w./\-]{1,24}){0,6}?"
    # a link, in Markdown emphasis or a table cell; the value may follow on the next line or in a
    # code fence ("the token is:\n```\n...")
    rf"[ \t]*[*_]*[ \t]*(?P<link>{_LINKS_ALT}|\||(?<=\s)-(?=\s)):?[*_]*[ \t]*(?:\|[ \t]*)?"
    r"(?:\r?\n(?:```\w*\r?\n)?[ \t]*)?"
    # "creds are app / PW", "login: admin / PW"
    r"(?:[\w.@\-]{0,40}\w[\w.@\-]{0,40}[ \t]*/[ \t]*)?"
    + _PROSE_VALUE
    # "changed the password from OLD to NEW": both
    + rf"(?:[ \t]+(?:to|->|→|=>)[ \t]+(?P<value2>{_BARE_SECRET}))?"
)
_PROSE = re.compile(rf"(?i)(?:{_WORDS_ALT})" + _PROSE_REST)
_PROSE_TAILS = (re.compile(r"(?i)s?\b" + _PROSE_REST), re.compile(r"(?i)" + _PROSE_REST))
"""What follows a prose keyword (one written in Latin letters, then one in other scripts)."""
# "pass X", and Cisco's "password 7 X" / "enable secret 5 X" (the digit is the encoding type)
_PROSE_BARE = re.compile(
    r"(?i)(?<![\w\-:/.$])(?:(?:password|passwd|pass|pw|pwd|passwort|senha|clave|community)[ \t]+"
    rf"(?:[0-9][ \t]+)?|secret[ \t]+[0-9][ \t]+){_PROSE_VALUE}"
)
_BARE_WORDS = ("password", "passwd", "pass", "pw", "pwd", "passwort", "senha", "clave", "community", "secret")
_PROSE_USE_AS = re.compile(
    rf"(?i)\buse[ \t]+{_PROSE_VALUE}[ \t]+as[ \t]+(?:the[ \t]+|a[ \t]+)?(?:new[ \t]+)?"
    r"(?:password|passphrase|pw|token|secret|api[ _-]?key)"
)

# Secrets made of plain words: a Google app password ("abcd efgh ijkl mnop"), a diceware
# passphrase ("correct horse battery staple"), recovery / backup codes ("1a2b3-c4d5e 9f8e7-d6c5b").
# No single word of them looks secret, so only the keyword before them can tell.
_WORD_SECRET_KEYWORDS = (
    "passphrase", "pass phrase", "pass-phrase", "app password", "app-password", "app specific password",
    "app-specific password", "application password", "seed phrase", "recovery phrase", "mnemonic",
    "recovery code", "recovery key", "backup code", "wifi key", "wpa key",
)  # fmt: skip
_WORD_SECRET = re.compile(
    r"(?i)(?:" + "|".join(re.escape(k).replace(r"\ ", r"[ \t]") for k in _WORD_SECRET_KEYWORDS) + r")s?\b"
    # up to four words in between ("for the office wifi"), then is / are / : / =
    r"(?:[ \t]+[\w\-]{1,20}){0,4}?[ \t]*(?:(?:\b(?:is|are|was|were)\b|[:=])[ \t]*[*_`'\"]?"
    # an app password (four groups of four letters) is its own evidence: no "is" needed
    r"|[ \t](?=(?-i:[a-z]{4}(?:[ -][a-z]{4}){3})(?![\w-])))"
    r"(?P<value>"
    r"(?-i:[a-z]{4}(?:[ -][a-z]{4}){3})(?![\w-])"
    r"|(?=[A-Za-z0-9-]*\d)[A-Za-z0-9]{4,10}-[A-Za-z0-9]{4,10}"  # codes: groups with a digit somewhere
    r"(?:[ \t]*,?[ \t]+(?=[A-Za-z0-9-]*\d)[A-Za-z0-9]{4,10}-[A-Za-z0-9]{4,10})*(?![\w-])"
    r"|(?-i:[a-z]{2,12}(?:[ \t-][a-z]{2,12}){2,23})"  # a passphrase: three words or more
    r"(?=[*_`'\"]?[ \t]*(?:\r?\n|$|[.,;!?)\]]))"  # ... that ends its sentence or line
    r")"
)
_PLAIN_WORDS = frozenset({
    "a", "an", "the", "and", "or", "but", "not", "no", "of", "to", "in", "on", "at", "by", "for",
    "from", "with", "into", "as", "is", "are", "was", "were", "be", "been", "being", "it", "its",
    "this", "that", "these", "those", "we", "you", "they", "he", "she", "i", "me", "my", "our",
    "your", "their", "his", "her", "has", "have", "had", "do", "does", "did", "will", "would",
    "should", "can", "could", "must", "may", "please", "see", "ask", "check", "use", "set",
    "stored", "kept", "saved", "rotated", "expired", "changed", "updated", "reset", "revoked",
    "regenerated", "required", "needed", "missing", "wrong", "invalid", "incorrect", "same",
    "still", "now", "also", "only", "just", "here", "there", "too", "very", "short", "long",
    "empty", "unset", "blank", "none", "null", "vault", "team", "entry", "manager", "file",
    "enabled", "disabled", "supported", "configured", "generated", "printed", "shown", "below",
    "above", "attached", "shared", "sent", "known", "unknown", "documented", "where", "when",
})  # fmt: skip
"""Words a passphrase-shaped value holds only when it is a sentence about the secret ("the
passphrase is stored in vault"), not the secret."""


_SEED_LENGTHS = frozenset({12, 15, 18, 21, 24})


def _word_secret(match: re.Match[str]) -> str:
    """The value after a word-secret keyword, unless it is a sentence about the secret."""
    value = match.group("value")
    words = re.split(r"[ \t,-]+", value.lower())
    sentence = (
        value[:1].islower()
        and len(words) >= 3
        and not any(c.isdigit() for c in value)
        # 12 to 24 words in steps of 3 is a BIP-39 seed phrase, whose word list has "about", "above"
        and len(words) not in _SEED_LENGTHS
        and any(word in _PLAIN_WORDS for word in words)
    )
    if sentence:
        return match.group(0)
    start = match.start("value") - match.start()
    return match.group(0)[:start] + REDACTED + match.group(0)[match.end("value") - match.start() :]


# -- the entropy fallback: a random-looking string near a secret-like word ------------------------
_CANDIDATE = re.compile(r"(?<![\w\-+/.~])[A-Za-z0-9][A-Za-z0-9_\-+/.~]{15,}={0,2}(?![\w=])")
_PATH = re.compile(r"[a-z0-9_.\-]*(?:/[a-z0-9_.\-]*)+")
_WORD = re.compile(r"[^\W\d_]+|\d+")
_FILLERS = frozenset({
    "is", "are", "was", "now", "new", "one", "the", "a", "an", "for", "of", "our", "this", "it",
    "its", "here", "to", "set", "be", "as", "in", "primary", "secondary", "value", "current",
    "rotated", "updated", "old",
})  # fmt: skip
_ID_WORDS = frozenset({
    "id", "ids", "uid", "uuid", "commit", "sha", "sha1", "sha256", "md5", "digest", "checksum",
    "hash", "trace", "span", "request", "etag", "revision", "version", "image", "build",
    "fingerprint", "resourceversion", "nonce", "accessor", "serial", "file", "path",
})  # fmt: skip
_NOT_SECRET_SHAPES = re.compile(
    r"""(?x)^(?:
        [0-9a-f]{7,12}|[0-9a-f]{40}|[0-9a-f]{64}|[0-9A-F]{40}|[0-9A-F]{64}   # git SHAs, sha256 digests
      | [0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}          # UUIDs
      | [0-9a-f]{16}|[0-9a-f]{32}                                             # span / trace ids, md5
      | sha(?:1|256|384|512)[:=][0-9a-fA-F]{16,}                             # image digests, CA hashes
      | [a-z0-9][a-z0-9\-]*-[bcdfghjklmnpqrstvwxz2456789]{8,10}(?:-[bcdfghjklmnpqrstvwxz2456789]{5})?  # pods
    )$"""
)


def _near_secret_word(before: str) -> int | None:
    """How many words stand between the end of ``before`` and the nearest secret-like word before
    it on the same line (``None``: none, or an id-like word comes first: "trace_id=...")."""
    words = _WORD.findall(before[-80:].rsplit("\n", 1)[-1].lower())
    distance = 0
    for index, word in enumerate(reversed(words)):
        if word in _ID_WORDS:
            return None
        if word in ("key", "keys") or is_secret_name(word):
            previous = words[-index - 2] if index + 1 < len(words) else ""
            # "checksum/secret", "hash_key": a digest or an address of data, not a secret
            if previous in _ID_WORDS:
                return None
            # "idempotency_key=<uuid>", "cache key <sha>": an id; a random key stays suspect
            return distance + (1 if previous in NOT_SECRET_KEYS and previous != "routing" else 0)
        if word not in _FILLERS:
            distance += 1
        if distance > 3:
            return None
    return None


def _entropy_fallback(text: str) -> tuple[str, int]:
    """Random-looking strings (:func:`bot.redact_tokens.looks_random`) shortly after a secret-like
    word ("datadog api key for the new org is 3f9c...", "routing key 8d7e..."): hidden, unless
    their shape is an id an incident is about (SHA, UUID, digest, trace id, pod hash), which is
    hidden only right after the word ("nomad token 5b7d..."), never after an id word."""
    out, last, found = [], 0, 0
    for start, end in _hint_lines(text):
        for match in _CANDIDATE.finditer(text, start, end):
            value = match.group(0).rstrip(".,")
            if match.start() < last or REDACTED in value or _PATH.fullmatch(value):
                continue
            if "://" in text[match.start() - 3 : match.start()] or not looks_random(value.rstrip("=")):
                continue
            distance = _near_secret_word(text[: match.start()])
            if distance is None or distance > 3 or (distance > 0 and _NOT_SECRET_SHAPES.match(value)):
                continue
            out.append(text[last : match.start()])
            out.append(REDACTED)
            last = match.start() + len(value)
            found += 1
    if not found:
        return text, 0
    out.append(text[last:])
    return "".join(out), found


def _hint_lines(text: str) -> list[tuple[int, int]]:
    """(start, end) of the stretches of ``text`` from a secret-like word's stem to the end of its
    line: the only places the entropy fallback looks (its word must come first, on that line)."""
    lowered = lowercased(text)
    if len(lowered) != len(text):  # lowercasing moved offsets (rare letters): look everywhere
        return [(0, len(text))]
    spans = []
    for at, _ in keyword_positions(lowered, SECRET_HINTS):
        end = lowered.find("\n", at)
        spans.append((at, len(text) if end < 0 else end))
    spans.sort()
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


_WEBHOOKS = [(kind, needle, re.compile(pattern)) for kind, needle, pattern in WEBHOOKS]

# Names may carry a domain prefix (annotation keys such as "example.com/db-password").
_NAME = r"[A-Za-z_][A-Za-z0-9_.\-/]{0,120}"
_VALUE = r"[^\s\"'`,;&<>(){}\[\]]+"
_RULES: list[_Rule] = [
    # Private key blocks (PEM, OpenSSH, PGP), also with JSON-escaped newlines or cut off by a log tail.
    (
        "private_key",
        re.compile(
            r"-----BEGIN(?P<label>[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?| OpenVPN Static key V1)-----"
            r"(?:[\s\S]*?-----END(?P=label)-----|[\s\S]*?(?=\n\s*\n|\"|\Z))"
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
    # Incoming-webhook and bot URLs carry their secret in the path or query (a table of data).
    *(
        (kind, _gated(pattern, needle), _keep_group(pattern.groupindex["secret"]))
        for kind, needle, pattern in _WEBHOOKS
    ),
    # Authorization headers: keep the scheme, drop the credential.
    (
        "authorization",
        _gated(
            re.compile(
                r"(?i)\b((?:proxy-|set-|x-)?authorization[\"']?\s*[:=]\s*[\"']?"
                r"(?:bearer|token|digest|apikey|api-key|key|negotiate|sso-key|ssws|geniekey|splunk|bot|dsn|hmac"
                r"|klaviyo-api-key|zoho-oauthtoken|oauth|sharedaccesssignature|ghl|pat)\s+)"
                r"([^\s\"',;]+)"
            ),
            "authorization",
        ),
        _keep_literal(2),
    ),
    # Any other scheme, or none: a credential that reads like one (so "authorization: denied" stays).
    (
        "authorization",
        _gated(
            re.compile(
                r"(?i)\b((?:proxy-|set-|x-)?authorization[\"']?\s*[:=]\s*[\"']?(?:(?!basic\s)[A-Za-z][\w.\-]*\s+)?)"
                r"((?=[^\s\"',;]*[0-9])(?=[^\s\"',;]*[A-Za-z])[^\s\"',;]{16,})"
            ),
            "authorization",
        ),
        _keep_literal(2),
    ),
    # A bearer credential has a digit or symbol in it, or is long: "bearer authentication" is prose.
    (
        "bearer",
        re.compile(r"(?i)\b(bearer\s+)((?=[A-Za-z]*[0-9._~+/=\-])[A-Za-z0-9._~+/=\-]{8,}|[A-Za-z]{24,})"),
        _keep_group(2),
    ),
    ("basic_auth", re.compile(r"(?i)\b(basic\s+)([A-Za-z0-9+/]{6,}={0,2})(?![A-Za-z0-9+/=])"), _basic),
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
    (
        "cli_flag",
        _gated(
            re.compile(
                r"""\[\s*(?:"(?:[^"\\\n]|\\.)*"|'[^'\n]*')(?:\s*,\s*(?:"(?:[^"\\\n]|\\.)*"|'[^'\n]*'))+\s*\]"""
            ),
            "[",
        ),
        _argument_array,
    ),
    # Twilio: an account or API key SID followed by its auth token or secret (Client(SID, TOKEN),
    # SID:TOKEN basic auth).
    (
        "twilio_auth",
        _gated(
            # (no \b before the SID: a pattern starting with a letter scans fast; the replacement checks)
            re.compile(r"(?:AC|SK)[0-9a-fA-F]{32}[\"']?[ \t]*[,:][ \t]*[\"']?(?P<value>[0-9a-zA-Z]{32})\b"),
            "ac",
            "sk",
        ),
        lambda m: (
            _keep_group(1)(m)
            if looks_random(m.group("value")) and not m.string[m.start() - 1 : m.start()].isalnum()
            else m.group(0)
        ),
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
    # A shell value quoted in pieces: PASSWORD='it'\''s' (the whole of it).
    _by_name(re.compile(rf"(?<![\w.\-$])(?P<name>{_NAME})=(?P<value>'[^'\n]*'(?:\\''[^'\n]*')+)"), "\\'"),
    # GitHub Actions' ::add-mask::VALUE (the value a workflow asks to hide) and a literal piped
    # into a client that reads its password from stdin.
    ("ci_mask", _gated(re.compile(r"::add-mask::(?P<value>[^\n]+)"), "::add-mask::"), _keep_group(1)),
    (
        "cli_flag",
        _gated(
            re.compile(
                r"\b(?:echo|printf)(?:[ \t]+-[neE]+)*(?:[ \t]+'%s[^']*')?[ \t]+"
                r"(?P<value>\"[^\"\n]+\"|'[^'\n]+'|[^\s|;&]+)[ \t]*\|[^\n|]*?"
                r"(?:--password-stdin|--pass(?:word)?-stdin|chpasswd|passwd\b|--from-file=\S*/dev/stdin)"
            ),
            "stdin",
            "passwd",
        ),
        _quoted_literal,
    ),
    # A here-string fed to a command that reads a secret from stdin (docker secret create NAME -).
    (
        "cli_flag",
        _gated(
            re.compile(
                r"(?im)^(?=[^\n]*(?:secret|passw|stdin|token))[^\n]*?<<<[ \t]*"
                r"(?P<value>\"[^\"\n]+\"|'[^'\n]+'|[^\s;|&]+)"
            ),
            "<<<",
        ),
        _quoted_literal_any,
    ),
    # A key-value store's put / set of a secret-named key (consul kv put app/db/password V, etcdctl
    # put, redis SET, vault kv put's positional form) and aws ssm put-parameter's --value.
    (
        "named_value",
        _gated(
            Anchored(
                re.compile(
                    r"(?i)\b(?:put|set|setex|hset|write)[ \t]+(?:-{1,2}[\w-]+(?:=\S+)?[ \t]+)*"
                    r"(?P<name>[\w./:\-]*\w)[ \t]+(?:\d+[ \t]+)?"
                    rf"(?P<value>\"[^\"\n]*\"|'[^'\n]*'|{_BARE_SECRET})"
                ),
                ["put", "set", "setex", "hset", "write"],
            ),
            "put",
            "set",
            "write",
            words=True,
        ),
        _stored_value,
    ),
    (
        "named_value",
        _gated(
            re.compile(
                r"(?i)put-parameter\b(?P<args>[^\n]*?)--value[ =](?P<value>\"[^\"\n]*\"|'[^'\n]*'|\S+)"
            ),
            "put-parameter",
        ),
        lambda m: (
            _quoted_literal_any(m)
            if re.search(r"securestring|--name[ =]\S*(?:pass|secret|token|key|cred)", m.group(0), re.I)
            else m.group(0)
        ),
    ),
    # A table whose header names a secret column (kubeadm token list, influx auth list, ...).
    (
        "secret_column",
        _gated(
            re.compile(
                r"(?m)^(?P<head>[ \t]*[A-Z][A-Za-z0-9_()\-]*(?: [A-Z][A-Za-z0-9_()\-]*)*"
                r"(?:[ \t]{2,}[A-Z][A-Za-z0-9_()\-]*(?: [A-Z][A-Za-z0-9_()\-]*)*)+)[ \t]*\r?\n"
                r"(?P<rows>(?:[ \t]*\S[^\n]*(?:\n|\Z))+)"
            ),
            words=True,
        ),
        _secret_column,
    ),
    # YAML block scalars under a secret-named key (password: |, tls.key: >-).
    _by_name(
        re.compile(
            r"(?m)^(?P<i>[ \t]*)(?:-[ \t]+)?(?P<name>[\w.\-/]+)[ \t]*:[ \t]*[|>][-+]?[ \t]*\r?\n"
            r"(?P<body>(?:(?P=i)[ \t]+\S[^\n]*(?:\n|\Z)|[ \t]*\r?\n(?=(?P=i)[ \t]+\S))+)"
        ),
        starts="l",
        follow=":",
        replace=_block_scalar,
    ),
    # PuTTY key files: the private lines.
    (
        "private_key",
        _gated(re.compile(r"(Private-Lines:[ \t]*\d+\r?\n)((?:[A-Za-z0-9+/=]+\r?\n?)+)"), "private-lines"),
        lambda m: m.group(1) + REDACTED + ("\n" if m.group(2).endswith("\n") else ""),
    ),
    # Secret managers' JSON: the value of a SecureString parameter, a sensitive Terraform output,
    # a Key Vault secret, a gcloud secret version's payload.
    (
        "secret_manager",
        _gated(
            re.compile(
                r"(?P<marker>\"Type\"\s*:\s*\"SecureString\"|\"sensitive\"\s*:\s*true|\"kty\"\s*:\s*\"\w+\""
                r"|\.vault\.azure\.(?:net|cn|us)/secrets/[^\"\s]*\"|\"payload\"\s*:\s*\{)"
                r"(?P<rest>(?:[^{}]|\{(?:[^{}]|\{[^{}]*\})*\})*)"
            ),
            "securestring",
            "sensitive",
            "vault.azure.",
            "payload",
            "kty",
        ),
        _marked_values,
    ),
    # The lines a secret-printing command writes below it.
    (
        "command_output",
        _gated(
            Anchored(
                re.compile(
                    r"(?i)\b(?P<cmd>(?:aws\s+ssm\s+get-parameters?\b[^\n]*--with-decryption"
                    r"|aws\s+secretsmanager\s+get-secret-value|az\s+keyvault\s+secret\s+show"
                    r"|gcloud\s+secrets\s+versions\s+access"
                    r"|terraform\s+output\s+(?:-raw\b|[a-z_][\w-]*[ \t]*$)"
                    r"|kubectl\s+get\s+secrets?\b[^\n]*(?:jsonpath|go-template|base64)"
                    r"|vault\s+(?:kv\s+get|read)\b[^\n]*-field|vault\s+operator\s+generate-root"
                    r"|op read|doppler\s+secrets\s+get|kubeadm\s+token\s+(?:create|generate)"
                    r"|openssl\s+rand|pwgen|head\s+-c\s*\d+\s+/dev/urandom)[^\n]*)\r?\n"
                    # output lines up to the next prompt ($, #, >, PS ...>, user@host:)
                    r"(?P<out>(?:(?![ \t]*(?:[$#>%]|PS[^\n>]*>|\w[\w.-]*@[\w.-]+[:~ ]))"
                    r"[ \t]*\S[^\n]*(?:\n|\Z)){1,20})",
                    re.M,
                ),
                ["aws", "az", "gcloud", "terraform", "kubectl", "vault", "op read", "doppler", "kubeadm"]
                + ["openssl", "pwgen", "head"],
            ),
            "ssm",
            "secretsmanager",
            "keyvault",
            "gcloud",
            "output",
            "secret",
            "vault",
            "op read",
            "doppler",
            "kubeadm",
            "openssl",
            "pwgen",
            "urandom",
        ),
        _command_output,
    ),  # fmt: skip
    # vault kv get: every value of the Data table.
    (
        "vault_data",
        _gated(
            re.compile(r"(?m)^=+ (?:Secret )?Data =+[ \t]*\r?\n(?P<body>(?:[ \t]*\S[^\n]*(?:\n|\Z))+)"),
            "data =",
        ),
        _table_body,
    ),
    # Kubernetes env lists in YAML: - name: DB_PASSWORD / value: ...
    _by_name(
        re.compile(
            r"(?m)^(?P<i>[ \t]*)-[ \t]+name:[ \t]*[\"']?(?P<name>[^\"'\n]+?)[\"']?[ \t]*\r?\n"
            r"(?P=i)[ \t]+value:[ \t]*(?P<value>\"[^\"\n]*\"|'[^'\n]*'|[^\n]+)"
        ),
        starts="l",
        follow="\r\n",
        replace=_yaml_env,
    ),
    # Passwords in URLs: scheme://user:password@host (user kept).
    (
        "url_password",
        # Greedy up to the last "@" before the host: a raw "@" inside the password is kept hidden.
        # (The scheme before "://" is kept as it is; leaving it out of the pattern lets the scan
        # jump from one "://" to the next.)
        re.compile(r"(://[^:/@\s\"']*:)([^\s/\"'<>|]+)(@)"),
        _keep_literal(2),
    ),
    # A key as the URL's user (Sentry DSNs, https://TOKEN@github.com): a random-looking user.
    (
        "url_password",
        _gated(re.compile(r"://(?P<value>[A-Za-z0-9_\-]{16,})@"), "://"),
        lambda m: _keep_group(1)(m) if looks_random(m.group("value")) else m.group(0),
    ),
    # XML: <password>v</password>, <entry key="db.password">v</entry>, <add key="ApiKey" value="v"/>.
    _by_name(
        re.compile(
            r"<(?P<name>[A-Za-z_][\w:.\-]*)(?P<attrs>\s[^<>]*)?>(?P<value>[^<>]{1,2000}?)</(?P=name)\s*>"
        ),
        "</",
        replace=_named_xml,
    ),
    _by_name(
        re.compile(
            r"\b(?:key|name)\s*=\s*(?P<q>[\"'])(?P<name>[^\"'\n]{1,120})(?P=q)\s+value\s*=\s*"
            r"(?P<q2>[\"'])(?P<value>[^\"'\n]*)(?P=q2)"
        ),
        "value",
    ),
    _by_name(
        re.compile(
            r"<(?P<name>[A-Za-z_][\w:.\-]*)\s(?:[^<>]*?\s)?value\s*=\s*(?P<q>[\"'])(?P<value>[^\"'\n]*)(?P=q)"
        ),
        "value",
        starts="q",
    ),
    # SQL: INSERT INTO users (name, password) VALUES ('app', 'pw'): the values of secret columns.
    (
        "sql_password",
        _gated(
            re.compile(
                r"(?is)\binsert\s+into\s+[\w.\"`\[\]]+\s*\((?P<cols>[^()]*)\)\s*values\s*"
                r"\((?P<vals>(?:[^()']|'(?:[^']|'')*')*)\)"
            ),
            "insert",
            words=True,
        ),
        _sql_insert,
    ),
    # SQL: CREATE USER .. IDENTIFIED BY 'pw', .. WITH PASSWORD = 'pw', SET PASSWORD FOR u = 'pw'.
    (
        "sql_password",
        _gated(
            re.compile(
                r"(?i)\bidentified\s+(?:with\s+[\w'\"]+\s+)?(?:by|as)\s+(?:values\s+)?"
                r"(?P<value>'(?:[^'\n]|'')*'|\"[^\"\n]*\"|[^\s;'\"]+)"
            ),
            "identified",
        ),
        _quoted_literal,
    ),
    (
        "sql_password",
        _gated(
            Anchored(
                re.compile(
                    r"(?i)\bpassword(?:\s+for\s+[^\s=]+)?(?:\s*=\s*|\s+)[NnEe]?"
                    r"(?P<value>'(?:[^'\n]|'')*'|\"[^\"\n]*\")"
                ),
                ["password"],
            ),
            "password",
        ),
        _quoted_literal,
    ),
    # Lists under a secret-named key: "unseal_keys_b64": ["..", ".."], YAML "- item" lines.
    _by_name(
        re.compile(r"\"(?P<name>[^\"\n]{1,80})\"\s*:\s*\[(?P<body>[^\[\]{}]*)\]"),
        "[",
        starts="q",
        follow=":",
        replace=_named_list,
    ),
    _by_name(
        re.compile(
            r"(?m)^(?P<i>[ \t]*)(?P<name>[\w.\-]+):[ \t]*\r?\n"
            r"(?P<body>(?:(?P=i)[ \t]*-[ \t]+[^\n]+(?:\n|\Z))+)"
        ),
        "-",
        starts="l",
        follow=":",
        replace=_named_list,
    ),
    # Kubernetes env entries and similar name/value pairs in JSON.
    _by_name(
        re.compile(
            r"(\"name\"\s*:\s*\"(?P<name>[^\"]{1,80})\"\s*,\s*\"value\"\s*:\s*\")"
            # \\\\" first: inside a bytes repr an escaped quote shows as two backslashes and a quote.
            r"(?P<value>(?:[^\"\\]|\\\\\"|\\.)*)(\")"
        )
    ),
    # Argument lists: ["--db-password", "pw"] (JSON, Python, Docker's Args) and YAML items on two
    # lines (- --api-key / - pw).
    _by_name(
        re.compile(
            r"(?P<q>[\"'])-{1,2}(?P<name>[A-Za-z][\w.\-]*)(?P=q)\s*,\s*"
            r"(?P<q2>[\"'])(?P<value>(?:(?!(?P=q2))[^\\\n]|\\.)+)(?P=q2)"
        ),
        "-",
        starts="q",
        follow=",",
    ),
    _by_name(
        re.compile(
            r"(?m)^(?P<i>[ \t]*)-[ \t]+[\"']?-{1,2}(?P<name>[A-Za-z][\w.\-]*)[\"']?[ \t]*\r?\n"
            r"(?P=i)-[ \t]+(?P<value>(?!-)[^\n]*\S)"
        ),
        "-",
        starts="l",
        follow="\r\n",
        replace=_yaml_env,
    ),
    # Terraform: variable "db_password" { default = "pw" }.
    _by_name(
        re.compile(r"\bvariable\s+\"(?P<name>[^\"\n]+)\"\s*\{[^{}]*?\bdefault\s*=\s*\"(?P<value>[^\"\n]*)\""),
        "variable",
    ),
    # login("user", "pw"), client.auth("admin", "pw"), basic_auth=("user", "pw").
    (
        "cli_flag",
        _gated(
            re.compile(
                r"(?i)\b(?:auth|basic_?auth|login|log_in|authenticate|credentials|set_credentials|connect)"
                r"(?:\(|=\(|=[ \t]+\()[ \t]*(?P<q>[\"'])[^\"'\n]{1,64}(?P=q)\s*,\s*"
                r"(?P<q2>[\"'])(?P<value>[^\"'\n]+)(?P=q2)"
            ),
            "auth(",
            "auth=",
            "login(",
            "log_in(",
            "authenticate(",
            "credentials(",
            "connect(",
        ),
        _keep_group(3),
    ),
    # ("DB_PASSWORD", "pw") as a call's arguments (define(), os.environ.setdefault(), a pair in a
    # list): only a value that reads like a secret ("password", "token" lists of names stay).
    _by_name(
        re.compile(
            r"(?P<q>[\"'])(?P<name>[A-Za-z_][\w.\-]*)(?P=q)\s*,\s*"
            r"(?P<q2>[\"'])(?P<value>(?:(?!(?P=q2))[^\\\n]|\\.)+)(?P=q2)(?P<plausible>)"
        ),
        ",",
        starts="nq",
        follow=",",
    ),
    # env["DB_PASSWORD"] = "pw", $_ENV['API_KEY'] = 'k', config[:token] = "t".
    _by_name(
        re.compile(
            r"\[\s*(?::|(?P<q>[\"']))(?P<name>[A-Za-z_][\w.\-]*)(?P=q)?\s*\]\s*=\s*"
            r"(?P<q2>[\"'])(?P<value>(?:(?!(?P=q2))[^\\\n]|\\.)+)(?P=q2)"
        ),
        "]",
    ),
    # setPassword("pw"), .withApiKey("k"), .password("pw").
    _by_name(
        re.compile(
            r"(?:\b(?:set|with)|\.)(?P<name>[A-Za-z_]\w*)\(\s*(?P<q>[\"'])"
            r"(?P<value>(?:(?!(?P=q))[^\\\n]|\\.)+)(?P=q)\s*\)"
        ),
        "(",
        replace=_setter,
    ),
    # A flag whose value is on the next line (ps output, a wrapped command line).
    _by_name(
        re.compile(
            r"(?<![\w-])-{1,2}(?P<name>[A-Za-z][\w.\-]*)[ \t]*\\?\r?\n"
            r"[ \t]*(?P<value>(?!-)[^\s\\]+)[ \t]*$",
            re.M,
        ),
        "-",
        starts="n",
        follow="\r\n",
    ),
    # "key": "value" (JSON), 'key': 'value' (Python reprs) and key="value" / key='value' (logfmt,
    # shells, labels).
    _by_name(
        re.compile(rf"(?P<q>[\"'])(?P<name>{_NAME})(?P=q)\s*:\s*\"(?P<value>(?:[^\"\\]|\\.)+)\""),
        starts="q",
        follow=":",
    ),
    _by_name(
        re.compile(rf"(?P<q>[\"'])(?P<name>{_NAME})(?P=q)\s*:\s*'(?P<value>(?:[^'\\]|\\.)+)'"),
        starts="q",
        follow=":",
    ),
    # JSON inside a JSON string or a bytes repr: \"key\": \"value\" (any number of backslashes).
    _by_name(
        re.compile(rf"(?P<bs>\\+)\"(?P<name>{_NAME})(?P=bs)\"\s*:\s*(?P=bs)\"(?P<value>[^\"\n]*?)(?P=bs)\""),
        starts="q",
        follow=":",
    ),
    _by_name(
        re.compile(
            rf"(?<![\w.\-$])-{{0,2}}(?P<name>{_NAME})\s*=\s*(?P<bs>\\*)(?P<q>[\"'])(?P<value>[^\"'\n\\]+)(?P=bs)(?P=q)"
        ),
        starts="n",
        follow="=",
    ),
    # A whole line NAME=value or name = value (env dumps, .env, INI, properties): the value is the
    # rest of the line, spaces and delimiters included, unless more key=value pairs follow (logfmt).
    _by_name(
        re.compile(
            r"(?m)^[ \t]*(?:(?:export|set|setenv|declare[ \t]+-x|ENV|ARG)[ \t]+)?"
            rf"(?P<name>{_NAME})[ \t]*=[ \t]*(?P<value>[^\s\"'][^\n]*?)[ \t]*\r?$"
        ),
        "=",
        starts="l",
        follow="=",
        replace=lambda m: m.group(0) if re.search(r"\s[\w.\-]+=", m.group("value")) else _named_value(m),
    ),
    # URL-encoded: secret%3Dvalue%26... (a form body or query string inside another one).
    _by_name(
        re.compile(
            r"(?i)(?<![\w%])(?P<name>[A-Za-z_][\w.\-]*)%3D(?P<value>(?:[^%\s&\"'<>]|%(?!26|3B|20)[0-9A-Fa-f]{2})+)"
        ),
        "%3d",
    ),
    # key=value (env, logfmt, connection strings, query strings, --flag=value).
    _by_name(
        re.compile(rf"(?<![\w.\-$])-{{0,2}}(?P<name>{_NAME})\s*=\s*(?P<value>{_VALUE})"),
        starts="n",
        follow="=",
    ),
    # name: value as a whole line (YAML, HTTP headers, tool output such as "Unseal Key 1: ..."):
    # the value is the rest of the line, spaces included (a trailing " # comment" kept).
    _by_name(
        re.compile(
            # labels of several words are Title Case ("Initial Root Token"), not prose
            rf"(?m)^[ \t]*(?:-[ \t]+)?(?P<name>{_NAME}|[A-Z][\w\-]*(?:[ ](?:[A-Z][\w\-]*|\d+)){{1,3}})"
            r"[ \t]*:[ \t]+"
            r"(?P<value>[^\s\"'#|>][^\n]*?)(?=[ \t]+#|[ \t]*\r?$)"
        ),
        ":",
    ),
    # key: value after { , ; - so prose such as "failed to refresh token: context deadline
    # exceeded" is not taken for a secret.
    _by_name(
        re.compile(
            rf"(?m)(?:^|(?<=[{{,;|])|(?<=: ))[ \t]*(?:-[ \t]+)?(?P<name>{_NAME})[ \t]*:[ \t]*"
            rf"(?P<value>\"[^\"\n]+\"|'[^'\n]+'|{_VALUE})"
        ),
        starts="w",
        follow=":",
    ),
    # IDENTIFIER: value anywhere (DB_PASSWORD, x-api-key, apiKey, TOKEN): names shaped like code,
    # not like prose, so "refresh token: context deadline exceeded" stays as it is.
    _by_name(
        re.compile(
            r"(?<![\w.\-$])(?P<name>[A-Za-z][A-Za-z0-9]*(?:[_.\-][A-Za-z0-9]+)+|[a-z]+[A-Z][A-Za-z0-9]*|[A-Z][A-Z0-9]+)"
            rf"[ \t]*:[ \t]*(?P<value>\"[^\"\n]+\"|'[^'\n]+'|{_VALUE})"
        ),
        starts="n",
        follow=":",
    ),
    # Go / Rust struct dumps: {User:app Password:pw} (%+v), &Auth{Password:"pw"} (%#v).
    _by_name(
        re.compile(
            r"(?<=[{\s,(&\[])(?P<name>[A-Za-z][A-Za-z0-9_]*):(?P<value>\"(?:[^\"\\\n]|\\.)*\"|[^\s,}\])\"]+)"
        ),
        ":",
        starts="n",
        follow=":",
    ),
    # --password value / -token value (command lines).
    _by_name(
        re.compile(
            rf"(?<![\w-])-{{1,2}}(?P<name>[A-Za-z][A-Za-z0-9_.\-]{{1,120}})[ \t]+(?P<value>(?!-){_VALUE})"
        ),
        "-",
        starts="n",
    ),
    # A bare "name value" pair (redis.conf's requirepass, slapd's rootpw, haproxy's
    # insecure-password, a Dockerfile's ENV): a value that reads like a secret.
    _by_name(
        re.compile(
            r"(?<![\w.\-$/])(?:(?:ENV|ARG|setenv|set|export)[ \t]+)?"
            # a plain word ("password is ...", "the secret mounted ...") is the prose rules' to read
            r"(?!(?i:password|passwd|passphrase|secrets?|tokens?|credentials|creds|pass|pw|pwd|key)\b)"
            r"(?P<name>[A-Za-z][A-Za-z0-9]*(?:[_\-][A-Za-z0-9]+)*)[ \t]+"
            r"(?P<value>(?![A-Z][A-Z0-9_]*=|[a-z][a-z0-9_]*=)(?![-(\[{])[^\s\"'`,;]+)"
            r"(?P<plausible>)"
        ),
        starts="n",
    ),
    # Chat prose in the major languages: "the new prod db password is ...", "密码：...".
    ("prose", _gated(Anchored(_PROSE_BARE, _BARE_WORDS), words=True), _quoted_literal),
    ("prose", _gated(Anchored(_PROSE, PROSE_WORDS, tail=_PROSE_TAILS), words=True), _prose),
    ("prose", _gated(Anchored(_PROSE_USE_AS, ["use"]), "use", words=True), _quoted_literal),
    ("prose", Anchored(_WORD_SECRET, _WORD_SECRET_KEYWORDS), _word_secret),
    # user:password after an auth-like word (haproxy's "stats auth admin:pw", "creds app:pw").
    (
        "prose",
        _gated(
            Anchored(
                re.compile(
                    r"(?i)(?<![\w\-])(?:auth|basic-auth|creds?|credentials|userpass|login)[ \t:=]+"
                    r"[\w.@\-]{1,64}:(?P<value>[^\s@/\"']+)(?=[\s\"']|$)"
                ),
                ["auth", "basic-auth", "cred", "userpass", "login"],
            ),
            words=True,
        ),
        _quoted_literal,
    ),
]


def _needs_of(rules: list[_Rule]) -> dict[Matcher, tuple[str, ...]]:
    """Per rule, lowercase ASCII strings one of which every match contains (the rule is skipped on
    an ASCII text holding none of them). Found by the rule's own pattern text, so a rule edited out
    of these shapes simply loses its shortcut; tests/reliability/test_secrets_corpus.py checks each
    against the redaction corpus."""
    needs: dict[Matcher, tuple[str, ...]] = {}
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
    if not text:
        return text, counts
    # On ASCII text a rule whose every match holds a known string is skipped where none is present
    # (most rules, on most answers: the full passes were 10% of the event loop under a burst), and
    # so is every rule that needs a secret-like word when the text holds none of their stems.
    # Only on ASCII: Unicode case folding lets (?i) match letters that lower() does not produce.
    lowered = text.lower() if text.isascii() else None
    words = lowered is None or any(hint in lowered for hint in SECRET_HINTS)
    text = _vendor_tokens(text, counts)
    if lowered is not None and counts:
        lowered = text.lower()
    for kind, pattern, replace in _RULES:
        if not text:
            break
        if lowered is not None:
            needs = _NEEDS.get(pattern)
            if needs is not None and not any(n in lowered for n in needs):
                continue
            if not words and pattern in _WORD_GATED:
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
    if words:
        text, found = _entropy_fallback(text)
        if found:
            counts["high_entropy"] = counts.get("high_entropy", 0) + found
    return text, counts


def _vendor_tokens(text: str, counts: dict[str, int]) -> str:
    """``text`` with every vendor token (:mod:`bot.redact_tokens`) replaced, counted by its kind."""
    spans = find_tokens(text)
    if not spans:
        return text
    out, last = [], 0
    for start, end, kind in spans:
        out.append(text[last:start])
        out.append(REDACTED)
        last = end
        counts[kind] = counts.get(kind, 0) + 1
    out.append(text[last:])
    return "".join(out)


_NEEDS = {**_needs_of(_RULES), **_RULE_NEEDS}


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
