"""The scorer on hand-written answers: right, wrong reason, wrong number, hallucinated object."""

from __future__ import annotations

from bot.eval.cases import Expectation
from bot.eval.scorer import contains_number, contains_word, hallucinated_objects, missing_from_context, score

CONTEXT = """payments/worker-6d5f7c9b8-kq2lp | Running | ready 1/1 | restarts 4 | node worker-1 |
problems: app OOMKilled | app last terminated OOMKilled exit code 137 at 2026-11-29T19:57:00Z
container app: image registry.example.com/app:1.0.0; limits {'cpu': '1', 'memory': '512Mi'}
memory {namespace="payments", pod="worker-6d5f7c9b8-kq2lp"}: min 256.0 MiB, max 512.0 MiB, last 512.0 MiB
why does worker-6d5f7c9b8-kq2lp in payments keep restarting?"""

EXPECT = Expectation(
    objects=[["worker-6d5f7c9b8-kq2lp"]],
    reasons=[["OOMKilled", "out of memory"]],
    numbers=[["512Mi"], ["137"]],
)


def test_a_right_answer_names_object_reason_and_exact_numbers_and_passes():
    answer = (
        "Pod worker-6d5f7c9b8-kq2lp was OOMKilled (exit code 137): its memory reached the 512Mi limit "
        "(max 512.0 MiB). Raise the limit or cut the 2Gi buffer."
    )
    result = score(answer, EXPECT, CONTEXT)
    assert result.object_named and result.reason_named and result.numbers_exact
    assert result.hallucinated == []
    assert result.passed is True
    assert [c.found for c in result.reasons] == ["OOMKilled"]


def test_a_wrong_reason_fails_only_the_reason():
    answer = "worker-6d5f7c9b8-kq2lp fails its readiness probe; limit 512Mi, exit code 137."
    result = score(answer, EXPECT, CONTEXT)
    assert result.object_named is True and result.numbers_exact is True
    assert result.reason_named is False
    assert result.passed is False


def test_a_wrong_number_is_not_exact_and_near_misses_do_not_count():
    answer = "worker-6d5f7c9b8-kq2lp was OOMKilled at its 1512Mi limit with exit code 1370."
    result = score(answer, EXPECT, CONTEXT)
    assert result.reason_named is True
    assert result.numbers_exact is False
    assert [c.ok for c in result.numbers] == [False, False]
    assert not contains_number("exit code 13.7", "137")
    assert contains_number("exit code 137.", "137")
    assert contains_number("limit (512Mi)", "512Mi")


def test_an_invented_pod_or_node_is_counted_as_hallucinated():
    answer = (
        "worker-6d5f7c9b8-kq2lp is OOMKilled (512Mi, exit 137) because pod cache-7d9f8c6b5-zz9qq on "
        "node worker-7 takes the memory; also check deployment/billing-api."
    )
    result = score(answer, EXPECT, CONTEXT)
    assert result.hallucinated == ["cache-7d9f8c6b5-zz9qq", "worker-7", "billing-api"]
    assert result.passed is False
    # Names the context holds are not hallucinated, and ordinary hyphenated words are no objects.
    assert hallucinated_objects("node worker-1 is fine, the crash-looping stopped, UTF-8 logs", CONTEXT) == []
    # A name the token limit cut short at the very end is not an invention; the same inside is.
    assert hallucinated_objects("the pod worker-6d5f7", CONTEXT) == []
    assert hallucinated_objects("the pod worker-6d5f7 is broken", CONTEXT) == ["worker-6d5f7"]


def test_object_names_are_whole_words_and_case_insensitive():
    assert contains_word("deployment API is down", "api")
    assert not contains_word("the rapid growth", "api")
    assert not contains_word("api-7f9c8d6b5-x2x9q restarts", "api")
    assert contains_word("payments/api is degraded", "api")


def test_no_expectation_is_neither_passed_nor_failed():
    result = score("anything at all", Expectation(), CONTEXT)
    assert result.passed is None and result.object_named is None


def test_a_case_asking_for_numbers_the_prompt_never_showed_is_reported():
    expect = Expectation(objects=[["worker-6d5f7c9b8-kq2lp"]], numbers=[["768Mi"], ["137"]])
    assert missing_from_context(expect, CONTEXT) == ["768Mi"]


QUESTION = "why does worker-6d5f7c9b8-kq2lp in payments keep restarting?"


def test_an_answer_that_only_echoes_the_question_is_failed_and_credited_with_nothing():
    answer = f'<<<DATA id=ab12cd34 label="chat message">>>\n{QUESTION}\n<<<END DATA id=ab12cd34>>>>>'
    result = score(answer, EXPECT, CONTEXT, question=QUESTION)
    assert result.failure == "echoed the prompt"
    assert result.object_named is False and result.passed is False
    assert score("<<<END DATA id=ab12cd34>>>", EXPECT, CONTEXT, question=QUESTION).failure == "empty"


def test_a_name_found_only_in_the_copied_question_is_not_credited():
    answer = f"You asked: {QUESTION} The container was OOMKilled with exit code 137 at 512Mi."
    result = score(answer, EXPECT, CONTEXT, question=QUESTION)
    assert result.failure is None and result.reason_named is True and result.numbers_exact is True
    assert result.object_named is False  # the pod's name is there only inside the echoed question
    own = "worker-6d5f7c9b8-kq2lp was OOMKilled (exit code 137) at its 512Mi limit."
    assert score(own, EXPECT, CONTEXT, question=QUESTION).passed is True


def test_the_report_counts_echoed_and_empty_answers_as_failed_and_says_so():
    from bot.eval.report import summary_line, totals
    from bot.eval.runner import CaseResult

    answers = {
        "echo": f'<<<DATA id=ab12cd34 label="chat message">>>\n{QUESTION}\n<<<END DATA id=ab12cd34>>>',
        "empty": "<<<END DATA id=ab12cd34>>>",
        "own": "worker-6d5f7c9b8-kq2lp was OOMKilled (exit code 137) at its 512Mi limit.",
    }
    results = [
        CaseResult(
            name, name, "test", "root_cause", "ok", answer=text, score=score(text, EXPECT, CONTEXT, QUESTION)
        )
        for name, text in answers.items()
    ]
    t = totals(results)
    assert (t["echoed"], t["empty"], t["passed"]) == (1, 1, {"hits": 1, "of": 3})
    report = {"totals": t, "engine": {"backend": "llamacpp", "model": "smol"}, "wall_s": 1.0}
    assert "passed 1/3 (1 echoed the prompt, 1 empty)" in summary_line(report)
