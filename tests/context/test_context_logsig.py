"""Logs by signature: the decisive lines of a log survive whatever their position, repeats fold."""

from __future__ import annotations

from bot.context.logsig import CONTEXT, DECISIVE, ERROR, FILLER, condense, error_lines, signature


def _ranks(text: str, ending: int = CONTEXT) -> dict[str, int]:
    return {line.text: line.rank for line in condense(text, ending)}


def test_the_root_caused_by_above_a_long_stack_is_decisive_and_the_frames_are_filler():
    stack = [
        "ERROR Application run failed",
        "org.example.BeanCreationException: Error creating bean 'dataSource'",
        *(f"\tat org.example.Frame{i}.call(Frame.java:{i})" for i in range(60)),
        'Caused by: org.postgresql.util.PSQLException: FATAL: database "orders_v2" does not exist',
        *(f"\tat org.postgresql.Conn{i}.open(Conn.java:{i})" for i in range(60)),
        "\t... 55 common frames omitted",
    ]
    lines = condense("\n".join(stack))
    ranks = {ln.text.split(" [x")[0]: ln.rank for ln in lines}
    assert ranks["org.example.BeanCreationException: Error creating bean 'dataSource'"] == DECISIVE
    assert (
        ranks['Caused by: org.postgresql.util.PSQLException: FATAL: database "orders_v2" does not exist']
        == DECISIVE
    )
    assert ranks["\tat org.example.Frame0.call(Frame.java:0)"] == CONTEXT  # the first frames say where
    # 120 frames of one shape fold into a few lines: the log is short, the decisive lines whole.
    assert len(lines) < 10 and any("[x" in ln.text for ln in lines)


def test_a_go_fatal_error_keeps_its_first_goroutine_and_not_the_others():
    dump = ["level=info msg=ok", "fatal error: concurrent map writes", "", "goroutine 1873 [running]:"]
    dump += ["main.(*Cache).Put(0xc0001b6000)", "\t/src/cache.go:57 +0x1c4", ""]
    for g in range(40):
        dump += [
            f"goroutine {1900 + g} [select]:",
            "main.(*Worker).run()",
            f"\t/src/worker.go:{80 + g % 3} +0x11e",
            "",
        ]
    ranks = _ranks("\n".join(dump))
    assert ranks["fatal error: concurrent map writes"] == DECISIVE
    assert ranks["\t/src/cache.go:57 +0x1c4"] == DECISIVE
    # The other goroutines fold into one line, ranked no better than how the log ended.
    assert ranks["goroutine 1900 [select]: [x40 similar]"] >= CONTEXT


def test_a_python_traceback_keeps_its_exception_line_and_last_frames():
    log = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "/usr/lib/flask/app.py", line 1511, in wsgi_app',
            "    response = self.full_dispatch_request()",
            '  File "/app/accounts.py", line 73, in create_account',
            "    tenant = resolve_tenant(form.email)",
            '  File "/app/tenants.py", line 88, in resolve_tenant',
            "    return TENANTS[domain]",
            "KeyError: 'acme-eu.example.com'",
            *(f"GET /healthz 200 {i}" for i in range(100)),
        ]
    )
    ranks = _ranks(log)
    assert ranks["KeyError: 'acme-eu.example.com'"] == DECISIVE
    assert ranks['  File "/app/tenants.py", line 88, in resolve_tenant'] == ERROR
    assert ranks['  File "/usr/lib/flask/app.py", line 1511, in wsgi_app'] == FILLER


def test_one_error_among_hundreds_of_repeated_warnings_is_one_line_of_two_and_outranks_them():
    lines = [f"2026-11-29T19:{i // 60:02d}:{i % 60:02d}Z WARN queue full (size=10000)" for i in range(300)]
    lines.insert(40, "2026-11-29T19:00:40Z ERROR smtp: 535 5.7.8 Authentication credentials invalid")
    condensed = condense("\n".join(lines))
    assert [ln.rank for ln in condensed] == [CONTEXT, ERROR]
    assert condensed[0].text.endswith("[x300 similar, last 2026-11-29T19:04:59Z]")
    assert error_lines(condensed) == [
        "2026-11-29T19:00:40Z ERROR smtp: 535 5.7.8 Authentication credentials invalid"
    ]


def test_tls_dns_and_connection_errors_are_decisive_info_lines_are_filler():
    ranks = _ranks(
        "INFO started\n"
        "dial tcp: lookup db on 10.96.0.10:53: no such host\n"
        "x509: certificate has expired or is not yet valid\n"
        "connect: connection refused\n"
        "INFO handled 1\nINFO handled 2\nINFO handled 3\nINFO handled 4"
    )
    assert ranks["INFO started"] == FILLER
    assert {ranks[k] for k in ranks if "INFO" not in k} == {DECISIVE}


def test_what_a_container_did_before_its_oom_kill_is_decisive():
    assert _ranks("processing batch 4411\nallocating 2Gi buffer", ending=DECISIVE) == {
        "processing batch 4411": DECISIVE,
        "allocating 2Gi buffer": DECISIVE,
    }
    assert _ranks("a\nb\nc\nd\ne")["a"] == FILLER and _ranks("a\nb\nc\nd\ne")["e"] == CONTEXT


def test_identical_replicas_have_one_signature_whatever_their_times_and_ids():
    one = condense("2026-11-29T19:58:01Z ERROR refund 51005 failed: x509: expired\nINFO ok 1")
    two = condense("2026-11-29T19:59:44Z ERROR refund 77310 failed: x509: expired\nINFO ok 9")
    other = condense("2026-11-29T19:59:44Z ERROR refund 77310 failed: connection refused")
    assert signature(one) == signature(two) != signature(other)
