"""Which words mark a secret: key and variable names (:func:`is_secret_name`), the words around a
value in prose, in the major languages (:data:`PROSE_WORDS`), values that only refer to a secret
elsewhere (:func:`is_placeholder`), and what a value must look like to be taken from prose
(:func:`plausible_secret`). Data and small predicates only; ``bot.redact`` applies them.
"""

from __future__ import annotations

import functools
import re

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
        # Directives and compounds of servers' own configs (redis.conf, slapd, keepalived, Consul).
        "requirepass",
        "masterauth",
        "bindpw",
        "rootpw",
        "rootpass",
        "authpass",
        "pw",
        "encrypt",
        "secretid",
        "clientsec",
        "sessiontoken",
        "community",
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
        # settings about passwords and tokens, not their values (postgresql.conf, sshd_config, ...)
        "encryption",
        "authentication",
        "policies",
        "renewable",
        "min",
        "max",
        "required",
        "reset",
        "backend",
        "engine",
        "field",
        "fields",
        "mount",
        "arn",
        "sha",
        "hash",
        "digest",
        "checksum",
        "fingerprint",
        "expire",
        "validity",
        "complexity",
        "history",
        "label",
        "labels",
        "selector",
        "template",
        "store",
        "storage",
        "manager",
        "algo",
        "alg",
    }
)
# Words before a final "key" that make it an address of data, not a credential.
NOT_SECRET_KEYS = frozenset(
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
        # quantities of keys ("max_keys: 1000")
        "max",
        "min",
        "num",
        "number",
        "total",
    }
)
# Words before a final "data" that make the value key or certificate material.
_MATERIAL_WORDS = frozenset(
    {"key", "cert", "certificate", "crt", "token", "secret", "password", "pem", "keystore", "p12", "pfx"}
)
WORD_SPLIT = re.compile(r"[_.\-/\s]+|(?<=[a-z0-9])(?=[A-Z])")
"""Where a name splits into words: separators and lower-to-upper case changes ("dbPassword")."""


# Last components naming only how the value is written ("unseal_keys_b64", "root_token_hex") and
# first components saying the value is a digest of a secret ("checksum/secret", "sha256_password").
_ENCODING_WORDS = frozenset({"b64", "base64", "hex", "pem", "raw", "plain", "plaintext", "encoded", "value"})
_DIGEST_WORDS = frozenset({"checksum", "hash", "sha", "sha1", "sha256", "md5", "digest"})
# Compounds whose last component alone would read as metadata ("SecretID" is Consul's token).
_SECRET_COMPOUNDS = frozenset({"secretid", "secret_id", "clientsecret"})


@functools.lru_cache(maxsize=4096)
def is_secret_name(name: str) -> bool:
    """True when a key or variable named ``name`` holds a secret (``DB_PASSWORD``, ``apiKey``,
    ``ENCRYPTION_KEY``, ``requirepass``, ``Unseal Key 1``), false for metadata about secrets
    (``TOKEN_TTL``, ``password_file``, ``checksum/secret``)."""
    parts = [p.lower() for p in WORD_SPLIT.split(name.strip("\"'-")) if p]
    while len(parts) > 1 and (parts[-1].isdigit() or parts[-1] in _ENCODING_WORDS):
        parts.pop()  # "Unseal Key 1", "unseal_keys_b64"
    if not parts or parts[0] in _DIGEST_WORDS:
        return False
    if "".join(parts[-2:]) in _SECRET_COMPOUNDS:
        return True
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
    if last in {"key", "keys"} and len(parts) >= 2 and parts[-2] not in NOT_SECRET_KEYS:
        return True
    if last in {"pw", "pwd"}:  # "db_pw", "rootPW", "adminPwd"
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


SECRET_HINTS: tuple[str, ...] = (
    "pass", "pwd", "pw", "sec", "secret", "token", "key", "cred", "auth", "sas", "cookie", "session",
    "dsn", "psk", "encrypt", "senha", "clave", "wachtwoord", "kennwort", "mdp", "parola", "heslo",
    "haslo", "sifre", "salasana", "jelszo", "geheim", "identified", "community", "cert", "crt",
    "pem", "p12", "pfx", "sandi",
)  # fmt: skip
"""Lowercase ASCII strings one of which every secret name (:func:`is_secret_name`) and every prose
keyword (:data:`PROSE_WORDS`) written in ASCII holds: an ASCII text holding none of them has no
value that a name or a sentence marks as secret (tests/reliability/test_secrets_corpus.py checks)."""

PROSE_WORDS: tuple[str, ...] = (
    # English
    "password", "passwd", "passphrase", "passcode", "pw", "pwd", "pass", "secret", "token",
    "api key", "apikey", "access key", "secret key", "private key", "root token", "unseal key",
    "recovery key", "auth token", "creds", "credentials",
    # German, French, Spanish, Portuguese, Italian, Dutch, Polish, Czech, Turkish, Swedish,
    # Finnish, Hungarian
    "passwort", "kennwort", "mot de passe", "mdp", "contraseña", "clave de acceso", "clave",
    "senha", "parola d'ordine", "wachtwoord", "hasło", "haslo", "heslo", "şifre", "sifre",
    "lösenord", "salasana", "jelszó",
    # Russian, Ukrainian, Chinese, Japanese, Korean, Arabic, Hindi, Vietnamese, Indonesian
    "пароль", "密码", "口令", "密碼", "パスワード", "暗証番号", "비밀번호", "암호", "كلمة المرور",
    "पासवर्ड", "mật khẩu", "kata sandi",
)  # fmt: skip
"""Words that, followed by "is" / ":" / "=" (in any of these languages) and a value, say the value
is a secret ("the new prod db password is ...", "das Passwort lautet ...", "密码：...")."""

PROSE_LINKS: tuple[str, ...] = (
    ":", "：", "=", "=>", "->", "→", "is", "is now", "are", "was", "was set to", "set to", "now",
    "lautet", "ist", "est", "es", "é", "è", "is:", "zijn", "jest", "je", "är", "は",
    "是", "为", "為", "는", "은", "это", "—", "–", "to", "from",
)  # fmt: skip
"""What stands between a prose keyword and its value."""

_PLACEHOLDER = re.compile(
    r"""(?ix)
    # references to a secret kept elsewhere: the start says so
    ^(?:
        \$(?:\{|\(|[A-Za-z_][A-Za-z0-9_]*(?:$|[^$A-Za-z0-9_])|$)  # $VAR, ${VAR}, $(cmd); not $6$salt$hash
      | \{\{|\{\.|\{[A-Za-z_][\w.]*\}|<|%env|![A-Za-z_]+(?:\s|$)|%\(|%\{|@microsoft\.keyvault|ref\+|op://|vault:|!vault|enc(?:\[|$)|sops:
      | arn:aws:secretsmanager:|arn:aws:ssm:|projects/[^/\s]+/secrets/|secretmanager://|awssm://
      | os\.environ|os\.getenv|process\.env|system\.getenv|env\(|getenv\(
    )
    # masks and stand-ins: the whole value
    | ^(?:
        \*{3,}|x{4,}|\.{3}|…|\[?redacted\]?|\[?hidden\]?|\[?masked\]?|\(sensitive\)
      | (?:your|my)[-_ ]?[a-z]*[-_ ]?(?:key|token|secret|password|pass|here)(?:[-_ ]?here)?
      | placeholder|example|dummy|none|null|nil|undefined|n/a
    )$""",
)
_CASED_PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*_(?:HERE|PLACEHOLDER)$|^YOUR_[A-Z0-9_]+$")


def is_placeholder(value: str) -> bool:
    """True when ``value`` (quotes allowed) is a reference to a secret kept elsewhere or a mask,
    not the secret: ``${VAR}``, ``{{ .Values.x }}``, ``${{ secrets.X }}``, ``****``,
    ``ref+vault://...``, ``op://...``, ``arn:aws:secretsmanager:...``, ``<your-token>``."""
    bare = value.strip().strip("\"'`")
    if not bare:
        return True
    return bool(_PLACEHOLDER.match(bare) or _CASED_PLACEHOLDER.match(bare))


_EMAIL = re.compile(r"[\w.+\-]+@[\w\-]+(?:\.[\w\-]+)+")
_WORDLIKE = re.compile(r"[^\W\d_]+(?:[-'][^\W\d_]+)*")
# A relative path or a file name ("prod/db", "tests/auth.test.ts", "password.txt"): lowercase
# segments, or a name with a file extension.
_PATHLIKE = re.compile(
    r"[a-z][a-z0-9_.\-]*(?:/[a-z0-9_.\-]+)+/?|[\w\-]+\.(?:txt|json|ya?ml|pem|key|crt|conf|env|ini|cfg|log|sh|py|ts|js)"
)


def plausible_secret(value: str) -> bool:
    """True when an unquoted ``value`` found in prose or after a bare keyword reads like a password
    or key rather than a word: at least 6 characters, not a placeholder, path or URL, and holding a
    digit, a symbol, or a capital after its first letter ("Harbor2024!" yes; "rotated", "required",
    "Harbor" no)."""
    # brackets, Markdown and sentence punctuation around a word are prose, not symbols of a password
    value = value.strip("([{`*_").rstrip(")]}`*_.,;:!?")
    if len(value) < 6 or is_placeholder(value) or value.startswith(("/", "./", "~/", "http://", "https://")):
        return False
    if looks_like_path(value) or _EMAIL.fullmatch(value):
        return False
    if _WORDLIKE.fullmatch(value):
        return any(ch.isupper() for ch in value[1:]) and not value.isupper()
    if value.isalnum() and value.islower() and len(value) < 8:  # "base64", "sha256", "burst64"
        return False
    return any(not ch.isalpha() for ch in value) and not value.replace(".", "").replace(",", "").isdigit()


def looks_like_path(value: str) -> bool:
    """True for a relative path or a file name ("prod/db", "tests/auth.test.ts", "password.txt")."""
    return bool(_PATHLIKE.fullmatch(value))
