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


# -- forms added after the first look at the test half (ad-hoc probes of other forms): all tune --
def _uid() -> str:
    return str(uuid.UUID(int=_rng.getrandbits(128)))


def _probe_secrets() -> list[tuple[str, str]]:
    u = _uid
    return [
        # (text, secret)
        (f"Consul ACL token: {(u := u())}", u),
        (f"export CONSUL_HTTP_TOKEN={u}", u),
        (f"NOMAD_TOKEN={u} nomad job status", u),
        (
            f"consul acl bootstrap\nAccessorID:       {r(8, HEX)}-{r(4, HEX)}-{r(4, HEX)}-{r(4, HEX)}-{r(12, HEX)}\nSecretID:         {(u2 := f'{r(8, HEX)}-{r(4, HEX)}-{r(4, HEX)}-{r(4, HEX)}-{r(12, HEX)}')}",
            u2,
        ),
        (
            f"Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey={(k := r(43, ALNUM + '+/') + '=')}",
            k,
        ),
        (
            f"DefaultEndpointsProtocol=https;AccountName=stprod;AccountKey={(k2 := base64.b64encode(bytes(_rng.randrange(256) for _ in range(64))).decode())};EndpointSuffix=core.windows.net",
            k2,
        ),
        (
            f"https://stprod.blob.core.windows.net/backups?sv=2022-11-02&ss=b&srt=co&sp=rl&se=2026-12-31&sig={(s := r(43, ALNUM + '%') + '%3D')}",
            s,
        ),
        (
            f"az storage account keys list output: key1 {(k3 := base64.b64encode(bytes(_rng.randrange(256) for _ in range(64))).decode())}",
            k3,
        ),
        (f"twilio: account AC{r(32, HEX)} auth token {(t := r(32, HEX))}", t),
        (f"TWILIO_AUTH_TOKEN={(t2 := r(32, HEX))}", t2),
        (f"client = Client('AC{r(32, HEX)}', '{(t3 := r(32, HEX))}')", t3),
        (
            f"curl -X POST https://api.twilio.com/2010-04-01/Accounts/AC{r(32, HEX)}/Messages.json -u SK{r(32, HEX)}:{(t4 := r(32, ALNUM))}",
            t4,
        ),
        (
            f"bot url https://api.telegram.org/bot{(tg := str(_rng.randint(10**8, 10**9)) + ':AA' + r(33, ALNUM + '_-'))}/getMe",
            tg,
        ),
        (f"TELEGRAM_BOT_TOKEN={tg}", tg),
        (f"DD_API_KEY={(dd := r(32, HEX))}", dd),
        (f"datadog:\n  apiKey: {dd}\n  appKey: {(da := r(40, HEX))}", da),
        (
            f"curl -HEX 'DD-APPLICATION-KEY: {(da2 := r(40, HEX))}' https://api.datadoghq.com/api/v1/monitor",
            da2,
        ),
        (f"the datadog app key is {(da3 := r(40, HEX))}", da3),
        (f"dd agent: api_key={(da4 := r(32, HEX))} site=datadoghq.eu", da4),
        (f"helm install datadog --set datadog.apiKey={(da5 := r(32, HEX))} datadog/datadog", da5),
        (f"--set auth.rootPassword={(hp := 'Tr0ub4dor&3x')} ", hp),
        (
            f"helm upgrade --install pg bitnami/postgresql --set global.postgresql.auth.postgresPassword={(hp2 := 'Xk9#mPq2!vL')}",
            hp2,
        ),
        (
            f"vault write auth/approle/login role_id=abc secret_id={(sid := f'{r(8, HEX)}-{r(4, HEX)}-{r(4, HEX)}-{r(4, HEX)}-{r(12, HEX)}')}",
            sid,
        ),
        (
            f"Key                  Value\n---                  -----\ntoken                {(vt := 'hvs.' + r(24))}\ntoken_accessor       {r(24)}\ntoken_duration       768h",
            vt,
        ),
        (
            f"Unseal Key (will be hidden): {(uk := base64.b64encode(bytes(_rng.randrange(256) for _ in range(32))).decode())}",
            uk,
        ),
        (
            f"Recovery Key 1: {(rk := base64.b64encode(bytes(_rng.randrange(256) for _ in range(32))).decode())}",
            rk,
        ),
        (
            f'{{"keys": ["{(kk := r(64, HEX))}"], "keys_base64": ["{(base64.b64encode(bytes(_rng.randrange(256) for _ in range(32))).decode())}"], "root_token": "{("hvs." + r(24))}"}}',
            kk,
        ),
        (f"gcloud auth print-access-token\nya29.{(ya := r(150, ALNUM + '_-'))}", ya),
        (
            f'aws sts get-session-token\n{{\n "Credentials": {{\n  "AccessKeyId": "ASIA{r(16, string.ascii_uppercase + string.digits)}",\n  "SecretAccessKey": "{(sak := r(40, ALNUM + "+/"))}"\n }}\n}}',
            sak,
        ),
        (f"AWS_SESSION_TOKEN=IQoJb3JpZ2luX2VjE{(st := r(300, ALNUM + '+/'))}", st),
        (f"aws_session_token = FwoGZXIvYXdzE{(st2 := r(250, ALNUM + '+/'))}", st2),
        (f'terraform output db_password\n"{(tp := "Qw3rty!Zx9")}"', tp),
        (
            f'$ terraform output -json db_creds\n{{"password":"{(tp2 := "Lp0#nb7GhQ")}","username":"admin"}}',
            tp2,
        ),
        (
            f'kubectl get secret db -o json\n{{\n  "apiVersion": "v1",\n  "data": {{\n    "password": "{(kp := base64.b64encode(b"S3cr3t!pass").decode())}"\n  }},\n  "kind": "Secret"\n}}',
            kp,
        ),
        (
            f'kubectl get secret regcred -o jsonpath=\'{{.data.\\.dockerconfigjson}}\' | base64 --decode\n{{"auths":{{"ghcr.io":{{"username":"bot","password":"{(dp := "ghp_" + r(36))}"}}}}}}',
            dp,
        ),
        (f"echo {(be := base64.b64encode(b'admin:Sup3rS3cret!').decode())} | base64 -d", be),
        (
            f'<connectionStrings><add name="Db" connectionString="Data Source=sql;Initial Catalog=app;User ID=sa;Password={(cs := "P@ssw0rd2024!")}" /></connectionStrings>',
            cs,
        ),
        (f"jdbc:postgresql://db:5432/app?user=app&password={(jp := 'pg_Secr3t-77')}", jp),
        (f"mongodb+srv://admin:{(mp := 'm0ng0Pa55word')}@cluster0.abcde.mongodb.net/test", mp),
        (f"amqp://guest:{(ap := 'rabb1tPa55')}@rabbitmq:5672/", ap),
        (f"redis://:{(rp := 'r3disPa55w0rd')}@redis:6379/0", rp),
        (
            f"Server=tcp:sql.database.windows.net,1433;Database=app;User ID=admin;Password={(sp := 'Az#ure2024Sql')};Encrypt=true;",
            sp,
        ),
        (f"ldap bind: cn=admin,dc=corp bindDN password {(lp := 'LdapB1nd!pw')}", lp),
        (f"mot de passe : {(fr := 'Paris2024!')}", fr),
        (f"Passwort: {(de := 'Berlin#2024')}", de),
        (f'contraseña = "{(es := "Madrid 2024")}"', es),
        (f"ALNUM senha do banco é {(pt := 'Lisboa@2024')}", pt),
        (f"Пароль от базы: {(ru := 'Moskva2024!')}", ru),
        (f"数据库密码是 {(zh := 'Beijing2024!')}", zh),
        (f"DBのパスワード：{(ja := 'Tokyo2024!')}", ja),
        (f"새 비밀번호는 {(ko := 'Seoul2024!')} 입니다", ko),
        (f'<Password value="{(xp := "Xml#Pass99")}"/>', xp),
        (f'<credentials username="svc" password="{(xp2 := "Cr3d!xml")}"/>', xp2),
        (f"<apiToken>{(xt := r(32))}</apiToken>", xt),
        (f'<secret name="db">{(xs := "S3cret-In-XML")}</secret>', xs),
        (f"INSERT INTO users (name, password) VALUES ('admin', '{(sq := 'Ins3rt#Pw')}');", sq),
        (f"CREATE USER reader WITH PASSWORD '{(sq2 := 'Pg#Reader1')}';", sq2),
        (f"ALTER LOGIN sa WITH PASSWORD = N'{(sq3 := 'MsSql#2024')}';", sq3),
        (f"db.createUser({{user: 'app', pwd: '{(mg := 'M0ngo#User')}', roles: ['readWrite']}})", mg),
        (f'main.Config{{DB:main.DB{{Host:"db", Password:"{(go := "Go#Str1ct")}"}}}}', go),
        (f"User{{name='bob', passwordHash='x', apiToken='{(jv := r(24))}'}}", jv),
        (f"Config(api_key=SecretStr('**********'), token='{(py := r(30))}')", py),
        (f'["mysql", "-u", "root", "-p{(cl := "Arg#List99")}"]', cl),
        (f'exec: ["sh", "-c", "psql postgresql://app:{(cl2 := "Psql#Url77")}@db/app"]', cl2),
        (f'- name: app\n  args: ["--token", "{(cl3 := r(40))}"]', cl3),
        (f"Cookie: session={(ck := r(40))}; theme=dark", ck),
        (f"X-Api-Key: {(xk := r(40))}", xk),
        (f"x-goog-api-key: AIza{(gk := r(35, ALNUM + '_-'))}", gk),
        (f"apikey: {(kg := r(32))}", kg),
        (f"Authorization: Basic {(ba := base64.b64encode(b'user:Pa55word!').decode())}", ba),
        (f'proxy_set_header Authorization "Bearer {(ng := r(40))}";', ng),
        (f"password%3D{(ue := 'P%40ss%21w0rd')}%26", ue),
        ('{"password":"a\\"b\\\\c9X!"}', "c9X!"),
        ("PASSWORD='it'\\''s9X!'", "s9X!"),
        (f'secret: "{(ml := "line1 with space, and comma; semicolon 9X!")}"', ml),
        (f'DB_PASS="{(ml2 := "a b c 1 2 3 !")}"', ml2),
        (f"db_password = {(ini := 'semi;colon#hash 9X')}", ini),
        (f"admin password for grafana is {(gp := 'Gr@fana2024')}, please change it", gp),
        (f"new token for the CI bot: {(cit := r(40))}", cit),
        (f"I rotated the key, here it is {(rk2 := r(40, ALNUM + '+/'))}", rk2),
        (f"here are the creds: admin / {(cr := 'Cr3ds#2024')}", cr),
        (f"user: admin\npass: {(up := 'UserPass#99')}", up),
        (f"login=admin pass={(lp2 := 'LoginPass#9')}", lp2),
        (f"pwd={(pw2 := 'Pwd#Value9')}", pw2),
        (f"sshpass -p {(ssp := 'SshPass#99')} ssh root@host", ssp),
        (f"PGPASSWORD={(pgp := 'PgPass#77')} psql -h db", pgp),
        (f"The key is {(k5 := r(32, HEX))} for the datadog agent", k5),
        (f"routing_key: {(rk3 := r(32, string.ascii_lowercase + string.digits))}", rk3),
        (f"integration key {(ik := r(32, string.ascii_lowercase + string.digits))}", ik),
        (
            f"SENTRY_DSN=https://{(sd := r(32, HEX))}@o{_rng.randint(10**5, 10**6)}.ingest.us.sentry.io/{_rng.randint(10**6, 10**7)}",
            sd,
        ),
        (
            f"https://outlook.office.com/webhook/{r(8, HEX)}-{r(4, HEX)}-{r(4, HEX)}-{r(4, HEX)}-{r(12, HEX)}@{r(8, HEX)}-{r(4, HEX)}-{r(4, HEX)}-{r(4, HEX)}-{r(12, HEX)}/IncomingWebhook/{(tw := r(32, HEX))}/{r(8, HEX)}-{r(4, HEX)}-{r(4, HEX)}-{r(4, HEX)}-{r(12, HEX)}",
            tw,
        ),
        (
            f"https://discordapp.com/api/webhooks/{_rng.randint(10**17, 10**18)}/{(dw := r(68, ALNUM + '_-'))}",
            dw,
        ),
        (f"https://events.pagerduty.com/v2/enqueue routing_key={(pk := r(32, HEX))}", pk),
        (f"glrt-t1_{(gr := r(27, ALNUM + '_-'))}.01.{r(9, string.ascii_lowercase + string.digits)}", gr),
        (f"registration-token: GR1348941{(grr := r(20, ALNUM + '_-'))}", grr),
        (
            f"curl -X POST -F token={(trg := 'glptt-' + r(40, HEX))} -F ref=main https://gitlab.com/api/v4/projects/1/trigger/pipeline",
            trg,
        ),
        (f"stripe listen: Ready! Your webhook signing secret is whsec_{(wh := r(32))} (^C to quit)", wh),
        (
            f'client_secret.json: {{"installed":{{"client_id":"123-abc.apps.googleusercontent.com","client_secret":"GOCSPX-{(gc := r(28, ALNUM + "_-"))}"}}}}',
            gc,
        ),
        (
            f"[pypi]\n  username = __token__\n  password = pypi-AgEIcHlwaS5vcmc{(pp := r(150, ALNUM + '_-'))}",
            pp,
        ),
        (f"doctl auth init -t dop_v1_{(do := r(64, HEX))}", do),
        (f"GF_TOKEN=glsa_{(gs := r(32))}_{r(8, HEX)}", gs),
        (f"databricks configure --token\nToken: dapi{(db := r(32, HEX))}", db),
        (f"X-Shopify-Access-Token: shpat_{(sh2 := r(32, HEX))}", sh2),
        (f"NEW_RELIC_LICENSE_KEY={(nr := r(36, HEX) + 'NRAL')}", nr),
        (f"postman api key PMAK-{(pm := r(24, HEX) + '-' + r(34, HEX))}", pm),
        (f"jira token ATATT3xFfGF0{(at := r(180, ALNUM + '_-') + '=' + r(8, '0123456789ABCDEF'))}", at),
        (f"::add-mask::{(x := r(20))}", x),
        (f"echo '{(x2 := 'Ech0Pass!9')}' | docker login -u ci --password-stdin ghcr.io", x2),
        (f'echo "app:{(x3 := "Chp4ss#1")}" | chpasswd', x3),
        (f"define('DB_PASSWORD', '{(x4 := 'Wp#Pass2024')}');", x4),
        (f"os.environ['API_TOKEN'] = '{(x5 := r(30))}'", x5),
        (f"ENV['STRIPE_SECRET'] = \"{(x6 := r(24))}\"", x6),
        (f'ds.setPassword("{(x7 := "J4va#Setter")}");', x7),
        (f'builder.withApiKey("{(x8 := r(32))}").build()', x8),
        (f"password: |\n  {(x9 := 'Block#Scalar1')}\nuser: app", x9),
        (f"tls.key: |-\n  {(x10 := r(64, ALNUM + '+/'))}\n  {r(64, ALNUM + '+/')}", x10),
        (f'{{"user": "app", "pass": "{(x11 := "JsonPass#7")}"}}', x11),
        (f"**Password:** {(x12 := 'Md#Bold2024')}", x12),
        (f"| password | {(x13 := 'Tbl#Cell77')} |", x13),
        (f"the token is:\n```\n{(x14 := r(40))}\n```", x14),
        (f"db password - {(x15 := 'Dash#Link1')}", x15),
        (f"snmp-server community {(x16 := 'Snmp#Comm1')} RO", x16),
        (f"username admin privilege 15 password 7 {(x17 := '0822455D0A16')}", x17),
        (f"enable secret 5 {(x18 := '$1$mERr$hx5rVt7rPNoS4wqbXKX7m0')}", x18),
        (
            f"PuTTY-User-Key-File-2: ssh-rsa\nEncryption: none\nComment: rsa-key\nPublic-Lines: 2\nAAAAB3NzaC1yc2E\nAAAAB3NzaC1yc2F\nPrivate-Lines: 2\n{(x19 := r(64, ALNUM + '+/'))}\n{r(40, ALNUM + '+/')}\nPrivate-MAC: {r(40, HEX)}",
            x19,
        ),
        (
            f"-----BEGIN OpenVPN Static key V1-----\n{(x20 := r(32, HEX))}\n{r(32, HEX)}\n-----END OpenVPN Static key V1-----",
            x20,
        ),
        (
            f'{{"kty":"RSA","n":"{r(40, ALNUM)}","e":"AQAB","d":"{(x21 := r(60, ALNUM + "-_"))}","p":"{r(30, ALNUM)}"}}',
            x21,
        ),
        (
            f"ID                  Description  Token                                                                                     User Name  User ID\n0a1b2c3d4e5f6a7b    ci           {(x22 := r(86, ALNUM + '-_') + '==')}   admin      0a1b2c3d4e5f6a70",
            x22,
        ),
        (f"npm config set //registry.npmjs.org/:_authToken {(x23 := r(36))}", x23),
        (f"git config --global github.token {(x24 := r(40, HEX))}", x24),
        (
            f"WireGuard:\n[Interface]\nPrivateKey = {(x25 := base64.b64encode(bytes(_rng.randrange(256) for _ in range(32))).decode())}",
            x25,
        ),
        (f'wpa_passphrase="{(x26 := "Wifi Pass 2024")}"', x26),
        (f"ansible_become_pass: {(x27 := 'Become#2024')}", x27),
        (f"ansible-playbook site.yml -e 'ansible_password={(x28 := 'Ansible#Pw1')}'", x28),
        (f'variable "db_password" {{\n  default = "{(x29 := "Tf#Default1")}"\n}}', x29),
        (f"aws_secret_access_key={(x30 := r(40, ALNUM + '/+'))}", x30),
        (
            f"Access key ID: AKIA{r(16, string.ascii_uppercase + string.digits)}\nSecret access key: {(x31 := r(40, ALNUM + '/+'))}",
            x31,
        ),
        (f"Client secret: {(x32 := r(34, ALNUM + '~._-'))}", x32),
        (f"API Key: {(x33 := r(32, HEX))}", x33),
        (f'mongo "mongodb://root:{(x35 := "Mongo%40Pass1")}@mongo:27017/admin"', x35),
        (
            f"redis-cli -u redis://default:{('Red1s#Pass')}@redis:6379 CONFIG SET requirepass {(x37 := 'New#Redis2')}",
            x37,
        ),
        (
            f'{{"auths":{{"https://index.docker.io/v1/":{{"auth":"{(x38 := base64.b64encode(b"user:Dock3r#Pass").decode())}"}}}}}}',
            x38,
        ),
        (f"//npm.pkg.github.com/:_authToken={(x39 := 'ghp_' + r(36))}", x39),
        (f"machine api.heroku.com\n  login me@example.com\n  password {(x40 := r(36, HEX + '-'))}", x40),
        (f"Bearer token for the staging cluster: {(x41 := r(48))}", x41),
        (f"kubectl config set-credentials admin --username=admin --password={(x42 := 'Kube#Pw2024')}", x42),
        (
            f"  auth-provider:\n    config:\n      refresh-token: {(x43 := r(40))}\n      id-token: eyJ{r(20)}.eyJ{r(30)}.{r(40)}",
            x43,
        ),
        (f"GITHUB_TOKEN: {(x44 := 'ghs_' + r(36))}", x44),
        (f'client.auth("admin", "{(x45 := "Auth#Call99")}")', x45),
        (f'psql "postgresql://app:{(x46 := "Pg%23Url99")}@db:5432/app?sslmode=require"', x46),
        (f"smtp://mailer:{(x47 := 'Smtp#Pass7')}@smtp.internal:587", x47),
        (f"SPRING_DATASOURCE_PASSWORD={(x48 := 'Spring Pass 1')}", x48),
        (f'  - name: SMTP_PASSWORD\n    value: "{(x49 := "Env Val #9")}"', x49),
        (f"password:\n  {(x50 := 'NextLine#Yaml')}", x50),
    ]


def _probe_secrets_2() -> list[tuple[str, str]]:
    """Probes of a second round (client positionals, here-strings, key-value stores, prose links)."""
    uk = base64.b64encode(bytes(_rng.randrange(256) for _ in range(32))).decode()
    return [
        (f"vault operator unseal {uk}", uk),
        (f"$ vault operator unseal -migrate {uk}", uk),
        (f"gpg --batch --passphrase {(g := 'Gpg#Pass2024')} -d secrets.gpg", g),
        (f"docker run -e POSTGRES_PASSWORD={(d := 'Dock3r#Env1')} postgres:16", d),
        (f"docker secret create db_pass - <<< '{(d2 := 'Here#String1')}'", d2),
        (
            f'{{"appId": "{r(8, HEX)}-{r(4, HEX)}-{r(4, HEX)}-{r(4, HEX)}-{r(12, HEX)}", "displayName": "ci", "password": "{(sp := r(34, ALNUM + "~._-"))}", "tenant": "x"}}',
            sp,
        ),
        (
            f'{{"AccessKey": {{"UserName": "ci", "AccessKeyId": "AKIA{r(16, string.ascii_uppercase + string.digits)}", "Status": "Active", "SecretAccessKey": "{(sk := r(40, ALNUM + "+/"))}"}}}}',
            sk,
        ),
        (f"consul kv put service/db/password {(ck := 'Consul#Kv99')}", ck),
        (f"etcdctl put /config/db/password {(ek := 'Etcd#Put77')}", ek),
        (f"kubectl create secret generic api --from-literal=token={(kt := r(32))} -n prod", kt),
        (f"helm install app ./chart --set-string secrets.apiKey={(hk := r(32))}", hk),
        (f"Setting DB password to {(sd := 'Sett1ng#Pw')}", sd),
        (f"changed the admin password from {r(10)} to {(ch := 'New#Admin2024')}", ch),
        (f"db_password {(sp2 := 'Space#Sep99')}", sp2),
        (f"The API key: {(ak := r(40))}.", ak),
        (f"X-API-KEY={(xk := r(32))}", xk),
        (f"token={r(4)}…{(tk := r(30))}", tk),
        (f"password='{('Quote' + chr(39) + chr(39) + 's#1')}'", "s#1"),
        (f"mysql://root:{(mp := 'M%23ysql%40Pw')}@db/app", mp),
        (f"jdbc:sqlserver://sql:1433;databaseName=app;user=sa;password={(jp := 'Jdbc#Mssql1')};", jp),
        (f"Data Source=db;Initial Catalog=app;User Id=sa;Pwd={(pw := 'Pwd#Conn99')};", pw),
        (f"ldap://cn=admin,dc=corp:{(lp := 'Ldap#Url77')}@ldap.corp", lp),
        (f"ftp://anonymous:{(fp := 'Ftp#Pass12')}@mirror/pub", fp),
        (f"SNOWFLAKE_PASSWORD='{(sf := 'Snow#Flake9')}'", sf),
        (f"-Djavax.net.ssl.keyStorePassword={(jk := 'Keystore#9')}", jk),
        (f'JAVA_OPTS="-Dspring.datasource.password={(jo := "Java#Opts77")} -Xmx512m"', jo),
        (f'<param name="password" value="{(xp := "Xml#Param1")}"/>', xp),
        (f'[mysqld]\nuser = mysql\n\n[client]\npassword="{(my := "My#Cnf2024")}"', my),
        (f"aws_session_token = {(at := r(300, ALNUM + '+/'))}", at),
        (f"id_token: {(it := 'eyJ' + r(20) + '.eyJ' + r(40) + '.' + r(43))}", it),
    ]


def _probe_benign() -> list[str]:
    u = _uid
    return [
        "Unseal Key Shares      5\nUnseal Threshold       3\nSealed                 false",
        'token_policies    ["default"]\ntoken_ttl         768h',
        "Initial Root Token is revoked after setup",
        "consul members\nNode    Address         Status  Type    Build   Protocol  DC   Partition  Segment\nnode1   10.0.0.1:8301   alive   server  1.17.0  2         dc1  default    <all>",
        "password reset email sent to jdoe@example.com",
        "the secret sauce is caching",
        "token bucket rate limiter: 100 req/s",
        "kubectl create secret generic db --from-literal=password=$DB_PASSWORD",
        "Your password has expired. Please contact the administrator.",
        "apiKey: ${DATADOG_API_KEY}",
        'password: "{{ .Values.password }}"',
        "token: ${{ secrets.GITHUB_TOKEN }}",
        "secretName: tls-cert",
        "tls:\n  - secretName: web-tls\n    hosts:\n      - example.com",
        "key: app.kubernetes.io/name",
        "sha256:" + "a" * 64,
        'ETag: W/"5e8b4f2c"',
        "commit 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b (HEAD -> main)",
        "podTemplateHash: 7d9f8b6c5",
        "X-B3-TraceId: 80f198ee56343ba864fe8b2a57d3eff7",
        "docker pull nginx@sha256:" + "0123456789abcdef" * 4,
        "secret/db-creds created",
        "error: password must be at least 12 characters",
        "Passwort vergessen? Hier zurücksetzen",
        "keyboard layout: us",
        "max_keys: 1000",
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\ntype: Opaque",
        "The token has been revoked",
        "Authorization: Bearer ${TOKEN}",
        'curl -HEX "Authorization: Bearer $TOKEN" https://api',
        "password=********",
        "DB_PASSWORD=<set in vault>",
        "PASSWORD: '<redacted>'",
        "api_key = os.getenv('API_KEY')",
        "token = process.env.GITHUB_TOKEN",
        'Warning  FailedMount  3m  kubelet  MountVolume.SetUp failed for volume "db-creds" : secret "db-creds" not found',
        'Normal   Pulled       2m  kubelet  Successfully pulled image "ghcr.io/acme/api:1.4.2" in 1.2s',
        "ReplicaSet payments-api-7d9f8b6c5 pod-template-hash=7d9f8b6c5",
        f"  annotations:\n    checksum/config: {r(64, HEX)}\n    checksum/secret: {r(64, HEX)}",
        "      env:\n        - name: API_TOKEN\n          valueFrom:\n            secretKeyRef:\n              name: api-tokens\n              key: token",
        "  volumes:\n    - name: creds\n      secret:\n        secretName: db-creds\n        defaultMode: 0400",
        "token_auth_enabled: true",
        "password_policy: strong",
        "auth: {enabled: true, mechanism: scram-sha-256}",
        f'trace_id={r(32, HEX)} span_id={r(16, HEX)} msg="token refreshed"',
        'level=warn msg="auth failed" user=app reason="invalid password" client_ip=10.0.0.7',
        f'{{"level":"info","msg":"token issued","sub":"system:serviceaccount:ci:deployer","jti":"{u()}","exp":1764930000}}',
        "kubeadm token create --print-join-command --ttl 2h",
        f"kubeadm join 10.0.0.10:6443 --token <token> --discovery-token-ca-cert-hash sha256:{r(64, HEX)}",
        f"--discovery-token-ca-cert-hash sha256:{r(64, HEX)}",
        "vault kv get -field=password secret/db",
        "vault status\nKey             Value\n---             -----\nSeal Type       shamir\nInitialized     true\nSealed          false\nTotal Shares    5\nThreshold       3\nVersion         1.15.2\nHA Enabled      false",
        "vault token lookup\nKey                 Value\n---                 -----\ndisplay_name        token\nexpire_time         <nil>\npolicies            [root]\nttl                 0s",
        'aws secretsmanager describe-secret --secret-id prod/db\n{"ARN": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:prod/db-AbCdEf", "Name": "prod/db", "RotationEnabled": true}',
        'terraform output\ndb_endpoint = "db.internal:5432"\ndb_password = <sensitive>',
        "az keyvault secret list --vault-name kv-prod --query '[].name' -o tsv\nsql-admin\nstripe-key",
        "gcloud secrets versions list db-password\nNAME  STATE    CREATED              DESTROYED\n4     enabled  2026-11-30T10:00:00  -",
        "helm upgrade api ./chart --set image.tag=1.4.2 --set replicaCount=3",
        "docker login -u ci --password-stdin ghcr.io < token.txt",
        "kubectl create secret generic db --from-file=password=./password.txt",
        f"git log --oneline\n{r(7, HEX)} fix token refresh\n{r(7, HEX)} rotate api keys in CI",
        f"sha256sum app.tar.gz\n{r(64, HEX)}  app.tar.gz",
        f"md5sum secrets.tar.gz.gpg\n{r(32, HEX)}  secrets.tar.gz.gpg",
        f"Image: registry.internal/auth-service@sha256:{r(64, HEX)}",
        f"container_id: containerd://{r(64, HEX)}",
        f'uid: {u()}\nresourceVersion: "8312345"',
        f"X-Amzn-Trace-Id: Root=1-{r(8, HEX)}-{r(24, HEX)}",
        f"traceparent: 00-{r(32, HEX)}-{r(16, HEX)}-01",
        "The password must contain at least one digit and one symbol (e.g. !#%).",
        "If the token is expired, run `gcloud auth login` again.",
        "Use a secret manager instead of env vars for credentials.",
        "Password: (none)",
        "password: ''",
        "secret: {}",
        "api_key: null",
        "token: ~",
        "Token:      <none>",
        "password=",
        'PASSWORD=""',
        "DB_PASSWORD: ${DB_PASSWORD:-}",
        'password: "${DB_PASSWORD}"',
        "POSTGRES_PASSWORD_FILE=/run/secrets/postgres_password",
        "client_secret: !env_var OAUTH_SECRET",
        "secret: vault:secret/data/app#token",
        'token: {{ env "GITHUB_TOKEN" }}',
        "api-key: $(API_KEY)",
        "password: %{hiera('db::password')}",
        "password => lookup('db_password')",
        "apiKeySecretRef:\n  name: cf-api\n  key: api-key",
        "existingSecret: pg-auth\nexistingSecretPasswordKey: password",
        "sessionAffinity: ClientIP",
        "session_timeout: 30m",
        "cookie_name: _oauth2_proxy",
        "key_name: deploy-key-2026",
        "ssh_key_path: ~/.ssh/id_ed25519",
        "public_key: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGf2qZ8p9y1Xr0bD3k7vHqD2kT0mNwYpQ9LzF4e8s7Qx ops@bastion",
        "Fingerprint: SHA256:Jq2gq0F5m1yQ5Vf8N3l1kz0tD8VbZ7fU2pX4Rr9sW1c",
        "The authenticity of host 'bastion (10.0.0.5)' can't be established.",
        "ERROR: permission denied for table orders (SQLSTATE 42501)",
        "GRANT SELECT ON ALL TABLES IN SCHEMA public TO reporting;",
        "CREATE USER app;",
        "ALTER USER app WITH PASSWORD NULL;",
        "SELECT usename, passwd IS NOT NULL AS has_password FROM pg_shadow;",
        "<passwordPolicy>strict</passwordPolicy>",
        "<tokenEndpoint>https://login.internal/token</tokenEndpoint>",
        "<secretName>db-creds</secretName>",
        "[auth]\nenabled = true\nmethod = oauth",
        "Node ip-10-0-3-17 NotReady: kubelet stopped posting node status",
        "pod/api-7d9f8b6c5-x2x9k  0/1  CrashLoopBackOff  14  20m",
        "certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUM=",
        "caBundle: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t",
        "Events:  <none>",
        'Error: INSTALLATION FAILED: secrets "sh.helm.release.v1.api.v3" already exists',
        "Tokens: 1,532 prompt, 412 completion",
        "max_tokens=512 temperature=0.2",
        "passed: 142, failed: 0, skipped: 3",
        "PASS  tests/auth.test.ts (3.2 s)",
        "grafana password reset via grafana-cli admin reset-admin-password",
        "ticket KEY-1234: rotate token for svc-deploy",
        "JIRA issue SEC-88 tracks the leaked key rotation",
        "pw_hash_algo: argon2id",
        "pwd: /home/app",
        "PWD=/srv/app",
        "OLDPWD=/root",
        "passthrough: true",
        "passive: false",
        "bypass_secret_check=false",
        "keyspace: orders",
        "keycloak realm: prod",
        "monkey patching the tokenizer",
        "the tokenizer splits on whitespace",
    ]


# Tune half only: these were written after the test half had been looked at once.
for _index, (_text, _secret) in enumerate(_probe_secrets() + _probe_secrets_2()):
    assert _secret in _text, _text
    _rows["tune-secrets"].append({"kind": "probe_forms", "form": _index, "text": _text, "secrets": [_secret]})
for _index, _text in enumerate(_probe_benign()):
    _rows["tune-benign"].append({"kind": "probe_look_alikes", "form": _index, "text": _text})


# -- secrets made of plain words (written last, so the rows above keep their random draws) ---------
_DICE = ["orbit", "velvet", "canyon", "pickle", "lantern", "meadow", "copper", "thistle", "glacier",
         "walrus", "saddle", "prism", "otter", "juniper", "basalt", "tangent", "marble", "fjord"]  # fmt: skip


def app_password() -> str:
    """A Google app password as Google shows it: four groups of four lowercase letters."""
    return " ".join(r(4, string.ascii_lowercase) for _ in range(4))


def diceware(words: int = 5) -> str:
    return " ".join(pick(_DICE) for _ in range(words))


def recovery_codes() -> str:
    return " ".join(f"{r(5, LOWER_NUM)}{_rng.choice(string.digits)}-{r(5, LOWER_NUM)}" for _ in range(3))


kind(
    "word_secrets",
    16,
    [
        one(lambda s: f"App password: {s}", app_password),
        one(lambda s: f"use the app-specific password {s} for IMAP, it replaces the old one", app_password),
        one(lambda s: f"the office wifi passphrase is {s}", diceware),
        one(lambda s: f"Pass phrase: {s}", diceware),
        one(lambda s: f"recovery codes: {s}", recovery_codes),
        one(lambda s: f"backup codes for the break-glass account are {s}.", recovery_codes),
        one(lambda s: f"seed phrase: {s}", lambda: diceware(12)),
        one(lambda s: f"the gpg passphrase for the release key is {s}", lambda: diceware(6)),
    ],
)
benign(
    "word_secret_look_alikes",
    8,
    [
        lambda: "the passphrase is stored in Vault under kv/wifi",
        lambda: "App password is required for IMAP clients",
        lambda: "recovery codes were regenerated by the admin",
        lambda: "the app password for ci was revoked yesterday",
        lambda: "Backup codes: ask the security team",
        lambda: "mnemonic names for the nodes are fine",
        lambda: "pass phrase is too short, minimum 12 characters",
        lambda: "the passphrase was rotated and shared with the on-call team",
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
