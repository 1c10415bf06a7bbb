# ruff: noqa: E501  (corpus lines are realistic ops text, kept whole on one line each)
"""Write the redaction corpus: ``corpus/secrets.jsonl`` and ``corpus/benign.jsonl``.

Deterministic (fixed seed): running it again rewrites the same files, so the committed corpus is
exactly what this script produces (``tests/reliability/test_secrets_corpus.py`` checks that).

    PYTHONPATH=$PWD python tests/redaction/make_corpus.py

``secrets.jsonl``: one object per line, ``{"kind", "text", "secrets"}``: realistic ops text (shell
history, kubeconfigs, manifests, Helm values, logs, connection strings, CI output) and the values
in it that must not survive redaction. ``benign.jsonl``: ``{"kind", "text"}``: text that must come
out of redaction unchanged (pod and ReplicaSet hashes, SHAs, UUIDs, digests, IPs, timestamps,
Kubernetes field names, ``*_key`` fields that are not credentials, client commands without one).
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import string
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent / "corpus"
SEED = 20261201

_rng = random.Random(SEED)
_ALNUM = string.ascii_letters + string.digits
_HEX = "0123456789abcdef"
_PW_SYMBOLS = "!#%^*_+~.="


def r(n: int, alphabet: str = _ALNUM) -> str:
    return "".join(_rng.choice(alphabet) for _ in range(n))


def pw() -> str:
    """A password people really use: letters, digits and a symbol, never a plain word."""
    return (
        r(3, string.ascii_uppercase)
        + r(4, string.ascii_lowercase)
        + r(3, string.digits)
        + r(1, _PW_SYMBOLS)
        + r(5)
    )


def b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def pem(label: str, lines: int = 6) -> tuple[str, str]:
    """A PEM block with a random body; returns (block, one body line to look for)."""
    body = [r(64, _ALNUM + "+/") for _ in range(lines)]
    return f"-----BEGIN {label}-----\n" + "\n".join(body) + f"\n-----END {label}-----\n", body[2]


def jwt() -> str:
    head = base64.urlsafe_b64encode(b'{"alg":"RS256","kid":"' + r(8).encode() + b'"}').decode().rstrip("=")
    claims = json.dumps(
        {"iss": "https://oidc.eks.eu-west-1.amazonaws.com/id/" + r(32, _HEX).upper(), "sub": r(8)}
    )
    body = base64.urlsafe_b64encode(claims.encode()).decode().rstrip("=")
    return f"{head}.{body}.{r(86, _ALNUM + '-_')}"


def host() -> str:
    return _rng.choice(
        ["db-0.db", "pg-primary.payments.svc", "10.20.3.14", "mysql.shop.svc.cluster.local", "redis-master"]
    )


def user() -> str:
    return _rng.choice(["root", "admin", "app", "svc_backup", "deploy", "ci", "grafana", "replicator"])


def hist(n: int) -> str:
    """A shell-history line number (``history`` output)."""
    return f"{_rng.randint(100, 2999):5d}  "


Entry = dict[str, object]
_secrets: list[Entry] = []


def add(kind: str, text: str, *secrets: str) -> None:
    assert all(s in text for s in secrets), (kind, text, secrets)
    _secrets.append({"kind": kind, "text": text, "secrets": list(secrets)})


def gen(kind: str, count: int) -> Callable[[Callable[[int], None]], Callable[[int], None]]:
    def wrap(make: Callable[[int], None]) -> Callable[[int], None]:
        for i in range(count):
            make(i)
        return make

    return wrap


# --- command-line flags -------------------------------------------------------------------------
@gen("mysql_flag", 12)
def _mysql(i: int) -> None:
    p = pw()
    forms = [
        f"{hist(i)}mysql -u{user()} -p{p} -h {host()} shop",
        f"$ mysqldump -u {user()} -p'{p}' --single-transaction shop | gzip > /backup/shop-$(date +%F).sql.gz",
        f'mysqladmin -uroot -p"{p}" -h {host()} processlist',
        f"{hist(i)}mysql --host={host()} --user={user()} --password={p} -e 'SHOW SLAVE STATUS\\G'",
        f'      command: ["sh", "-c", "mysqldump -uroot -p{p} --all-databases > /dump/all.sql"]',
        f"+ mariadb -h {host()} -u app -p{p} -e 'select 1'",
    ]
    add("mysql_flag", forms[i % len(forms)], p)


@gen("psql_env", 12)
def _psql(i: int) -> None:
    p = pw()
    forms = [
        f"{hist(i)}PGPASSWORD={p} psql -h {host()} -U {user()} -d payments -c 'select now()'",
        f"PGPASSWORD='{p}' pg_dump -h {host()} -U postgres -Fc payments > payments.dump",
        f'psql "host={host()} port=5432 dbname=app user={user()} password={p} sslmode=require"',
        f"export PGPASSWORD={p}\npsql -h {host()} -U app",
    ]
    add("psql_env", forms[i % len(forms)], p)


@gen("redis_flag", 12)
def _redis(i: int) -> None:
    p = pw()
    forms = [
        f"{hist(i)}redis-cli -h {host()} -p 6379 -a {p} INFO replication",
        f"$ redis-cli -a '{p}' --no-auth-warning -n 2 KEYS 'session:*' | wc -l",
        f"kubectl exec -it redis-master-0 -- redis-cli --pass {p} CLIENT LIST",
        f"REDISCLI_AUTH={p} redis-cli -h redis-master ping",
        f"valkey-cli -h cache -a {p} DBSIZE",
        f"redis-cli -u redis://default:{p}@redis-master:6379/0 ping",
    ]
    add("redis_flag", forms[i % len(forms)], p)


@gen("curl_userpass", 12)
def _curl(i: int) -> None:
    p = pw()
    u = user()
    forms = [
        f"{hist(i)}curl -u {u}:{p} https://jenkins.internal/job/deploy/build -X POST",
        f"curl -sS --user {u}:{p} http://elasticsearch:9200/_cluster/health?pretty",
        f"+ curl -fsSL -u{u}:{p} https://nexus.example.com/repository/raw/app.tgz -o app.tgz",
        f"curl --proxy-user {u}:{p} -x http://proxy:3128 https://api.github.com",
        f"curl -k --user '{u}:{p}' https://grafana.internal/api/datasources",
        f"http -a {u}:{p} POST https://api.internal/v1/jobs name=rebuild",
    ]
    add("curl_userpass", forms[i % len(forms)], p)


@gen("http_header_token", 12)
def _header(i: int) -> None:
    t = r(40, _ALNUM + "-_")
    forms = [
        f'curl -H "Authorization: Bearer {t}" https://api.internal/v1/status',
        f"curl -H 'X-Api-Key: {t}' https://api.pagerduty.example/incidents",
        f'curl --header "PRIVATE-TOKEN: {t}" https://gitlab.example.com/api/v4/projects',
        f"curl --oauth2-bearer {t} https://api.internal/v1/me",
        f"> GET /api/v1/query HTTP/1.1\n> Host: prometheus\n> Authorization: Bearer {t}\n> Accept: */*",
        f'{{"level":"debug","msg":"outgoing request","headers":{{"X-Auth-Token":"{t}","Accept":"application/json"}}}}',
    ]
    add("http_header_token", forms[i % len(forms)], t)


@gen("sshpass", 12)
def _sshpass(i: int) -> None:
    p = pw()
    forms = [
        f"{hist(i)}sshpass -p {p} ssh -o StrictHostKeyChecking=no ops@10.0.4.{i}",
        f"sshpass -p'{p}' scp backup.tar.gz ops@bastion:/srv/",
        f"SSHPASS={p} sshpass -e rsync -av ./dist/ deploy@web-{i}:/var/www/",
        f"plink -ssh -pw {p} admin@192.168.1.{i} 'show running-config'",
    ]
    add("sshpass", forms[i % len(forms)], p)


@gen("mongo_flag", 12)
def _mongo(i: int) -> None:
    p = pw()
    forms = [
        f"{hist(i)}mongosh --host mongo-0.mongo -u admin -p {p} --authenticationDatabase admin",
        f"mongodump --uri mongodb://mongo:27017 --username backup --password {p} --gzip --archive=/b/x.gz",
        f"mongo -u root -p'{p}' admin --eval 'rs.status()'",
        f"mongorestore --username restore --password={p} --drop /dump",
        f"mongoexport -u reporter -p {p} --db app --collection orders --out orders.json",
    ]
    add("mongo_flag", forms[i % len(forms)], p)


@gen("wget_password", 10)
def _wget(i: int) -> None:
    p = pw()
    forms = [
        f"wget --user={user()} --password={p} https://artifacts.internal/app-{i}.tgz",
        f"wget --http-user=ci --http-password {p} -q -O - https://nexus/metrics",
        f"wget --ftp-user=anon --ftp-password={p} ftp://mirror.internal/pub/iso",
        f"{hist(i)}wget --proxy-user=u --proxy-password={p} https://example.com",
    ]
    add("wget_password", forms[i % len(forms)], p)


@gen("htpasswd", 10)
def _htpasswd(i: int) -> None:
    p = pw()
    forms = [
        f"{hist(i)}htpasswd -b /etc/nginx/.htpasswd {user()} {p}",
        f"htpasswd -bc auth prometheus {p}",
        f"htpasswd -nbB admin {p} > auth && kubectl create secret generic basic-auth --from-file=auth",
        f"RUN htpasswd -Bb /etc/apache2/.htpasswd monitor {p}",
        f"htpasswd -nb {user()} '{p}'",
    ]
    add("htpasswd", forms[i % len(forms)], p)


@gen("registry_login", 12)
def _login(i: int) -> None:
    p = pw()
    forms = [
        f"{hist(i)}docker login -u deploy -p {p} registry.example.com",
        f"$ docker login -u gitlab-ci-token -p {p} $CI_REGISTRY\nWARNING! Using --password via the CLI is insecure.",
        f"podman login quay.io --username robot+ci --password {p}",
        f"helm registry login ghcr.io -u bot -p {p}",
        f"nerdctl login --username admin --password={p} harbor.internal",
        f"skopeo copy --src-creds reader:{p} docker://reg/a:1 docker://reg2/a:1",
    ]
    add("registry_login", forms[i % len(forms)], p)


@gen("kubectl_token", 12)
def _kubectl(i: int) -> None:
    t = r(48, _ALNUM) if i % 3 else jwt()
    forms = [
        f"{hist(i)}kubectl --server=https://10.0.0.1:6443 --token={t} get pods -A",
        f"kubectl --token {t} -n payments logs deploy/api --tail=50",
        f"oc login --token=sha256~{t} --server=https://api.ocp.example.com:6443",
        f"kubectl config set-credentials ci --token={t}",
        f"argocd login argocd.internal --username admin --password {t}",
        f"helm upgrade --install api ./chart --kube-token {t} -n api",
    ]
    add("kubectl_token", forms[i % len(forms)], t)


@gen("db_client_misc", 12)
def _misc(i: int) -> None:
    p = pw()
    vault = f"hvs.{r(24)}"
    aws = r(40, _ALNUM + "/+")
    forms = [
        (f"{hist(i)}ldapsearch -x -H ldap://ldap.corp -D 'cn=admin,dc=corp,dc=com' -w {p} '(uid=jdoe)'", p),
        (f"/opt/mssql-tools/bin/sqlcmd -S tcp:sql.internal,1433 -U sa -P {p} -Q 'SELECT @@VERSION'", p),
        (f"openssl pkcs12 -export -in tls.crt -inkey tls.key -out keystore.p12 -passout pass:{p}", p),
        (
            f"keytool -importkeystore -srckeystore ks.p12 -srcstorepass {p} -destkeystore ks.jks -deststorepass {p}",
            p,
        ),
        (f"smbclient //fileserver/backups -U svc_backup%{p} -c 'ls'", p),
        (f"sudo mount -t cifs //nas/share /mnt/share -o username=backup,password={p},vers=3.0", p),
        (f"sqlplus system/{p}@//oracle.internal:1521/ORCLPDB1", p),
        (f"rabbitmqctl add_user monitoring {p}", p),
        (f"vault login {vault}", vault),
        (f"mc alias set minio http://minio:9000 minioadmin {p}", p),
        (f"aws configure set aws_secret_access_key {aws}", aws),
        (f"ssh-keygen -t ed25519 -N '{p}' -f ~/.ssh/deploy", p),
    ]
    text, secret = forms[i % len(forms)]
    add("db_client_misc", text, secret)


@gen("nested_command", 10)
def _nested(i: int) -> None:
    p = pw()
    forms = [
        f"ssh bastion.prod \"mysql -uroot -p{p} -e 'show full processlist'\"",
        f"kubectl exec -n db pg-0 -- sh -c \"PGPASSWORD={p} psql -U app -c 'select 1'\"",
        f"mysql -h {host()} -u app -p$APP_PW shop -e 'select 1' && ssh ops@jump \"redis-cli -a {p} ping\"",
        f'      command: ["/bin/sh", "-c", "until redis-cli -h redis -a {p} ping; do sleep 1; done"]',
        f"watch -n5 'curl -s -u monitor:{p} http://rabbitmq:15672/api/overview'",
    ]
    add("nested_command", forms[i % len(forms)], p)


# --- URLs and connection strings -------------------------------------------------------------
@gen("url_password", 14)
def _url(i: int) -> None:
    p = pw()
    if i % 4 == 3:
        p = p[:6] + "@" + p[6:]  # a raw "@" pasted unescaped
    schemes = [
        ("postgresql", "pg-primary.payments.svc:5432/payments?sslmode=require"),
        ("mysql", "mysql.shop:3306/shop"),
        ("amqp", "rabbitmq.mq.svc:5672/%2F"),
        ("mongodb+srv", "cluster0.ab1cd.mongodb.net/app?retryWrites=true"),
        ("redis", "redis-master:6379/0"),
        ("https", "nexus.internal/repository/pypi/simple"),
        ("git+https", "git.example.com/platform/charts.git"),
    ]
    scheme, rest = schemes[i % len(schemes)]
    line = [
        f"DATABASE_URL={scheme}://{user()}:{p}@{rest}",
        f'time="2026-11-30T08:1{i % 10}:00Z" level=error msg="dial failed" dsn="{scheme}://{user()}:{p}@{rest}"',
        f"Cloning into 'charts'...\nfatal: unable to access '{scheme}://{user()}:{p}@{rest}': 403",
        f"pip install --index-url {scheme}://{user()}:{p}@{rest} opsbot",
    ][i % 4]
    add("url_password", line, p)


@gen("connection_string", 12)
def _connstr(i: int) -> None:
    p = pw()
    forms = [
        f"Server=tcp:sql-prod.database.windows.net,1433;Initial Catalog=app;User ID=app;Password={p};Encrypt=True;",
        f"jdbc:postgresql://pg:5432/app?user=app&password={p}&ssl=true",
        f"jdbc:oracle:thin:scott/{p}@oracle.internal:1521/ORCL",
        f"DefaultEndpointsProtocol=https;AccountName=stprod;AccountKey={b64(r(48))};EndpointSuffix=core.windows.net",
        f"Endpoint=sb://bus.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey={b64(r(32))}",
        f'sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="app" password="{p}";',
    ]
    text = forms[i % len(forms)]
    if i % len(forms) == 3:
        secret = text.split("AccountKey=")[1].split(";")[0]
    elif i % len(forms) == 4:
        secret = text.split("SharedAccessKey=")[1]
    else:
        secret = p
    add("connection_string", text, secret)


# --- kubeconfigs, Secrets, manifests, Helm values ---------------------------------------------
def kubeconfig(user_block: str) -> str:
    ca = b64(pem("CERTIFICATE")[0])
    return (
        "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n"
        f"    certificate-authority-data: {ca}\n    server: https://10.0.0.1:6443\n  name: prod\n"
        "contexts:\n- context:\n    cluster: prod\n    user: admin\n  name: prod\n"
        f"current-context: prod\nusers:\n- name: admin\n  user:\n{user_block}"
    )


@gen("kubeconfig_key_data", 12)
def _kc_key(i: int) -> None:
    label = ["RSA PRIVATE KEY", "EC PRIVATE KEY", "PRIVATE KEY"][i % 3]
    key = b64(pem(label)[0])
    cert = b64(pem("CERTIFICATE")[0])
    if i % 4 == 0:  # kubectl config view --raw -o json
        text = json.dumps(
            {"users": [{"name": "admin", "user": {"client-certificate-data": cert, "client-key-data": key}}]}
        )
    elif i % 4 == 1:  # a Secret holding a TLS pair
        text = f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: api-tls\ntype: kubernetes.io/tls\ndata:\n  tls.crt: {cert}\n  tls.key: {key}\n"
    elif i % 4 == 2:  # a Helm value for a sidecar, under a neutral name
        text = f"proxy:\n  enabled: true\n  tlsBundle: {key}\n  port: 8443\n"
    else:
        text = kubeconfig(f"    client-certificate-data: {cert}\n    client-key-data: {key}\n")
    add("kubeconfig_key_data", text, key[100:160])


@gen("kubeconfig_cert_data", 10)
def _kc_cert(i: int) -> None:
    cert = b64(pem("CERTIFICATE")[0])
    field = ["client-certificate-data", "proxy-cert-data", "clientCertData"][i % 3]
    text = kubeconfig(f"    {field}: {cert}\n    client-key: /etc/kubernetes/pki/admin.key\n")
    add("kubeconfig_cert_data", text, cert[80:140])


@gen("kubeconfig_token", 12)
def _kc_token(i: int) -> None:
    t = jwt() if i % 2 else r(52, _ALNUM)
    blocks = [
        f"    token: {t}\n",
        f"    auth-provider:\n      config:\n        id-token: {t}\n        refresh-token: {r(40)}\n      name: oidc\n",
        f"    auth-provider:\n      config:\n        access-token: {t}\n        expiry: 2026-12-01T10:00:00Z\n      name: gcp\n",
        "    exec:\n      apiVersion: client.authentication.k8s.io/v1beta1\n      command: aws\n      env:\n"
        f"      - name: AWS_SESSION_TOKEN\n        value: {t}\n      - name: AWS_PROFILE\n        value: prod\n",
    ]
    add("kubeconfig_token", kubeconfig(blocks[i % len(blocks)]), t)


@gen("k8s_secret_data", 14)
def _secret(i: int) -> None:
    values = {name: pw() for name in ("username", "url", "config.json", f"extra-{i}")}
    values["url"] = f"postgres://app:{values['url']}@pg:5432/app"
    data = {k: b64(v) for k, v in values.items()}
    if i % 3 == 0:
        text = "apiVersion: v1\ndata:\n" + "".join(f"  {k}: {v}\n" for k, v in data.items())
        text += f"kind: Secret\nmetadata:\n  name: app-db-{i}\n  namespace: payments\ntype: Opaque\n"
        secrets = list(data.values())
    elif i % 3 == 1:
        doc = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": f"app-{i}"},
            "data": data,
            "type": "Opaque",
        }
        text = json.dumps(doc, indent=2)
        secrets = list(data.values())
    else:
        text = (
            f"---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-config\ndata:\n  LOG_LEVEL: info\n"
            f"---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: app-env-{i}\nstringData:\n"
            + "".join(f"  {k}: {v}\n" for k, v in values.items() if k != "config.json")
            + f'  config.json: |\n    {{"client": "{values["config.json"]}"}}\n'
        )
        secrets = list(values.values())
    add("k8s_secret_data", text, *secrets)


@gen("helm_values", 14)
def _helm(i: int) -> None:
    p = pw()
    forms = [
        f'auth:\n  enabled: true\n  rootPassword: {p}\n  existingSecret: ""\nprimary:\n  persistence:\n    size: 20Gi\n',
        f'postgresql:\n  auth:\n    postgresPassword: "{p}"\n    username: app\n    database: app\n',
        f"$ helm upgrade --install redis bitnami/redis --set auth.password={p} --set replica.replicaCount=2",
        f"minio:\n  rootUser: admin\n  secretKey: {p}\n  accessKey: AKIA{r(16, string.ascii_uppercase + string.digits)}\n",
        f"grafana:\n  adminPassword: '{p}'\n  ingress:\n    enabled: true\n",
        f"smtp:\n  host: smtp.example.com\n  smtpPassword: {p}\n  port: 587\n",
        f"helm install api ./chart --set-string secrets.apiToken={p} -n api",
    ]
    add("helm_values", forms[i % len(forms)], p)


@gen("dockerconfigjson", 10)
def _docker(i: int) -> None:
    p = pw()
    auth = b64(f"robot:{p}")
    cfg = json.dumps({"auths": {"registry.example.com": {"username": "robot", "password": p, "auth": auth}}})
    if i % 3 == 0:
        text = f"apiVersion: v1\nkind: Secret\ntype: kubernetes.io/dockerconfigjson\ndata:\n  .dockerconfigjson: {b64(cfg)}\n"
        add("dockerconfigjson", text, b64(cfg))
    elif i % 3 == 1:
        text = json.dumps({"auths": {"ghcr.io": {"auth": auth}}}, indent=2)
        add("dockerconfigjson", text, auth)
    else:
        text = f"//registry.npmjs.org/:_authToken={r(36)}\n_auth={auth}\nalways-auth=true"
        add("dockerconfigjson", text, auth, text.split("=")[1].split("\n")[0])


@gen("manifest_env", 12)
def _env(i: int) -> None:
    p = pw()
    name = [
        "DB_PASSWORD",
        "STRIPE_SECRET",
        "SENTRY_AUTH_TOKEN",
        "SMTP_PASS",
        "JWT_SIGNING_KEY",
        "RABBITMQ_PASSWORD",
    ][i % 6]
    forms = [
        f"    env:\n    - name: {name}\n      value: {p}\n    - name: LOG_LEVEL\n      value: debug\n",
        f'        env:\n        - name: "{name}"\n          value: "{p}"\n',
        json.dumps({"env": [{"name": name, "value": p}, {"name": "PORT", "value": "8080"}]}),
        f"docker run -d -e {name}={p} -e PORT=8080 registry.example.com/api:1.4.2",
    ]
    add("manifest_env", forms[i % len(forms)], p)


@gen("kubectl_create_secret", 10)
def _create(i: int) -> None:
    p = pw()
    forms = [
        f"{hist(i)}kubectl create secret generic db-creds --from-literal=username=app --from-literal=password={p}",
        f"kubectl -n payments create secret generic stripe --from-literal=key={p} --dry-run=client -o yaml",
        f"kubectl create secret docker-registry regcred --docker-server=reg --docker-username=ci --docker-password={p}",
        f"oc create secret generic webhook --from-literal=hmac={p}",
    ]
    add("kubectl_create_secret", forms[i % len(forms)], p)


# --- tokens of known shapes -------------------------------------------------------------------
@gen("cloud_keys", 12)
def _cloud(i: int) -> None:
    akia = "AKIA" + r(16, string.ascii_uppercase + string.digits)
    secret = r(40, _ALNUM + "/+")
    forms = [
        (
            f"[default]\naws_access_key_id = {akia}\naws_secret_access_key = {secret}\nregion = eu-west-1",
            [akia, secret],
        ),
        (f"export AWS_ACCESS_KEY_ID={akia}\nexport AWS_SECRET_ACCESS_KEY={secret}", [akia, secret]),
        (f"GET https://maps.googleapis.com/maps/api/geocode/json?key=AIza{r(35, _ALNUM + '_-')} 403", []),
        (f"az storage blob list --account-name st --account-key {b64(r(48))} -c logs", []),
    ]
    text, secrets = forms[i % len(forms)]
    if not secrets:
        secrets = (
            [text.split("key=")[1].split()[0]]
            if "key=" in text
            else [text.split("--account-key ")[1].split()[0]]
        )
    add("cloud_keys", text, *secrets)


@gen("vendor_tokens", 16)
def _vendor(i: int) -> None:
    tokens = [
        "ghp_" + r(36),
        "github_pat_" + r(22) + "_" + r(59),
        "glpat-" + r(20, _ALNUM + "_-"),
        f"xoxb-{r(12, string.digits)}-{r(13, string.digits)}-{r(24)}",
        "sk_live_" + r(24),
        "sk-proj-" + r(48, _ALNUM + "_-"),
        "npm_" + r(36),
        "hf_" + r(34, string.ascii_letters),
        "SG." + r(22, _ALNUM + "_-") + "." + r(43, _ALNUM + "_-"),
        "ya29." + r(60, _ALNUM + "_-"),
    ]
    t = tokens[i % len(tokens)]
    lines = [
        f"Run actions/checkout@v4\n  with:\n    token: ***\n    repository: acme/api\n  env:\n    DEBUG_TOKEN_DUMP: {t}",
        f"2026-11-30T09:1{i % 10}:02.114Z ERROR notifier: post failed with {t}: invalid_auth",
        f"$ git remote set-url origin https://oauth2:{t}@git.example.com/acme/api.git",
        f"warning: using {t} from ~/.config/tool/config.yaml",
    ]
    add("vendor_tokens", lines[i % len(lines)], t)


@gen("jwt", 10)
def _jwt(i: int) -> None:
    t = jwt()
    forms = [
        f'{{"ts":"2026-11-30T10:00:0{i}Z","level":"warn","msg":"token rejected","jwt":"{t}","reason":"expired"}}',
        f"ingress-nginx: 401 GET /api/orders?access_token={t} upstream=api",
        f"cookie contents: session {t}",
        f"kubectl describe sa ci -> token {t}",
    ]
    add("jwt", forms[i % len(forms)], t)


@gen("private_key_pem", 10)
def _pem(i: int) -> None:
    label = ["RSA PRIVATE KEY", "OPENSSH PRIVATE KEY", "EC PRIVATE KEY", "ENCRYPTED PRIVATE KEY"][i % 4]
    block, line = pem(label)
    forms = [
        f"$ cat ~/.ssh/id_deploy\n{block}$ chmod 600 ~/.ssh/id_deploy",
        "tls:\n  key: |\n" + "".join(f"    {ln}\n" for ln in block.splitlines()),
        json.dumps(
            {
                "type": "service_account",
                "project_id": "prod",
                "private_key": block,
                "client_email": "ci@prod.iam",
            }
        ),
    ]
    add("private_key_pem", forms[i % len(forms)], line)


@gen("basic_auth_header", 10)
def _basic(i: int) -> None:
    cred = b64(f"{user()}:{pw()}")
    forms = [
        f"curl -H 'Authorization: Basic {cred}' http://kibana:5601/api/status",
        f'127.0.0.1 - - [30/Nov/2026:10:1{i % 10}:00 +0000] "GET /metrics HTTP/1.1" 401 - auth="Basic {cred}"',
        f"proxy-authorization: Basic {cred}",
    ]
    add("basic_auth_header", forms[i % len(forms)], cred)


@gen("app_log_fields", 14)
def _logs(i: int) -> None:
    p = pw()
    forms = [
        f'level=error ts=2026-11-30T10:0{i % 10}:00Z caller=client.go:88 msg="auth failed" user=svc password={p} attempt=3',
        json.dumps(
            {"level": "debug", "msg": "loaded config", "db": {"host": "pg", "password": p}, "port": 5432}
        ),
        f"DEBUG settings: {{'broker_url': 'amqp://guest@rabbit//', 'client_secret': '{p}', 'timeout': 30}}",
        f'[2026-11-30 10:00:0{i % 10}] production.INFO: Mail configured {{"smtp_pass":"{p}"}}',
        f"E1130 10:00:0{i % 10}.123456       1 webhook.go:42] calling webhook with secret={p}: connection refused",
    ]
    add("app_log_fields", forms[i % len(forms)], p)


@gen("ci_output", 12)
def _ci(i: int) -> None:
    p = pw()
    t = "glpat-" + r(20, _ALNUM + "_-")
    forms = [
        (
            f'$ echo "$CI_JOB_NAME"\ndeploy\n$ docker login -u gitlab-ci-token -p {t} registry.gitlab.com\nLogin Succeeded',
            t,
        ),
        (f"+ ./gradlew publish -PnexusUsername=ci -PnexusPassword={p}\n> Task :publish", p),
        (f"[Pipeline] sh\n+ curl -fsS -u jenkins:{p} https://nexus/service/rest/v1/status", p),
        (f"##[debug]Evaluating: secrets.DEPLOY_KEY\n##[debug]Result: '{p}'\nDEPLOY_KEY={p}", p),
        (f"Step 7/12 : RUN pip install --extra-index-url https://ci:{p}@pypi.internal/simple app", p),
        (f"terraform apply -var 'db_password={p}' -auto-approve", p),
    ]
    text, secret = forms[i % len(forms)]
    add("ci_output", text, secret)


@gen("dotfiles", 10)
def _dot(i: int) -> None:
    p = pw()
    forms = [
        f"$ cat ~/.netrc\nmachine api.heroku.com login ops@example.com password {p}",
        f"$ cat ~/.pgpass\npg-primary.payments.svc:5432:payments:app:{p}",
        f"# .env\nAPP_ENV=production\nAPP_KEY=base64:{b64(r(32))}\nMAIL_PASSWORD={p}",
        f"[client]\nuser=root\npassword={p}\nhost=127.0.0.1",
        f'~/.my.cnf:\n[mysqldump]\nuser = backup\npassword = "{p}"',
    ]
    text = forms[i % len(forms)]
    secret = text.split("APP_KEY=")[1].split("\n")[0] if "APP_KEY=" in text else p
    add("dotfiles", text, secret)


@gen("cookie_header", 10)
def _cookie(i: int) -> None:
    sid = r(32, _HEX)
    forms = [
        f"Cookie: sessionid={sid}; csrftoken={r(32)}; theme=dark",
        f"< HTTP/1.1 302 Found\n< Set-Cookie: _gitlab_session={sid}; path=/; HttpOnly\n< Location: /",
        f"curl -b 'sid={sid}' -H 'Cookie: connect.sid={sid}' https://app.internal/admin",
    ]
    add("cookie_header", forms[i % len(forms)], sid)


@gen("presigned_url", 10)
def _presigned(i: int) -> None:
    sig = r(64, _HEX)
    sas = r(43, _ALNUM + "%") + "%3D"
    forms = [
        (
            "https://backups.s3.eu-west-1.amazonaws.com/db/2026-11-30.sql.gz?X-Amz-Algorithm=AWS4-HMAC-SHA256"
            f"&X-Amz-Date=20261130T100000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host&X-Amz-Signature={sig}",
            sig,
        ),
        (
            f"azcopy copy 'https://st.blob.core.windows.net/logs?sv=2022-11-02&ss=b&srt=co&sp=rl&se=2026-12-01&sig={sas}' .",
            sas,
        ),
        (
            f"https://storage.googleapis.com/dumps/x.tgz?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Signature={sig}",
            sig,
        ),
    ]
    text, secret = forms[i % len(forms)]
    add("presigned_url", text, secret)


# --- benign ------------------------------------------------------------------------------------
_benign: list[Entry] = []


def ok(kind: str, text: str) -> None:
    _benign.append({"kind": kind, "text": text})


def pod_hash() -> str:
    return r(_rng.choice([9, 10]), "bcdfghjklmnpqrstvwxz2456789")


for i in range(12):
    rs = pod_hash()
    ok(
        "pod_names",
        f"api-{rs}-{r(5, 'bcdfghjklmnpqrstvwxz2456789')}   0/1     CrashLoopBackOff   {i} (2m ago)   3h",
    )
for i in range(10):
    rs = pod_hash()
    ok(
        "replicaset_hash",
        f"deployment.apps/api rolled out: replicaset api-{rs} ({i + 1}/3 replicas), pod-template-hash={rs}",
    )
for _ in range(12):
    sha = hashlib.sha1(r(20).encode()).hexdigest()
    ok(
        "git_sha",
        _rng.choice(
            [
                f"commit {sha}\nAuthor: Dana <dana@example.com>",
                f"HEAD is now at {sha[:7]} fix: retry",
                f"argocd: synced to {sha}",
            ]
        ),
    )
for _ in range(10):
    ok(
        "uuid",
        _rng.choice(
            [
                f"request_id={uuid.UUID(int=_rng.getrandbits(128))} status=500",
                f'"uid": "{uuid.UUID(int=_rng.getrandbits(128))}"',
                f"trace_id: {r(32, _HEX)} span_id: {r(16, _HEX)}",
            ]
        ),
    )
for _ in range(10):
    digest = hashlib.sha256(r(20).encode()).hexdigest()
    ok(
        "image_digest",
        _rng.choice(
            [
                f'Pulling image "registry.example.com/api@sha256:{digest}"',
                f"image: ghcr.io/acme/worker@sha256:{digest}",
                f"imageID: docker-pullable://nginx@sha256:{digest}",
            ]
        ),
    )
for _ in range(8):
    ip = f"10.{_rng.randint(0, 255)}.{_rng.randint(0, 255)}.{_rng.randint(1, 254)}"
    ok(
        "ip_address",
        _rng.choice(
            [
                f"podIP: {ip}\nhostIP: 192.168.10.{_rng.randint(2, 250)}",
                f"dial tcp {ip}:5432: connect: connection refused",
                f"upstream: [fd00:10:244::{r(4, _HEX)}]:8080 timed out",
            ]
        ),
    )
for i in range(8):
    ok(
        "timestamp",
        _rng.choice(
            [
                f'lastTransitionTime: "2026-11-30T0{i}:12:44Z"',
                f"1764499{r(3, string.digits)}.{r(9, string.digits)} level=info msg=tick",
                f"Nov 30 10:0{i}:01 node-3 kubelet[812]: I1130 10:0{i}:01.000000 eviction",
            ]
        ),
    )
_K8S_FIELDS = [
    "spec:\n  sessionAffinity: ClientIP\n  sessionAffinityConfig:\n    clientIP:\n      timeoutSeconds: 10800",
    "      serviceAccountName: api\n      automountServiceAccountToken: false",
    "      imagePullSecrets:\n      - name: regcred",
    "        env:\n        - name: DB_PASSWORD\n          valueFrom:\n            secretKeyRef:\n              name: api-db\n              key: password",
    "  volumes:\n  - name: token\n    projected:\n      sources:\n      - serviceAccountToken:\n          expirationSeconds: 3600\n          path: token",
    "      tolerations:\n      - key: node-role.kubernetes.io/control-plane\n        operator: Exists\n        effect: NoSchedule",
    "  secretName: api-tls\n  hosts:\n  - api.example.com",
    "    envFrom:\n    - secretRef:\n        name: app-env\n    - configMapRef:\n        name: app-config",
    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\ndata:\n  LOG_LEVEL: debug\n  FEATURE_FLAGS: checkout,search",
    "  tokenExpirationSeconds: 3600\n  passwordMinLength: 12",
    "Type:  kubernetes.io/service-account-token\n\nData\n====\nca.crt:     1099 bytes\nnamespace:  7 bytes\ntoken:      <set>",
    "auth:\n  existingSecret: redis-auth\n  existingSecretPasswordKey: redis-password\n  usePasswordFiles: true",
    "    - name: TOKEN_AUDIENCE\n      value: https://kubernetes.default.svc",
    "  strategy:\n    type: RollingUpdate\n    rollingUpdate:\n      maxSurge: 25%",
    "  kubeconfig: /etc/kubernetes/admin.conf\n  client-key: /etc/kubernetes/pki/apiserver-kubelet-client.key",
    "  certificate-authority-data: " + b64(pem("CERTIFICATE")[0]),
]
for text in _K8S_FIELDS:
    ok("kubernetes_fields", text)
_NOT_SECRET_KEYS = [
    ("cache_key", "user:42:profile"),
    ("routing_key", "orders.created"),
    ("partition_key", "tenant-7"),
    ("idempotency_key", "9b2f1c6e-1d7a-4c1e-b0b4-2f0d3c1e5a77"),
    ("dedup_key", "KubePodCrashLooping/payments/api"),
    ("sort_key", "created_at"),
    ("hash_key", "order_id"),
    ("object_key", "backups/2026/11/30/db.sql.gz"),
    ("group_key", '{}:{alertname="KubePodCrashLooping"}'),
    ("lock_key", "migrations"),
    ("shard_key", "customer_id"),
    ("message_key", "evt-88123"),
    ("primary_key", "id"),
    ("label_key", "app.kubernetes.io/name"),
    ("s3_key", "exports/orders.csv"),
]
for index, (key, value) in enumerate(_NOT_SECRET_KEYS):
    form = index % 3
    if form == 0:
        ok("not_secret_key_fields", f'{key}={value} level=info msg="processed"')
    elif form == 1:
        ok("not_secret_key_fields", json.dumps({key: value, "status": "ok"}))
    else:
        ok("not_secret_key_fields", f"  {key}: {value}")
for text in (
    "cacheKey: users-v2\nroutingKey: billing.#\npartitionKey: region",
    "RabbitMQ: published to exchange=events routing_key=order.paid delivery_mode=2",
    "kafka producer: partition_key=account-1123 topic=ledger offset=99812",
    "stripe: retrying POST /v1/charges with idempotency_key=ik_01HGZ2 (attempt 2)",
    "dynamodb: ConditionalCheckFailed on hash_key=order-991 range_key=2026-11-30",
):
    ok("not_secret_key_fields", text)
_COMMANDS = [
    "mysql -uroot -p -h db shop",
    "mysql -h db -P 3306 -u app shop -e 'select 1'",
    "redis-cli -h redis-master -p 6379 ping",
    "redis-cli -a $REDIS_PASSWORD --no-auth-warning INFO",
    'mysql -uroot -p"$MYSQL_ROOT_PASSWORD" -e "show databases"',
    "curl -u admin https://jenkins.internal/api/json",
    "curl -sS -X POST -H 'Content-Type: application/json' http://api:8080/v1/jobs",
    "docker run --rm -u 1000:1000 -v $PWD:/src golang:1.23 go build ./...",
    'echo "$CI_REGISTRY_PASSWORD" | docker login -u ci --password-stdin registry.gitlab.com',
    "kubectl get secret api-db -o jsonpath='{.data.password}' | base64 -d | wc -c",
    "htpasswd -c /etc/nginx/.htpasswd admin",
    "ssh -p 2222 -i ~/.ssh/id_ed25519 ops@bastion.example.com",
    "psql -h pg -U app -W payments",
    "sshpass -e ssh ops@10.0.4.2",
    "mongosh --host mongo-0 --tls --tlsCAFile /etc/ssl/ca.pem",
    "kubectl logs deploy/api -p --tail=100",
    "ps -u postgres -o pid,cmd",
    "tar -czpf backup.tgz /etc",
    "helm upgrade --install api ./chart --set replicaCount=3 --set image.tag=1.4.2",
    "kubectl create configmap app --from-literal=LOG_LEVEL=debug --from-literal=REGION=eu-west-1",
    "openssl req -new -key tls.key -out tls.csr -passin env:KEY_PASS",
    "wget -q https://github.com/prometheus/prometheus/releases/download/v3.0.0/prometheus-3.0.0.tar.gz",
    "vault kv get -field=url secret/app/db",
    "git clone https://github.com/acme/api.git && cd api",
    "curl https://api.internal/v1/users/42 -H 'Accept: application/json'",
]
for text in _COMMANDS:
    ok("client_commands_without_secret", text)
_PROSE = [
    "failed to refresh token: context deadline exceeded",
    "the password rotation job ran at 02:00 and finished in 14 s",
    "we use basic authentication on the ingress and bearer authentication for the API",
    "tokenizer: llama3 max_tokens=512 prompt_tokens=1200 output_tokens=80",
    "TOKEN_TTL=30s password_min_length=12 SECRET_NAME=api-db PASSWORD_FILE=/run/secrets/db",
    "tests: pass=12 fail=0 skip=3",
    "session_timeout=30m session_count=1204 sessionAffinity=None",
    'rate(http_requests_total{code=~"5..",route="/login"}[5m]) = 0.042',
    "0/3 nodes are available: 3 Insufficient memory. preemption: 0/3 nodes are available",
    'Error: secret "db-creds" not found',
    'Warning  FailedMount  2m  kubelet  MountVolume.SetUp failed for volume "token" : secret "ci-token" not found',
    "binaryData:\n  logo.txt: " + b64("hello from the payments team, nothing secret here"),
    "config.checksum: " + hashlib.sha256(b"x").hexdigest(),
    "kube-root-ca.crt configmap updated in 42 namespaces",
    "max_tokens=256 top_p=0.9 temperature=0.2",
    "cert-manager: Certificate api-tls is up to date and has not expired (renewal in 29d)",
    "OOMKilled: container api exceeded memory limit 512Mi (rss 530Mi)",
    "grpc: addrConn.createTransport failed to connect to {10.0.3.4:9000 <nil>}",
    "Slack thread https://acme.slack.com/archives/C0123ABCD/p1764496212000100",
    "base64 -d <<< aGVsbG8gd29ybGQ= prints hello world",
    "X-Request-Id: 1f0c2a9e-ff04-4e53-9c26-5b7f4e0b61c2\nX-RateLimit-Remaining: 42",
    "Cookie consent banner shown to 12% of sessions",
    "the key rotation for the cache_key namespace happens nightly",
    "authentication: webhook authenticator cache hit ratio 0.97",
    "npm WARN config always-auth This option has been deprecated",
]
for text in _PROSE:
    ok("ops_prose", text)


def write() -> tuple[int, int]:
    HERE.mkdir(parents=True, exist_ok=True)
    for name, rows in (("secrets.jsonl", _secrets), ("benign.jsonl", _benign)):
        with open(HERE / name, "w", encoding="utf-8") as out:
            for row in rows:
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
    return len(_secrets), len(_benign)


if __name__ == "__main__":
    secrets, benign = write()
    kinds = len({row["kind"] for row in _secrets})
    sys.stdout.write(
        f"wrote {secrets} secret entries of {kinds} kinds and {benign} benign entries to {HERE}\n"
    )
