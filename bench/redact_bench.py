"""Redaction's cost on the hot path: a 2 KB context section and a streamed answer.

The gatherer redacts every context section (``redact(section.body)``) and the pipeline redacts a
streamed answer's growing text about five times a second (``count_secrets``), then the final text
once (``redact``). This bench times exactly those calls on fixed texts without secrets (what nearly
every request carries; one section is full of secret-like words, "token expired", "secret not
found", so every rule that needs such a word runs), so two versions of ``bot.redact`` compare on
the same work:

    python bench/redact_bench.py --label base --out bench/results
    PYTHONPATH=/tmp/redact-base python bench/redact_bench.py --label base   # another checkout's module

Each case is timed ``--repeats`` times over ``--loops`` calls; the median microseconds per call is
the figure (min and max show the spread). The "clean text" memory of ``redact`` is emptied before
each call so every call is a full pass, as the first pass over a new section or answer is.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_meta import cpu_model, git_commit, package_versions, run_meta, write_results  # noqa: E402

_EVENTS = [
    "2026-12-04T10:{m:02d}:03Z payments pod/payments-api-7d9f8b6c5-x2x9k BackOff x{n}: Back-off "
    "restarting failed container api in pod payments-api-7d9f8b6c5-x2x9k_payments(3f2b9c1e-8a4d-4e1f-9c2a-"
    "5b7d0e6f1a2c)",
    "2026-12-04T10:{m:02d}:17Z payments pod/payments-worker-5c6d7-qq8zt Unhealthy x{n}: Readiness probe "
    'failed: Get "http://10.42.3.17:8080/healthz": context deadline exceeded (Client.Timeout exceeded '
    "while awaiting headers)",
    "2026-12-04T10:{m:02d}:41Z payments deployment/payments-api ScalingReplicaSet: Scaled up replica set "
    "payments-api-7d9f8b6c5 to 3 from 2",
    "2026-12-04T10:{m:02d}:52Z ingress-nginx pod/ingress-nginx-controller-6b9d8-lx7pk Unhealthy x{n}: "
    "Liveness probe failed: HTTP probe failed with statuscode: 503",
]
_LOGS = [
    'ts=2026-12-04T10:{m:02d}:01.331Z level=error caller=client.go:212 msg="request failed" '
    'component=ledger err="dial tcp 10.42.7.9:5432: connect: connection refused" attempt={n} '
    "trace_id=4bf92f3577b34da6a3ce929d0e0e4736 span_id=00f067aa0ba902b7",
    '{{"time":"2026-12-04T10:{m:02d}:02.118Z","level":"warn","logger":"payments.retry","msg":"retrying '
    'charge","order_id":"ord_{n}81723","attempt":{n},"backoff_ms":250,"upstream":"ledger:8443"}}',
    "2026-12-04 10:{m:02d}:03,402 ERROR [http-nio-8080-exec-{n}] c.e.p.LedgerClient - POST "
    "https://ledger.payments.svc:8443/v1/entries returned 503 Service Unavailable after 1200 ms",
    "I1204 10:{m:02d}:04.771{n}  1 reflector.go:359] Listing and watching *v1.Pod from "
    "k8s.io/client-go/informers/factory.go:160",
]
_WORDS = [
    # no secret, but the words that make every name- and prose-based rule run
    "2026-12-04T10:{m:02d}:08Z payments pod/payments-api-7d9f8b6c5-x2x9k FailedMount x{n}: MountVolume.SetUp "
    'failed for volume "db-creds" : secret "db-creds" not found',
    'ts=2026-12-04T10:{m:02d}:09.120Z level=warn msg="token refresh failed" err="oauth2: token expired" '
    "client=ledger attempt={n} auth_method=oidc",
    '{{"time":"2026-12-04T10:{m:02d}:10Z","level":"error","msg":"password authentication failed for user '
    '\\"app\\"","db":"ledger","retry_in_ms":500,"key_id":"kms-{n}"}}',
    "  env: DB_PASSWORD from secretKeyRef payments-db/password, API_TOKEN from secretKeyRef api-tokens/token",
]
_ANSWER = (
    "**What is happening:** `payments-api` pods in `payments` are in CrashLoopBackOff since 10:12 UTC "
    "(14 restarts in 20 minutes). The log tail shows `dial tcp 10.42.7.9:5432: connect: connection "
    "refused`: the API cannot reach its Postgres primary.\n\n"
    "**Likely cause:** the `ledger-db-0` StatefulSet pod was rescheduled at 10:11 (node "
    "`ip-10-42-7-9` went NotReady: disk pressure), and its PVC is still attaching, so port 5432 is "
    "closed. The readiness probe failures on `payments-worker` (`context deadline exceeded`) follow "
    "from the same outage.\n\n"
    "**Next steps:**\n"
    "1. Check the volume: `kubectl -n payments describe pvc data-ledger-db-0` and look for "
    "`FailedAttachVolume` events.\n"
    "2. Check the node: `kubectl describe node ip-10-42-7-9`; if disk pressure persists, cordon it "
    "and let the pod move.\n"
    "3. Once `ledger-db-0` is Ready, the API pods recover on their own (back-off is at most 5 min); "
    "to hurry it, `kubectl -n payments rollout restart deployment/payments-api`.\n"
    '4. Watch error rate: `sum(rate(http_requests_total{job="payments-api",code=~"5.."}[5m]))` '
    "should fall to 0 within minutes.\n\n"
    "Runbook: https://runbooks.internal/payments/ledger-db-down (image "
    "registry.internal/payments-api@sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08, "
    "commit 3f2b9c1e8a4d4e1f9c2a5b7d0e6f1a2c3b4d5e6f)."
)
_STREAM_EVERY = 80
"""Characters between two passes over the growing answer (about 5 passes a second at GPU pace)."""


def _section(lines: list[str], size: int = 2048) -> str:
    """Lines of the given shapes, numbered, until the text is ``size`` characters."""
    out: list[str] = []
    n = 0
    while sum(len(line) + 1 for line in out) < size:
        out.append(lines[n % len(lines)].format(m=n % 60, n=n + 2))
        n += 1
    return "\n".join(out)[:size]


def cases() -> dict[str, Callable[[], object]]:
    """The timed calls, by name, on fixed texts (the same for every version of the module)."""
    from bot import redact as module

    def fresh() -> None:
        clean = getattr(module, "_clean", None)
        if isinstance(clean, dict):
            clean.clear()

    events, logs, words = _section(_EVENTS), _section(_LOGS), _section(_WORDS)
    prefixes = [_ANSWER[:end] for end in range(_STREAM_EVERY, len(_ANSWER), _STREAM_EVERY)]

    def section(text: str) -> Callable[[], object]:
        def run() -> object:
            fresh()
            return module.redact(text, where="context")

        return run

    def stream() -> object:
        for prefix in prefixes:
            module.count_secrets(prefix)
        fresh()
        return module.redact(_ANSWER)

    return {
        "context_events_2kb": section(events),
        "context_logs_2kb": section(logs),
        "context_secret_words_2kb": section(words),
        "stream_answer": stream,
    }


def measure(run: Callable[[], object], loops: int, repeats: int) -> dict[str, float]:
    """Median, min and max microseconds per call over ``repeats`` timings of ``loops`` calls."""
    run()  # compiles lazily built patterns, warms caches
    per_call = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(loops):
            run()
        per_call.append((time.perf_counter() - start) / loops * 1e6)
    return {"median_us": statistics.median(per_call), "min_us": min(per_call), "max_us": max(per_call)}


def main(argv: list[str] | None = None) -> int:
    """Time every case; print a table; with ``--out``, write ``redact_bench-DATE-LABEL.{json,md}``."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--label", default="run", help="name of this run in the output files")
    parser.add_argument("--loops", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", type=Path, help="folder for the result files (none: print only)")
    args = parser.parse_args(argv)
    import bot.redact

    meta = run_meta([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    meta.update(package_versions("bot"))
    meta["module"] = str(Path(bot.redact.__file__).resolve())
    meta["commit"] = git_commit(Path(bot.redact.__file__).resolve().parent)
    meta["cpu"] = cpu_model()
    results = {name: measure(run, args.loops, args.repeats) for name, run in cases().items()}
    lines = [
        f"# redact_bench {args.label}",
        "",
        *(f"- {key}: {value}" for key, value in meta.items()),
        "",
        "| case | median us | min us | max us |",
        "|---|---|---|---|",
        *(
            f"| {name} | {r['median_us']:.1f} | {r['min_us']:.1f} | {r['max_us']:.1f} |"
            for name, r in results.items()
        ),
    ]
    print("\n".join(lines))
    if args.out:
        write_results(
            args.out / f"redact_bench-{meta['date'][:10]}-{args.label}",
            {"meta": meta, "results": results},
            lines,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
