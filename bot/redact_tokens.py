"""Vendor token formats, as one table of data, and the one pass that finds them in text.

A row says what a vendor publishes about its tokens: the literal prefix, the alphabet and length of
what follows, and the checksum where the vendor has one (GitHub's and npm's CRC32). Formats without
a literal prefix (Telegram bot tokens, Discord bot tokens, kubeadm bootstrap tokens, ...) are rows
of :data:`SHAPES`: a regular expression and a literal every match holds.

Finding them costs one regular-expression scan for *runs* of token characters (a 2 KB log section
has a few dozen) and a dictionary lookup of each run's first two characters; only a run that starts
with a known prefix is matched against its rows. Adding a row adds no pass over the text.

Reference: gitleaks' rule table (config/gitleaks.toml) and the vendors' own documentation of their
token formats; rows whose prefix is an ordinary word (``key-``, ``s.``, ``EAAA``) are ``weak``: the
rest must look random (digits and letters, high entropy), or carry a valid checksum.
"""

from __future__ import annotations

import math
import re
import zlib
from collections import Counter
from dataclasses import dataclass

_ALPHABETS = {
    "alnum": "A-Za-z0-9",
    "alnum_": "A-Za-z0-9_",
    "alpha": "A-Za-z",
    "hex": "0-9a-f",
    "hexi": "0-9a-fA-F",
    "hex-": "0-9a-f\\-",
    "upnum": "A-Z0-9",
    "upnum.": "A-Z0-9.",
    "lownum": "a-z0-9",
    "b64url": "A-Za-z0-9_\\-",
    "token": "A-Za-z0-9_\\-.",
    "b64": "A-Za-z0-9+/",
    "b64any": "A-Za-z0-9+/_\\-",
    "b64any=": "A-Za-z0-9+/_\\-=",
    "base32": "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L",
}
"""Alphabets by name (regular-expression class bodies). ``b64`` and ``b64any`` may end in ``=``."""


@dataclass(frozen=True, slots=True)
class Token:
    """One vendor token format: ``prefix`` then ``min_len``..``max_len`` characters of ``alphabet``."""

    kind: str
    prefix: str
    alphabet: str
    min_len: int
    max_len: int
    checksum: str | None = None
    weak: bool = False


T = Token
TOKENS: tuple[Token, ...] = (
    # kind, prefix, alphabet, min, max length after the prefix, checksum, weak prefix
    *(T("aws_access_key", p, "upnum", 16, 16) for p in ("AKIA", "ASIA", "AGPA", "AIDA", "AROA", "ANPA")),
    *(T("aws_access_key", p, "upnum", 16, 16) for p in ("ANVA", "AIPA", "ABIA", "ACCA", "A3T")),
    T("aws_session_token", "FwoGZXIvYXdzE", "b64", 80, 2000),
    T("aws_session_token", "FQoGZXIvYXdzE", "b64", 80, 2000),
    T("aws_session_token", "IQoJb3JpZ2luX2Vj", "b64", 80, 2000),
    T("aws_bedrock_key", "ABSK", "b64", 100, 300, weak=True),
    T("gcp_api_key", "AIza", "b64url", 35, 35),
    T("gcp_oauth_token", "ya29.", "b64url", 20, 2000),
    T("google_oauth_secret", "GOCSPX-", "b64url", 24, 40),
    *(
        T("github_token", p, "alnum", 30, 255, "crc32-base62")
        for p in ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")
    ),
    T("github_token", "github_pat_", "alnum_", 22, 255),
    *(
        T("gitlab_token", p, "token", 20, 300)
        for p in ("glpat-", "glrt-", "gldt-", "glft-", "glsoat-", "glffct-", "glimt-", "glagent-", "glcbt-")
    ),
    T("gitlab_token", "gloas-", "b64url", 64, 64),
    T("gitlab_token", "glptt-", "hex", 40, 40),
    T("gitlab_token", "GR1348941", "b64url", 20, 40),
    *(T("slack_token", f"xox{c}-", "token", 10, 400) for c in "abposre"),
    T("slack_token", "xoxe.xox", "token", 10, 400),
    T("slack_token", "xapp-", "b64url", 10, 400),
    *(T("stripe_key", f"{a}_{b}_", "alnum", 16, 255) for a in ("sk", "rk", "pk") for b in ("live", "test")),
    T("stripe_webhook_secret", "whsec_", "b64any", 24, 100),
    T("openai_key", "sk-", "b64url", 20, 400),
    T("sendgrid_key", "SG.", "token", 33, 100),
    T("npm_token", "npm_", "alnum", 36, 36, "crc32-base62"),
    T("huggingface_token", "hf_", "alnum", 30, 255),
    T("huggingface_token", "api_org_", "alpha", 34, 34),
    T("pypi_token", "pypi-AgEIcHlwaS5vcmc", "b64url", 50, 1000),
    T("pypi_token", "pypi-AgENdGVzdC5weXBpLm9yZw", "b64url", 50, 1000),
    *(T("digitalocean_token", p, "hex", 64, 64) for p in ("dop_v1_", "doo_v1_", "dor_v1_")),
    T("grafana_token", "glsa_", "alnum_", 32, 60),
    T("grafana_token", "glc_", "b64", 32, 400),
    T("grafana_token", "eyJrIjoi", "b64", 40, 400),
    T("databricks_token", "dapi", "hex-", 32, 34, weak=True),
    T("sentry_token", "sntrys_", "b64any", 60, 400),
    T("sentry_token", "sntryu_", "hex", 64, 64),
    *(T("shopify_token", p, "hexi", 32, 32) for p in ("shpat_", "shpca_", "shppa_", "shpss_")),
    T("newrelic_key", "NRAK-", "upnum", 27, 27),
    T("newrelic_key", "NRII-", "b64url", 32, 32),
    T("newrelic_key", "NRJS-", "hex", 19, 19),
    T("postman_key", "PMAK-", "hex-", 59, 59),
    T("atlassian_token", "ATATT3", "b64any=", 100, 300),
    T("atlassian_token", "ATCTT3", "b64any=", 100, 300),
    T("atlassian_token", "ATBB", "alnum", 28, 40, weak=True),
    T("vault_token", "hvs.", "b64url", 24, 300),
    T("vault_token", "hvb.", "b64url", 100, 400),
    T("vault_token", "hvr.", "b64url", 20, 300),
    T("vault_token", "s.", "alnum", 24, 24, weak=True),
    T("vault_token", "b.", "alnum", 24, 24, weak=True),
    T("twilio_key", "SK", "hexi", 32, 32, weak=True),
    T("sendinblue_key", "xkeysib-", "token", 70, 90),
    T("linear_key", "lin_api_", "alnum", 40, 40),
    T("linear_key", "lin_oauth_", "alnum", 40, 64),
    *(T("doppler_token", f"dp.{p}.", "alnum", 40, 44) for p in ("pt", "st", "ct", "sa", "scim", "audit")),
    T("dynatrace_token", "dt0c01.", "upnum.", 80, 100),
    *(T("planetscale_token", p, "token", 32, 64) for p in ("pscale_tkn_", "pscale_pw_", "pscale_oauth_")),
    T("pulumi_token", "pul-", "hex", 40, 40),
    T("rubygems_token", "rubygems_", "hex", 48, 48),
    T("prefect_token", "pnu_", "alnum", 36, 36),
    T("tailscale_key", "tskey-", "b64url", 20, 120),
    T("dockerhub_token", "dckr_pat_", "b64url", 20, 40),
    T("dockerhub_token", "dckr_oat_", "b64url", 20, 40),
    T("heroku_key", "HRKU-", "b64url", 20, 80),
    T("square_token", "EAAA", "b64url", 56, 100, weak=True),
    T("square_token", "sq0atp-", "b64url", 22, 60),
    T("square_token", "sq0csp-", "b64url", 40, 60),
    T("age_key", "AGE-SECRET-KEY-1", "base32", 58, 58),
    T("openshift_token", "sha256~", "b64url", 43, 43),
    T("mailgun_key", "key-", "hex", 32, 32, weak=True),
    T("sonar_token", "squ_", "hex", 40, 40),
    T("sonar_token", "sqp_", "hex", 40, 40),
    T("sonar_token", "sqa_", "hex", 40, 40),
    T("buildkite_token", "bkua_", "hex", 40, 40),
    T("figma_token", "figd_", "b64url", 40, 48),
    T("netlify_token", "nfp_", "alnum", 36, 40),
    T("supabase_token", "sbp_", "hex", 40, 40),
    T("notion_token", "ntn_", "alnum", 40, 50),
    T("notion_token", "secret_", "alnum", 43, 43, weak=True),
    T("onepassword_token", "ops_eyJ", "b64", 100, 2000),
    T("alibaba_key", "LTAI", "alnum", 20, 20, weak=True),
    T("artifactory_key", "AKCp", "alnum", 69, 69),
    T("artifactory_key", "cmVmd", "alnum", 59, 59, weak=True),
    T("clojars_token", "CLOJARS_", "alnum", 60, 60),
    T("cloudflare_key", "v1.0-", "hex-", 170, 171),
    T("duffel_token", "duffel_test_", "b64any", 43, 43),
    T("duffel_token", "duffel_live_", "b64any", 43, 43),
    T("easypost_key", "EZAK", "alnum", 54, 54),
    T("easypost_key", "EZTK", "alnum", 54, 54),
    T("flutterwave_key", "FLWSECK", "token", 12, 50),
    T("flyio_token", "fo1_", "b64url", 43, 43),
    T("flyio_token", "fm1r_", "b64any", 100, 2000),
    T("flyio_token", "fm1a_", "b64any", 100, 2000),
    T("flyio_token", "fm2_", "b64any", 100, 2000),
    T("frameio_token", "fio-u-", "b64any", 64, 64),
    T("infracost_token", "ico-", "alnum", 32, 32),
    T("intra42_secret", "s-s4t2", "hex-", 67, 70),
    T("perplexity_key", "pplx-", "alnum", 48, 48),
    T("readme_token", "rdme_", "lownum", 70, 70),
    T("scalingo_token", "tk-us-", "b64url", 48, 48),
    *(T("settlemint_token", p, "alnum", 16, 16) for p in ("sm_aat_", "sm_pat_", "sm_sat_")),
    T("shippo_token", "shippo_live_", "hexi", 40, 40),
    T("shippo_token", "shippo_test_", "hexi", 40, 40),
    T("typeform_token", "tfp_", "token", 59, 59),
    T("sourcegraph_token", "sgp_", "alnum_", 40, 70),
    T("xai_key", "xai-", "alnum", 60, 90),
    T("groq_key", "gsk_", "alnum", 48, 56),
    T("replicate_token", "r8_", "alnum", 37, 40),
    T("langsmith_key", "lsv2_pt_", "alnum_", 40, 60),
    T("langsmith_key", "lsv2_sk_", "alnum_", 40, 60),
    T("pinecone_key", "pcsk_", "alnum_", 60, 90),
    T("posthog_key", "phx_", "alnum", 40, 50),
    T("razorpay_key", "rzp_live_", "alnum", 14, 14),
    T("circleci_token", "CCIPAT_", "alnum_", 40, 60),
    T("render_key", "rnd_", "alnum", 28, 40),
    T("mapbox_token", "sk.eyJ", "token", 60, 200),
    T("harness_token", "pat.", "token", 60, 80, weak=True),
    T("harness_token", "sat.", "token", 60, 80, weak=True),
    T("adobe_secret", "p8e-", "alnum", 32, 32),
)
"""Every prefixed vendor token format (see :class:`Token`)."""

SHAPES: tuple[tuple[str, str, str], ...] = (
    # kind, a literal every match holds, the whole token's pattern (tried where a run of token
    # characters holding the literal starts; a literal holding "/" or ":", which end such a run, is
    # looked for in the whole text)
    ("jwt", "eyJ", r"eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*"),
    ("telegram_bot_token", ":AA", r"(?<![\w:])\d{8,10}:AA[A-Za-z0-9_\-]{33}(?![\w\-])"),
    ("google_refresh_token", "1//0", r"(?<![\w/])1//0[A-Za-z0-9_\-]{40,512}(?![\w\-])"),
    (
        "discord_bot_token",
        ".",
        r"[MNO][A-Za-z0-9_\-]{23,27}\.[A-Za-z0-9_\-]{6}\.[A-Za-z0-9_\-]{27,40}(?![\w\-.])",
    ),
    ("kubeadm_token", ".", r"[a-z0-9]{6}\.(?=[a-z]*[0-9])[a-z0-9]{16}(?![\w\-.])"),
    ("azure_client_secret", "Q~", r"[A-Za-z0-9_~.]{3}\dQ~[A-Za-z0-9_~.\-]{31,34}(?![\w~.\-])"),
    ("terraform_token", ".atlasv1.", r"[a-z0-9]{14}\.atlasv1\.[A-Za-z0-9_=\-]{60,70}(?![\w\-=])"),
    ("newrelic_key", "NRAL", r"[0-9a-f]{36}NRAL(?![\w\-])"),
    ("maxmind_key", "_mmk", r"[A-Za-z0-9]{6}_[A-Za-z0-9]{29}_mmk(?![\w\-])"),
    ("airtable_token", "pat", r"pat[A-Za-z0-9]{14}\.[a-f0-9]{64}(?![\w\-])"),
)
"""Vendor formats without a literal prefix: (kind, literal every match holds, pattern)."""

_RUN = re.compile(r"(?<![A-Za-z0-9_\-.~])[A-Za-z0-9](?=[A-Za-z0-9_\-.~+/=]{15})[A-Za-z0-9_\-.~+]*")
"""A run of token characters, 16 or more counting ``/`` and ``=`` (base64 keys hold them), ending
before ``/`` or ``=`` (so a token after ``=`` or in a URL path starts a run of its own)."""


def _compile(token: Token) -> re.Pattern[str]:
    body = _ALPHABETS[token.alphabet]
    padding = "={0,2}" if token.alphabet in ("b64", "b64any") else ""
    # The body ends where its alphabet does: a longer run is another thing, not a cut-off token.
    return re.compile(
        re.escape(token.prefix) + f"[{body}]{{{token.min_len},{token.max_len}}}{padding}(?![{body}=])"
    )


_BY_START: dict[str, list[tuple[Token, re.Pattern[str]]]] = {}
for _token in sorted(TOKENS, key=lambda t: len(t.prefix), reverse=True):  # longest prefix first
    _BY_START.setdefault(_token.prefix[:2], []).append((_token, _compile(_token)))
_IN_TEXT = [
    (kind, needle, re.compile(pattern)) for kind, needle, pattern in SHAPES if set(needle) & set("/:")
]
_IN_RUNS = [
    (kind, needle, re.compile(pattern)) for kind, needle, pattern in SHAPES if not set(needle) & set("/:")
]

_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def crc32_base62(token: str) -> bool:
    """GitHub's and npm's checksum: the last 6 characters are the CRC32 of the 30 before them, in
    base 62 (so a token is told from random text without asking GitHub)."""
    body, check = token[-36:-6], token[-6:]
    if len(body) != 30:
        return False
    number, out = zlib.crc32(body.encode()), ""
    while number:
        number, digit = divmod(number, 62)
        out = _BASE62[digit] + out
    return out.rjust(6, "0") == check


CHECKSUMS = {"crc32-base62": crc32_base62}
"""Checksum verifiers by the name a :class:`Token` row gives."""


def entropy(text: str) -> float:
    """Shannon entropy of ``text`` in bits per character."""
    size = len(text)
    return -sum(n / size * math.log2(n / size) for n in Counter(text).values())


def looks_random(text: str) -> bool:
    """True when ``text`` reads like generated key material, not a word or an identifier: letters
    and digits both, and an entropy a random string of its alphabet and length would have."""
    if len(text) < 12 or not any(c.isdigit() for c in text) or not any(c.isalpha() for c in text):
        return False
    if all(c in "0123456789abcdefABCDEF-" for c in text):
        return entropy(text) >= 3.0
    if any(c.isupper() for c in text) and any(c.islower() for c in text):
        return entropy(text) >= min(3.6, math.log2(len(text)) - 0.7)
    # one case only (lowercase base36 keys): longer, and as varied as random text of that alphabet
    return len(text) >= 20 and entropy(text) >= min(3.7, math.log2(len(text)) - 0.8)


def _accepts(token: Token, value: str) -> bool:
    if token.checksum is not None and CHECKSUMS[token.checksum](value):
        return True
    return not token.weak or looks_random(value[len(token.prefix) :])


def find_tokens(text: str) -> list[tuple[int, int, str]]:
    """(start, end, kind) of every vendor token in ``text``, in order, never overlapping."""
    spans: list[tuple[int, int, str]] = []
    for run in _RUN.finditer(text):
        start, found = run.start(), False
        for token, pattern in _BY_START.get(text[start : start + 2], ()):
            if text.startswith(token.prefix, start):
                match = pattern.match(text, start)
                if match is not None and _accepts(token, match.group(0)):
                    spans.append((start, match.end(), token.kind))
                    found = True
                    break
        if not found:
            word = run.group(0)
            for kind, needle, pattern in _IN_RUNS:
                if needle in word and (match := pattern.match(text, start)) is not None:
                    spans.append((start, match.end(), kind))
                    break
    for kind, needle, pattern in _IN_TEXT:
        if needle in text:
            spans.extend((m.start(), m.end(), kind) for m in pattern.finditer(text))
    if len(spans) > 1:
        spans.sort()
        kept = [spans[0]]
        for span in spans[1:]:
            if span[0] >= kept[-1][1]:
                kept.append(span)
            elif span[1] - span[0] > kept[-1][1] - kept[-1][0]:  # the longer of two overlapping
                kept[-1] = span
        spans = kept
    return spans


WEBHOOKS: tuple[tuple[str, str, str], ...] = (
    # kind, a literal every match holds (lowercase), the URL's pattern with its secret as "secret"
    (
        "slack_webhook",
        "hooks.slack.com",
        r"https://hooks\.slack\.com/(?:services|workflows|triggers)/(?P<secret>[A-Za-z0-9/_-]+)",
    ),
    (
        "discord_webhook",
        "/api/webhooks/",
        r"https?://(?:[\w-]+\.)?discord(?:app)?\.com/api/webhooks/\d+/(?P<secret>[A-Za-z0-9_\-]+)",
    ),
    (
        "teams_webhook",
        ".office.com/webhook",
        r"https://[\w.-]+\.office\.com/webhook(?:b2)?/[^\s\"'<>]*?/IncomingWebhook/(?P<secret>[A-Za-z0-9]+/[A-Za-z0-9\-]+)",
    ),
    (
        "telegram_bot_token",
        "api.telegram.org/",
        r"api\.telegram\.org/(?:file/)?bot(?P<secret>\d+:[A-Za-z0-9_\-]+)",
    ),
    ("zapier_webhook", "hooks.zapier.com", r"hooks\.zapier\.com/hooks/catch/\d+/(?P<secret>[A-Za-z0-9]+)"),
    (
        "pagerduty_key",
        "pagerduty.com/integration/",
        r"pagerduty\.com/integration/(?P<secret>[A-Za-z0-9]{20,})",
    ),
    ("ifttt_key", "ifttt.com/trigger/", r"ifttt\.com/trigger/[^/\s]+/with/key/(?P<secret>[A-Za-z0-9_\-]+)"),
    (
        "azure_function_key",
        "azurewebsites",
        r"(?i)\.azurewebsites\.net/[^\s\"'<>?]*\?(?:[^\s\"'<>#]*&)?code=(?P<secret>[^&\s\"'<>#]+)",
    ),
    (
        "google_chat_webhook",
        "chat.googleapis.com",
        r"chat\.googleapis\.com/v1/spaces/[^\s\"'<>]*?(?:key|token)=(?P<secret>[^&\s\"'<>]+)",
    ),
)
"""Incoming-webhook and bot URLs whose path or query carries their secret: (kind, literal, pattern)."""
