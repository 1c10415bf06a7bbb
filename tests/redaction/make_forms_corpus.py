# ruff: noqa: E501  (corpus lines are realistic ops text, kept whole on one line each)
"""Write the *forms* corpus: secrets in forms the first corpus (``make_corpus.py``) does not have,
and benign look-alikes, each split into a half to tune on and a half only to test on.

    PYTHONPATH=$PWD python tests/redaction/make_forms_corpus.py

Deterministic (fixed seed); ``tests/redaction/test_forms_corpus.py`` checks the committed files are
what this script writes. Every secret is synthetic, made in its vendor's published shape (prefix,
alphabet, length, and the checksum where the vendor has one); none is a real credential.

The split is by *form*, not by row: each kind lists several text forms, and alternate forms go to
``forms-tune-*.jsonl`` and ``forms-test-*.jsonl``, so the test half holds forms the rules were not
tuned on (a row-wise split would put the same template in both halves).

Rows: ``{"kind", "form", "text", "secrets"}`` (secrets) and ``{"kind", "form", "text"}`` (benign:
must come out of redaction unchanged).
"""

from __future__ import annotations

import base64
import json
import random
import string
import urllib.parse
import uuid
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent / "corpus"
SEED = 20261205

_rng = random.Random(SEED)
ALNUM = string.ascii_letters + string.digits
LOWER_NUM = string.ascii_lowercase + string.digits
UPPER_NUM = string.ascii_uppercase + string.digits
HEX = "0123456789abcdef"
B64 = ALNUM + "+/"
B64URL = ALNUM + "-_"
BASE62 = string.digits + string.ascii_uppercase + string.ascii_lowercase


def r(n: int, alphabet: str = ALNUM) -> str:
    return "".join(_rng.choice(alphabet) for _ in range(n))


def pick(options: Sequence[str]) -> str:
    return _rng.choice(list(options))


def b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


# -- passwords people really type ------------------------------------------------------------------
_WORDS = ["falcon", "Harbor", "quartz", "Maple", "nimbus", "Cobalt", "tundra", "Violet", "ember", "Raven"]


def pw(symbols: str = "!#%^*_+~.=@-") -> str:
    """A password with letters, digits and a symbol from ``symbols`` (never a plain word)."""
    style = _rng.randrange(3)
    if style == 0:
        return pick(_WORDS) + str(_rng.randint(10, 9999)) + pick(symbols) + r(3)
    if style == 1:
        return (
            r(4, string.ascii_uppercase)
            + r(4, string.ascii_lowercase)
            + r(3, string.digits)
            + pick(symbols)
            + r(4)
        )
    return r(6) + pick(symbols) + r(6) + pick(symbols) + r(2, string.digits)


def encoded(value: str) -> str:
    """``value`` URL-encoded (what a form body or a query string carries)."""
    return urllib.parse.quote(value, safe="")


def phrase() -> str:
    """A password with spaces and delimiters inside (the whole value must go, not its first word)."""
    return f"{pick(_WORDS)} {r(4)}, {pick(_WORDS).lower()};{r(3, string.digits)} {pick('!#%^*')}{r(3)}"


def host() -> str:
    return pick(
        ["db-0.db", "pg-primary.payments.svc", "10.20.3.14", "mysql.shop.svc.cluster.local", "redis-master"]
    )


def user() -> str:
    return pick(["root", "admin", "app", "svc_backup", "deploy", "ci", "grafana", "replicator"])


# -- vendor tokens in their published shapes -------------------------------------------------------
def _base62(number: int, width: int) -> str:
    out = ""
    while number:
        number, digit = divmod(number, 62)
        out = BASE62[digit] + out
    return out.rjust(width, "0")


def github_style(prefix: str) -> str:
    """GitHub's (and npm's) format: 30 random base62 characters and a CRC32 of them in 6 base62."""
    body = r(30)
    return prefix + body + _base62(zlib.crc32(body.encode()), 6)


def aws_session_token() -> str:
    return pick(["FwoGZXIvYXdzE", "IQoJb3JpZ2luX2Vj"]) + r(_rng.randint(300, 420), B64).rstrip("+/") + "="


def atlassian() -> str:
    return "ATATT3xFfGF0" + r(170, B64URL) + "=" + r(8, HEX.upper())


def vault_token() -> str:
    return "hvs." + r(_rng.choice([24, 91]), B64URL)


def pypi() -> str:
    return "pypi-AgEIcHlwaS5vcmc" + r(_rng.randint(120, 160), B64URL)


def azure_storage_key() -> str:
    return b64(bytes(_rng.randrange(256) for _ in range(64)))


def unseal_key() -> str:
    return b64(bytes(_rng.randrange(256) for _ in range(32)))


def discord_bot() -> str:
    return pick("MN") + r(25, B64URL) + "." + r(6, B64URL) + "." + r(38, B64URL)


def sentry_dsn() -> tuple[str, str]:
    key = r(32, HEX)
    return (
        f"https://{key}@o{_rng.randint(100000, 999999)}.ingest.sentry.io/{_rng.randint(1000000, 9999999)}",
        key,
    )


def telegram() -> str:
    return f"{_rng.randint(100000000, 9999999999)}:AA{r(33, B64URL)}"


VENDOR: dict[str, Callable[[], str]] = {
    "gitlab_runner": lambda: "glrt-" + r(20, B64URL),
    "gitlab_runner_reg": lambda: "GR1348941" + r(20, B64URL),
    "gitlab_deploy": lambda: "gldt-" + r(20, B64URL),
    "gitlab_trigger": lambda: "glptt-" + r(40, HEX),
    "gitlab_job": lambda: "glcbt-" + r(2, HEX) + "_" + r(20, B64URL),
    "gitlab_feed": lambda: "glft-" + r(20, B64URL),
    "gitlab_agent": lambda: "glagent-" + r(50, B64URL),
    "stripe_webhook": lambda: "whsec_" + r(32),
    "google_oauth_secret": lambda: "GOCSPX-" + r(28, B64URL),
    "google_refresh": lambda: "1//0" + r(2, ALNUM) + r(96, B64URL),
    "pypi": pypi,
    "digitalocean": lambda: pick(["dop_v1_", "doo_v1_", "dor_v1_"]) + r(64, HEX),
    "grafana_sa": lambda: "glsa_" + r(32) + "_" + r(8, HEX),
    "grafana_cloud": lambda: "glc_" + r(100, B64).rstrip("+/") + "==",
    "databricks": lambda: "dapi" + r(32, HEX) + pick(["", "-2", "-3"]),
    "sentry_user": lambda: "sntryu_" + r(64, HEX),
    "shopify": lambda: pick(["shpat_", "shpca_", "shppa_", "shpss_"]) + r(32, HEX),
    "newrelic": lambda: pick(["NRAK-" + r(27, UPPER_NUM), "NRII-" + r(32, B64URL), "NRJS-" + r(19, HEX)]),
    "postman": lambda: "PMAK-" + r(24, HEX) + "-" + r(34, HEX),
    "atlassian": atlassian,
    "vault_token": vault_token,
    "vault_batch": lambda: "hvb." + r(150, B64URL),
    "aws_session": aws_session_token,
    "twilio_key": lambda: "SK" + r(32, HEX),
    "sendinblue": lambda: "xkeysib-" + r(64, HEX) + "-" + r(16),
    "linear": lambda: "lin_api_" + r(40),
    "doppler": lambda: "dp.pt." + r(43),
    "dynatrace": lambda: "dt0c01." + r(24, UPPER_NUM) + "." + r(64, UPPER_NUM),
    "planetscale": lambda: "pscale_tkn_" + r(43, B64URL),
    "pulumi": lambda: "pul-" + r(40, HEX),
    "rubygems": lambda: "rubygems_" + r(48, HEX),
    "prefect": lambda: "pnu_" + r(36),
    "tailscale": lambda: "tskey-auth-" + r(12) + "CNTRL-" + r(33),
    "dockerhub": lambda: "dckr_pat_" + r(27, B64URL),
    "heroku": lambda: "HRKU-AA" + r(58, B64URL),
    "square": lambda: "EAAA" + r(60, B64URL),
    "age": lambda: "AGE-SECRET-KEY-1" + r(58, "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L"),
    "github_app": lambda: github_style(pick(["ghs_", "ghu_", "ghr_"])),
    "npm": lambda: github_style("npm_"),
    "openshift": lambda: "sha256~" + r(43, B64URL),
    "huggingface_org": lambda: "api_org_" + r(34, string.ascii_letters),
    "anthropic": lambda: "sk-ant-api03-" + r(93, B64URL) + "AA",
    "mailgun": lambda: "key-" + r(32, HEX),
    "terraform_cloud": lambda: r(14, LOWER_NUM) + ".atlasv1." + r(67, B64URL),
    "sonar": lambda: pick(["squ_", "sqp_", "sqa_"]) + r(40, HEX),
    "buildkite": lambda: "bkua_" + r(40, HEX),
    "figma": lambda: "figd_" + r(40, B64URL),
    "netlify": lambda: "nfp_" + r(36),
    "supabase": lambda: "sbp_" + r(40, HEX),
    "notion": lambda: "ntn_" + r(11, string.digits) + r(35),
    "onepassword": lambda: "ops_eyJ" + r(260, B64),
    "kubeadm": lambda: r(6, string.ascii_lowercase + "0123") + "." + r(6, LOWER_NUM) + "7" + r(9, LOWER_NUM),
    "telegram": telegram,
    "discord_bot": discord_bot,
}


def vendor(kind: str) -> str:
    return VENDOR[kind]()


# -- rows ------------------------------------------------------------------------------------------
Row = dict[str, object]
_rows: dict[str, list[Row]] = {"tune-secrets": [], "test-secrets": [], "tune-benign": [], "test-benign": []}

Form = Callable[[], tuple[str, list[str]]]


def kind(name: str, count: int, forms: Sequence[Form], start: int = 0) -> None:
    """``count`` rows of ``name``, form after form from ``start``; even forms go to tune, odd forms
    to test."""
    for i in range(count):
        index = (i + start) % len(forms)
        text, secrets = forms[index]()
        assert secrets and all(s in text for s in secrets), (name, text, secrets)
        half = "tune" if index % 2 == 0 else "test"
        _rows[f"{half}-secrets"].append({"kind": name, "form": index, "text": text, "secrets": secrets})


def benign(name: str, count: int, forms: Sequence[Callable[[], str]]) -> None:
    """``count`` benign rows of ``name``, split by form like :func:`kind`."""
    for i in range(count):
        index = i % len(forms)
        half = "tune" if index % 2 == 0 else "test"
        _rows[f"{half}-benign"].append({"kind": name, "form": index, "text": forms[index]()})


def one(text_of: Callable[[str], str], make: Callable[[], str] = pw) -> Form:
    """A form holding one secret: ``text_of(secret)``."""

    def form() -> tuple[str, list[str]]:
        secret = make()
        return text_of(secret), [secret]

    return form


# -- 1. vendor tokens in running text --------------------------------------------------------------
_VENDOR_FORMS: list[Callable[[str, str], str]] = [
    lambda k, t: f"here is the {k.replace('_', ' ')} token you asked for: {t} (expires in 30 days)",
    lambda k, t: (
        f'{{"ts":"2026-12-04T10:11:02Z","level":"debug","msg":"calling upstream with {t}","svc":"deployer"}}'
    ),
    lambda k, t: f"      - {t}",
    lambda k, t: f"2026-12-04 10:11:02 INFO  provisioning finished, credential={t!r} scope=ci",
    lambda k, t: f"run `curl -s https://api.internal/v1/check?t={t}` and tell me what you get",
    lambda k, t: f"<td>{t}</td>",
    lambda k, t: f"Using {t} for the release pipeline",
    lambda k, t: f"ci-runner | export TOKEN_VALUE='{t}'",
]


def _vendor_form(index: int, name: str) -> Form:
    def form() -> tuple[str, list[str]]:
        token = vendor(name)
        return _VENDOR_FORMS[index](name, token), [token]

    return form


for _n, _name in enumerate(VENDOR):
    kind(f"vendor_{_name}", 6, [_vendor_form(i, _name) for i in range(len(_VENDOR_FORMS))], start=_n)


# -- 2. webhook and DSN URLs carrying their secret -------------------------------------------------
def _discord_webhook() -> tuple[str, list[str]]:
    token = r(68, B64URL)
    url = f"https://discord.com/api/webhooks/{_rng.randint(10**17, 10**18)}/{token}"
    return pick([f"alerts go to {url}", f'webhook_url: "{url}"', f"curl -X POST -d @msg.json {url}"]), [token]


def _teams_webhook() -> tuple[str, list[str]]:
    secret = r(32, HEX)
    url = (
        f"https://contoso.webhook.office.com/webhookb2/{uuid.UUID(int=_rng.getrandbits(128))}@{uuid.UUID(int=_rng.getrandbits(128))}"
        f"/IncomingWebhook/{secret}/{uuid.UUID(int=_rng.getrandbits(128))}"
    )
    return pick([f"Teams connector: {url}", f"  teams_webhook = {url}"]), [secret]


def _telegram_url() -> tuple[str, list[str]]:
    token = telegram()
    return pick(
        [
            f"POST https://api.telegram.org/bot{token}/sendMessage 200 OK",
            f"notify: https://api.telegram.org/bot{token}/sendMessage?chat_id=-100123",
        ]
    ), [token]


def _sentry() -> tuple[str, list[str]]:
    dsn, key = sentry_dsn()
    return pick([f"SENTRY_DSN={dsn}", f"sentry_sdk.init(dsn='{dsn}')", f"error reporting to {dsn}"]), [key]


def _function_key() -> tuple[str, list[str]]:
    key = r(54, B64URL) + "=="
    return pick(
        [
            f"GET https://fn-orders.azurewebsites.net/api/reprocess?code={key} 401",
            f"curl -H 'x-functions-key: {key}' https://fn-orders.azurewebsites.net/api/ping",
        ]
    ), [key]


def _slack_like() -> tuple[str, list[str]]:
    secret = r(24)
    url = f"https://hooks.zapier.com/hooks/catch/{_rng.randint(100000, 999999)}/{secret}/"
    return f"zap trigger: {url}", [secret]


kind("webhook_discord", 6, [_discord_webhook, _discord_webhook])
kind("webhook_teams", 4, [_teams_webhook, _teams_webhook])
kind("telegram_bot_url", 4, [_telegram_url, _telegram_url])
kind("sentry_dsn", 6, [_sentry, _sentry])
kind("azure_function_key", 4, [_function_key, _function_key])


# -- 3. secrets recognisable by their surroundings --------------------------------------------------
kind(
    "chat_prose",
    16,
    [
        one(lambda p: f"fyi the new prod db password is {p} — rotate it after the incident"),
        one(lambda p: f"pw for staging redis: {p}"),
        one(lambda p: f"ok I reset it, new password: `{p}`"),
        one(lambda p: f"login admin pass {p} on the grafana box"),
        one(lambda p: f"use {p} as the password for the break-glass account"),
        one(lambda p: f"DB creds are app / {p} until Monday"),
        one(lambda p: f"password → {p}"),
        one(lambda p: f'the root password was set to "{p}" during bootstrap'),
    ],
)
kind(
    "prose_other_languages",
    24,
    [
        one(lambda p: f"Das neue Passwort lautet {p}"),
        one(lambda p: f"le mot de passe est {p}"),
        one(lambda p: f"la contraseña es {p}"),
        one(lambda p: f"a senha é {p}"),
        one(lambda p: f"пароль: {p}"),
        one(lambda p: f"密码：{p}"),
        one(lambda p: f"パスワードは {p} です"),
        one(lambda p: f"wachtwoord: {p}"),
        one(lambda p: f"hasło do bazy: {p}"),
        one(lambda p: f"비밀번호: {p}"),
        one(lambda p: f"Kennwort für den Admin: {p}"),
        one(lambda p: f"la password è {p}"),
        one(lambda p: f"şifre: {p}"),
        one(lambda p: f"lösenord: {p}"),
        one(lambda p: f"mdp de la base : {p}"),
        one(lambda p: f"clave de acceso: {p}"),
    ],
)
kind(
    "odd_key_names",
    24,
    [
        one(lambda p: f"db_pw={p}"),
        one(lambda p: f"rootPW: {p}"),
        one(lambda p: f'"adminPwd": "{p}",'),
        one(lambda p: f"MYSQL_ROOT_PASS={p}"),
        one(lambda p: f"pass_phrase = {p}"),
        one(lambda p: f"bindpw {p}"),
        one(lambda p: f"requirepass {p}"),
        one(lambda p: f"masterauth {p}"),
        one(lambda p: f"    auth_pass {p}"),
        one(lambda p: f"jwtSecret: {p}"),
        one(lambda p: f'hmac_key = "{p}"'),
        one(lambda p: f"signingKey: {p}"),
        one(lambda p: f"ENC_KEY={p}"),
        one(lambda p: f"smtp_auth_password: {p}"),
        one(lambda p: f"client_sec={p}"),
        one(lambda p: f"  stats auth admin:{p}"),
        one(lambda p: f"rootpw {p}"),
        one(lambda p: f"user admin insecure-password {p}"),
    ],
)
kind(
    "xml",
    16,
    [
        one(lambda p: f"<server><id>nexus</id><username>deploy</username><password>{p}</password></server>"),
        one(lambda p: f'<add key="ApiKey" value="{p}" />'),
        one(lambda p: f'<property name="hibernate.connection.password" value="{p}"/>'),
        one(lambda p: f'<user username="admin" password="{p}" roles="manager-gui"/>'),
        one(lambda p: f"<Password>{p}</Password>"),
        one(lambda p: f'<entry key="db.password">{p}</entry>'),
        one(
            lambda p: (
                f'<add name="Main" connectionString="Server=sql01;Database=app;User Id=app;Password={p};" />'
            )
        ),
        one(lambda p: f"<secret>\n  {p}\n</secret>"),
    ],
)
kind(
    "sql",
    16,
    [
        one(lambda p: f"CREATE USER app IDENTIFIED BY '{p}';"),
        one(lambda p: f"ALTER ROLE reporting WITH LOGIN PASSWORD '{p}';"),
        one(lambda p: f"CREATE LOGIN etl WITH PASSWORD = '{p}', CHECK_POLICY = OFF;"),
        one(lambda p: f"SET PASSWORD FOR 'app'@'%' = '{p}';"),
        one(lambda p: f"GRANT ALL PRIVILEGES ON *.* TO 'admin'@'%' IDENTIFIED BY '{p}' WITH GRANT OPTION;"),
        one(lambda p: f"alter user system identified by {p} account unlock;", lambda: pw("_#$")),
        one(lambda p: f"CREATE USER 'svc'@'10.%' IDENTIFIED WITH mysql_native_password BY '{p}';"),
        one(lambda p: f"mysql> ALTER USER 'root'@'localhost' IDENTIFIED BY \"{p}\";"),
    ],
)
kind(
    "struct_dumps",
    16,
    [
        one(
            lambda p: f"config: {{Host:db-0 Port:5432 User:app Password:{p} SSLMode:disable}}",
            lambda: pw("!#%^*_+~.="),
        ),
        one(lambda p: f'loaded &config.Auth{{Username:"admin", Password:"{p}", Timeout:30}}'),
        one(
            lambda p: (
                f"DataSourceConfig{{url='jdbc:postgresql://db:5432/app', username='app', password='{p}'}}"
            )
        ),
        one(lambda p: f"Credentials(user=app, password={p}, region=eu-west-1)", lambda: pw("!#%^*_+~.")),
        one(lambda p: f"Settings(debug=False, db_password='{p}', workers=4)"),
        one(lambda p: f"&{{APIKey:{p} Endpoint:https://api.internal}}", lambda: pw("!#%^*_+~.")),
        one(lambda p: f"SmtpConfig[host=mail.internal, port=587, password={p}]", lambda: pw("!#%^*_+~.")),
        one(lambda p: f'ClientOptions {{ token: "{p}", retries: 3 }}'),
    ],
)
kind(
    "cli_argument_lists",
    16,
    [
        one(lambda p: f'command: ["/app/server", "--db-password", "{p}", "--port", "8080"]'),
        one(lambda p: f"        args:\n          - --api-key\n          - {p}\n          - --verbose"),
        one(lambda p: f'"Args": ["--requirepass", "{p}", "--appendonly", "yes"],'),
        one(lambda p: f"subprocess.run(['pg_dump', '--dbname', 'app', '--password', '{p}'])"),
        one(lambda p: f"Cmd: [vault-agent -token {p} -config /etc/agent.hcl]", lambda: vendor("vault_token")),
        one(lambda p: f"  exec /usr/local/bin/consul agent -join 10.0.0.5 -encrypt {p}", unseal_key),
        one(lambda p: f"argv=['/usr/bin/app', '--client-secret', '{p}']"),
        one(
            lambda p: f"ps -ef | grep app\napp  1234  1  0 10:00 ?  00:00:01 /usr/bin/app --secret\n    {p}",
            lambda: r(32),
        ),
    ],
)
kind(
    "http_headers",
    16,
    [
        one(lambda t: f"X-Vault-Token: {t}", vault_token),
        one(lambda t: f"< Set-Authorization: Token {t}", lambda: r(40, HEX)),
        one(lambda t: f"Authorization: SSWS {t}", lambda: "00" + r(40, B64URL)),
        one(lambda t: f"Ocp-Apim-Subscription-Key: {t}", lambda: r(32, HEX)),
        one(lambda t: f"-H 'Authorization: GenieKey {t}'", lambda: str(uuid.UUID(int=_rng.getrandbits(128)))),
        one(lambda t: f"X-Consul-Token: {t}", lambda: str(uuid.UUID(int=_rng.getrandbits(128)))),
        one(
            lambda t: f"headers = {{'DD-API-KEY': '{t}', 'Content-Type': 'application/json'}}",
            lambda: r(32, HEX),
        ),
        one(lambda t: f"Authorization: Splunk {t}", lambda: str(uuid.UUID(int=_rng.getrandbits(128)))),
    ],
)
kind(
    "quoted_escaped_encoded",
    16,
    [
        one(lambda p: f"password={p}&grant_type=password&username=app", lambda: encoded(pw("!@#$%&"))),
        one(
            lambda p: '{"db": {"password": "' + p + '"}}',
            lambda: json.dumps(r(6) + '"' + r(4) + "\\" + r(4))[1:-1],
        ),
        one(lambda p: f'password: "{p}"', phrase),
        one(lambda p: f"export DB_PASSWORD='{p}'", phrase),
        one(lambda p: 'curl -d \'{\\"token\\": \\"' + p + "\\\"}' https://api"),
        one(lambda p: f'PASSWORD="{p}"', phrase),
        one(lambda p: f"?api_key={p}&format=json", lambda: r(32, HEX)),
        one(lambda p: f"secret%3D{p}%26user%3Dapp", lambda: encoded(pw("!@#$%&"))),
    ],
)
kind(
    "values_with_delimiters",
    16,
    [
        one(lambda p: f"password=abc{p},def", lambda: pw("!#%^*_+~.=")),
        one(lambda p: f"  password: {p}", phrase),
        one(lambda p: f"DB_PASSWORD={p}", lambda: r(5) + " " + r(6) + "," + r(4)),
        one(lambda p: f"secret = {p}", lambda: r(6) + ";" + r(6) + " " + r(3)),
        one(lambda p: f"ENV DB_PASSWORD {p}", lambda: pw()),
        one(lambda p: f'$env:API_TOKEN = "{p}"', phrase),
        one(lambda p: f"setenv DB_PASSWD {p}", lambda: pw()),
        one(lambda p: f"set PGPASSWORD={p}", lambda: r(6) + "&" + r(6)),
    ],
)
kind(
    "ini_toml_env",
    16,
    [
        one(lambda p: f"[client]\nuser = backup\npassword = {p}\nhost = {host()}"),
        one(
            lambda p: f"[default]\naws_access_key_id = AKIA{r(16, UPPER_NUM)}\naws_secret_access_key = {p}",
            lambda: r(40, B64),
        ),
        one(lambda p: f"[database]\nurl = \"postgres://{host()}/app\"\npassword = '{p}'"),
        one(lambda p: f'Environment="API_TOKEN={p}"'),
        one(lambda p: f'declare -x SMTP_PASSWORD="{p}"'),
        one(lambda p: f"[auth]\nsecret_key: {p}"),
        one(lambda p: f"spring.datasource.password={p}"),
        one(lambda p: f"DATABASE_URL=mysql://app:{p}@db:3306/shop", lambda: pw("!#%^*_+~.=-")),
    ],
)


# -- 4. secret managers' and cluster tools' outputs ------------------------------------------------
def _vault_init() -> tuple[str, list[str]]:
    keys = [unseal_key() for _ in range(3)]
    root = vault_token()
    text = "\n".join(f"Unseal Key {i + 1}: {k}" for i, k in enumerate(keys))
    text += f"\n\nInitial Root Token: {root}\n\nVault initialized with 5 key shares and a key threshold of 3."
    return text, [*keys, root]


def _vault_init_json() -> tuple[str, list[str]]:
    keys = [r(64, HEX) for _ in range(2)]
    b64keys = [unseal_key() for _ in range(2)]
    root = vault_token()
    body = {
        "unseal_keys_b64": b64keys,
        "unseal_keys_hex": keys,
        "unseal_shares": 2,
        "unseal_threshold": 2,
        "root_token": root,
    }
    return json.dumps(body, indent=2), [*keys, *b64keys, root]


def _vault_read() -> tuple[str, list[str]]:
    p = r(20, B64URL)
    text = (
        "Key                Value\n---                -----\n"
        f"lease_id           database/creds/readonly/{r(24)}\nlease_duration     1h\nlease_renewable    true\n"
        f"password           {p}\nusername           v-token-readonly-{r(20, LOWER_NUM)}-{_rng.randint(1700000000, 1800000000)}"
    )
    return text, [p]


def _vault_kv() -> tuple[str, list[str]]:
    a, b = pw(), r(32)
    text = (
        "======= Secret Path =======\nsecret/data/payments\n\n======= Metadata =======\nKey              Value\n"
        "---              -----\ncreated_time     2026-12-01T09:12:44.1Z\nversion          4\n\n"
        f"====== Data ======\nKey         Value\n---         -----\napi         {b}\ndb_pass     {a}"
    )
    return text, [a, b]


def _ssm() -> tuple[str, list[str]]:
    v = pw()
    body = {
        "Parameter": {
            "Name": "/prod/payments/db",
            "Type": "SecureString",
            "Value": v,
            "Version": 3,
            "ARN": "arn:aws:ssm:eu-west-1:123456789012:parameter/prod/payments/db",
        }
    }
    return json.dumps(body, indent=4), [v]


def _ssm_text() -> tuple[str, list[str]]:
    v = r(24, B64URL)
    return (
        f"$ aws ssm get-parameter --name /prod/api/key --with-decryption --query Parameter.Value --output text\n{v}\n$ ",
        [v],
    )


def _secretsmanager() -> tuple[str, list[str]]:
    p = pw()
    inner = json.dumps({"username": "admin", "password": p, "host": "db", "port": 5432})
    body = {
        "ARN": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:prod/db-Ab12Cd",
        "Name": "prod/db",
        "VersionId": str(uuid.UUID(int=_rng.getrandbits(128))),
        "SecretString": inner,
        "CreatedDate": "2026-11-30T10:00:00+00:00",
    }
    return json.dumps(body, indent=4), [p]


def _secretsmanager_text() -> tuple[str, list[str]]:
    v = r(40, B64URL)
    return (
        f"aws secretsmanager get-secret-value --secret-id prod/stripe --query SecretString --output text\n{v}",
        [v],
    )


def _az() -> tuple[str, list[str]]:
    v = r(34, ALNUM + "~._-")
    body = {
        "attributes": {"enabled": True, "created": "2026-11-02T08:00:00+00:00"},
        "contentType": None,
        "id": f"https://kv-prod.vault.azure.net/secrets/sql-admin/{r(32, HEX)}",
        "name": "sql-admin",
        "tags": {},
        "value": v,
    }
    return json.dumps(body, indent=2), [v]


def _az_tsv() -> tuple[str, list[str]]:
    v = pw()
    return f"PS> az keyvault secret show --vault-name kv-prod -n sql-admin --query value -o tsv\n{v}", [v]


def _gcloud() -> tuple[str, list[str]]:
    v = r(32, B64URL)
    return f"$ gcloud secrets versions access latest --secret=stripe-key --project=shop-prod\n{v}", [v]


def _gcloud_json() -> tuple[str, list[str]]:
    v = pw()
    data = b64(v)
    body = {
        "name": "projects/123/secrets/db/versions/4",
        "payload": {"data": data, "dataCrc32c": str(_rng.randint(10**9, 4 * 10**9))},
    }
    return json.dumps(body, indent=2), [data]


def _terraform() -> tuple[str, list[str]]:
    p, k = pw(), r(40, B64)
    body = {
        "db_endpoint": {"sensitive": False, "type": "string", "value": "db.internal:5432"},
        "db_admin": {"sensitive": True, "type": "string", "value": p},
        "storage_access": {"sensitive": True, "type": "string", "value": k},
    }
    return json.dumps(body, indent=2), [p, k]


def _terraform_raw() -> tuple[str, list[str]]:
    v = r(32)
    return f"$ terraform output -raw admin_password\n{v}", [v]


def _kubeadm_list() -> tuple[str, list[str]]:
    t1, t2 = vendor("kubeadm"), vendor("kubeadm")
    text = (
        "TOKEN                     TTL         EXPIRES                USAGES                   DESCRIPTION   EXTRA GROUPS\n"
        f"{t1}   23h         2026-12-05T10:00:00Z   authentication,signing   <none>        system:bootstrappers:kubeadm:default-node-token\n"
        f"{t2}   1h          2026-12-04T11:00:00Z   authentication,signing   <none>        system:bootstrappers:kubeadm:default-node-token"
    )
    return text, [t1, t2]


def _kubeadm_join() -> tuple[str, list[str]]:
    t = vendor("kubeadm")
    text = (
        f"kubeadm join 10.0.0.10:6443 --token {t} \\\n    --discovery-token-ca-cert-hash sha256:{r(64, HEX)}"
    )
    return text, [t]


def _kubectl_secret_yaml() -> tuple[str, list[str]]:
    a, b = b64(pw()), b64(r(40))
    text = (
        f"apiVersion: v1\ndata:\n  api-token: {b}\n  password: {a}\nkind: Secret\nmetadata:\n"
        "  name: payments-db\n  namespace: payments\ntype: Opaque"
    )
    return text, [a, b]


def _kubectl_jsonpath() -> tuple[str, list[str]]:
    v = pw()
    return f"$ kubectl get secret payments-db -o jsonpath='{{.data.password}}' | base64 -d\n{v}", [v]


def _consul_token() -> tuple[str, list[str]]:
    secret = str(uuid.UUID(int=_rng.getrandbits(128)))
    text = (
        f"AccessorID:       {uuid.UUID(int=_rng.getrandbits(128))}\nSecretID:         {secret}\n"
        "Description:      ci token\nLocal:            false\nCreate Time:      2026-12-01 10:00:00"
    )
    return text, [secret]


def _sts() -> tuple[str, list[str]]:
    secret, session = r(40, B64), aws_session_token()
    body = {
        "Credentials": {
            "AccessKeyId": "ASIA" + r(16, UPPER_NUM),
            "SecretAccessKey": secret,
            "SessionToken": session,
            "Expiration": "2026-12-04T12:00:00Z",
        }
    }
    return json.dumps(body, indent=4), [secret, session]


kind("vault_operator_init", 6, [_vault_init, _vault_init_json])
kind("vault_read", 6, [_vault_read, _vault_kv])
kind("aws_ssm", 6, [_ssm, _ssm_text])
kind("aws_secretsmanager", 6, [_secretsmanager, _secretsmanager_text])
kind("az_keyvault", 6, [_az, _az_tsv])
kind("gcloud_secrets", 6, [_gcloud, _gcloud_json])
kind("terraform_output", 6, [_terraform, _terraform_raw])
kind("kubeadm_tokens", 6, [_kubeadm_list, _kubeadm_join])
kind("kubectl_secret", 6, [_kubectl_secret_yaml, _kubectl_jsonpath])
kind("cloud_credentials_json", 6, [_consul_token, _sts])


# -- 5. entropy near secret-like words (no vendor shape, no key syntax) ----------------------------
kind(
    "entropy_near_words",
    16,
    [
        one(lambda t: f"datadog api key for the new org is {t}", lambda: r(32, HEX)),
        one(
            lambda t: f"pagerduty routing key {t} goes into the alertmanager receiver",
            lambda: r(32, LOWER_NUM),
        ),
        one(lambda t: f"twilio auth token rotated, new one {t}", lambda: r(32, HEX)),
        one(lambda t: f'{{"routing_key": "{t}", "event_action": "trigger"}}', lambda: r(32, LOWER_NUM)),
        one(lambda t: f"storage account key (primary): {t}", azure_storage_key),
        one(lambda t: f"the unseal key we need is {t}", unseal_key),
        one(lambda t: f"secret for the webhook -> {t}", lambda: r(40, B64URL)),
        one(lambda t: f"nomad token {t}", lambda: str(uuid.UUID(int=_rng.getrandbits(128)))),
    ],
)


# -- benign look-alikes ------------------------------------------------------------------------------
def sha(n: int = 40) -> str:
    return r(n, HEX)


def a_uuid() -> str:
    return str(uuid.UUID(int=_rng.getrandbits(128)))


def pod_hash() -> str:
    return r(_rng.choice([9, 10]), "bcdfghjklmnpqrstvwxz2456789")


benign(
    "placeholders",
    44,
    [
        lambda: f"password: ${{DB_PASSWORD_{r(3, string.ascii_uppercase)}}}",
        lambda: "  password: {{ .Values.postgresql.auth.password | quote }}",
        lambda: f"  token: ${{{{ secrets.DEPLOY_TOKEN_{r(2, string.ascii_uppercase)} }}}}",
        lambda: "password: ****",
        lambda: f"DB_PASSWORD: ref+vault://secret/data/{pick(['payments', 'shop', 'ledger'])}/db#password",
        lambda: (
            "        - name: DB_PASSWORD\n          valueFrom:\n            secretKeyRef:\n              name: payments-db\n              key: password"
        ),
        lambda: f"    checksum/secret: {sha(64)}",
        lambda: (
            f"kubeadm join 10.0.0.10:6443 --token $JOIN_TOKEN --discovery-token-ca-cert-hash sha256:{sha(64)}"
        ),
        lambda: "api_key: <your-api-key-here>",
        lambda: "PASSWORD=$(cat /run/secrets/db_password)",
        lambda: "password: !vault |\n  $ANSIBLE_VAULT;1.1;AES256",
        lambda: "DB_PASSWORD=@Microsoft.KeyVault(SecretUri=https://kv-prod.vault.azure.net/secrets/db/)",
        lambda: f"secret_ref: arn:aws:secretsmanager:eu-west-1:123456789012:secret:prod/db-{r(6)}",
        lambda: "token: op://ops/grafana/credential",
        lambda: "password: ${file:/run/secrets/db}",
        lambda: "client_secret: '%env(OAUTH_CLIENT_SECRET)%'",
        lambda: "password = os.environ['DB_PASSWORD']",
        lambda: "export VAULT_TOKEN=$(vault print token)",
        lambda: "token: '********'",
        lambda: "db_password: REDACTED",
    ],
)
benign(
    "hashes_near_secret_words",
    44,
    [
        lambda: f"the token refresh fix landed in {sha()}",
        lambda: f"secret rotation job {a_uuid()} finished",
        lambda: f"auth-proxy image registry.internal/auth-proxy@sha256:{sha(64)}",
        lambda: (
            f"password reset service pod auth-{pod_hash()}-{r(5, 'bcdfghjklmnpqrstvwxz2456789')} restarted"
        ),
        lambda: f"token validation slow: trace_id={sha(32)} span_id={sha(16)}",
        lambda: f"sha256sum of the key file: {sha(64)}  tls.key",
        lambda: f"--discovery-token-ca-cert-hash sha256:{sha(64)}",
        lambda: f"secret db-creds resourceVersion {_rng.randint(10**6, 10**8)} uid {a_uuid()}",
        lambda: f"md5 of credentials.json is {sha(32)}",
        lambda: f"X-Request-Id: {a_uuid()} (auth failed)",
        lambda: f"commit {sha(7)}: rotate api key handling",
        lambda: f'etag "{sha(32)}" for secret-store config',
    ],
)
benign(
    "secret_word_prose",
    44,
    [
        lambda: "the password is rotated every 30 days by the operator",
        lambda: "token expired at 10:02, the client refreshed it",
        lambda: 'FATAL:  password authentication failed for user "app"',
        lambda: 'Error from server (NotFound): secrets "db-creds" not found',
        lambda: "rotate the API key before Friday, then update the secret in vault",
        lambda: "Das Passwort wurde gestern geändert",
        lambda: "le mot de passe est expiré",
        lambda: "ALTER USER app PASSWORD EXPIRE;",
        lambda: "kubectl get secret db-creds -n payments -o yaml",
        lambda: "vault read database/creds/readonly",
        lambda: "aws ssm get-parameter --name /prod/db/password --with-decryption",
        lambda: "the secret is mounted at /var/run/secrets/db",
        lambda: "la contraseña es incorrecta",
        lambda: "password is required",
        lambda: "invalid token: signature has expired",
        lambda: "密码错误，请重试",
    ],
)
benign(
    "config_not_secret",
    44,
    [
        lambda: "password_encryption = scram-sha-256",
        lambda: "PasswordAuthentication no",
        lambda: "token_type: Bearer",
        lambda: "max_tokens: 512",
        lambda: "password_min_length: 12",
        lambda: "docker login -u ci --password-stdin registry.internal",
        lambda: "auth_type: password",
        lambda: "token_endpoint: https://login.internal/oauth2/token",
        lambda: "  password:  16 bytes",
        lambda: "Unseal Progress    0/3\nUnseal Nonce       n/a",
        lambda: json.dumps(
            {"Parameter": {"Name": "/prod/db/host", "Type": "String", "Value": "db.internal", "Version": 2}}
        ),
        lambda: json.dumps(
            {"db_endpoint": {"sensitive": False, "type": "string", "value": "db.internal:5432"}}
        ),
        lambda: "NAME          TYPE     DATA   AGE\npayments-db   Opaque   2      3d",
        lambda: 'requirepass ""',
        lambda: "secret_name: payments-db",
        lambda: "tokenizer: SmolLM2-135M",
        lambda: "grant_type=client_credentials&scope=read",
        lambda: "--token-ttl 24h0m0s",
        lambda: (
            "Key                Value\n---                -----\nlease_duration     1h\nlease_renewable    true"
        ),
        lambda: "secretKeyRef:\n  name: api-keys\n  key: stripe",
    ],
)
benign(
    "ops_ids",
    40,
    [
        lambda: f"pod/payments-api-{pod_hash()}-{r(5, 'bcdfghjklmnpqrstvwxz2456789')} OOMKilled",
        lambda: f"commit {sha()} by jdoe",
        lambda: f"image: registry.internal/api@sha256:{sha(64)}",
        lambda: f"uid: {a_uuid()}",
        lambda: f"traceparent: 00-{sha(32)}-{sha(16)}-01",
        lambda: f"AccessorID:       {a_uuid()}",
        lambda: f"arn:aws:iam::{_rng.randint(10**11, 10**12)}:role/payments-api",
        lambda: f"i-{sha(17)} in eu-west-1a stopped",
        lambda: f"etcd revision {_rng.randint(10**5, 10**7)}, cluster id {sha(16)}",
        lambda: f"Successfully built {sha(12)}",
    ],
)


def write() -> dict[str, int]:
    """Write the four files; the number of rows (benign) or secrets (secrets) in each."""
    HERE.mkdir(parents=True, exist_ok=True)
    sizes: dict[str, int] = {}
    for name, rows in _rows.items():
        with open(HERE / f"forms-{name}.jsonl", "w", encoding="utf-8") as out:
            for row in rows:
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
        sizes[name] = sum(len(row["secrets"]) for row in rows) if name.endswith("secrets") else len(rows)  # type: ignore[arg-type]
    return sizes


if __name__ == "__main__":
    print(write())
