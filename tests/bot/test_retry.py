"""The one retry policy (bot/retry.py): Retry-After parsing, backoff, failures vs rate limits."""

from __future__ import annotations

import random
from email.utils import formatdate

import pytest

from bot.config import RetrySettings
from bot.retry import (
    RetriesExhausted,
    RetryBudget,
    backoff_delay,
    parse_retry_after,
    retry_after_from_headers,
    until_deadline,
)


def test_retry_after_is_read_as_seconds_or_an_http_date_and_never_negative() -> None:
    assert parse_retry_after("30") == 30.0
    assert parse_retry_after("1.5") == 1.5
    assert parse_retry_after(["7"]) == 7.0
    now = 1_800_000_000.0
    assert parse_retry_after(formatdate(now + 12, usegmt=True), now=now) == pytest.approx(12.0)
    assert parse_retry_after(formatdate(now - 12, usegmt=True), now=now) == 0.0
    assert parse_retry_after("-3") == 0.0
    for unreadable in (None, "", "soon", "Wed, 99 Foo 2026"):
        assert parse_retry_after(unreadable) is None


def test_headers_give_retry_after_first_then_the_named_fallback_in_any_case() -> None:
    assert (
        retry_after_from_headers({"retry-after": "4", "X-Ratelimit-Reset": "9"}, "X-Ratelimit-Reset") == 4.0
    )
    assert retry_after_from_headers({"X-RateLimit-Reset": "9"}, "X-Ratelimit-Reset") == 9.0
    assert retry_after_from_headers({}, "X-Ratelimit-Reset") is None


def test_backoff_doubles_up_to_its_cap_with_jitter_in_the_upper_half() -> None:
    rng = random.Random(1)
    for attempt, cap in ((0, 0.5), (1, 1.0), (2, 2.0), (6, 30.0), (60, 30.0)):
        for _ in range(50):
            delay = backoff_delay(attempt, 0.5, 30.0, rng)
            assert cap / 2 <= delay <= cap


def test_failures_are_bounded_by_max_retries_and_rate_limits_are_not() -> None:
    clock = [0.0]
    budget = RetryBudget(
        RetrySettings(max_retries=2, initial_s=0.1, max_s=1, patience_s=60), clock=lambda: clock[0]
    )
    for _ in range(10):  # ten 429s in a row, well within the patience: all waits, none counted
        assert budget.after_rate_limit(1.0) >= 1.0
        clock[0] += 1.0
    budget.after_failure()
    budget.after_failure()
    with pytest.raises(RetriesExhausted) as gave_up:
        budget.after_failure("HTTP 503")
    assert gave_up.value.reason == "failures" and "after 2 retries" in str(gave_up.value)


def test_a_429_waits_at_least_what_the_server_asked_until_the_patience_is_spent() -> None:
    clock = [0.0]
    budget = RetryBudget(RetrySettings(patience_s=10), clock=lambda: clock[0])
    assert 3.0 < budget.after_rate_limit(3.0) < 3.3
    clock[0] = 8.0
    with pytest.raises(RetriesExhausted) as gave_up:
        budget.after_rate_limit(3.0, "ratelimited")
    assert gave_up.value.reason == "rate_limited" and "still rate limited after 8 s" in str(gave_up.value)


def test_a_reset_budget_starts_from_the_first_backoff_and_unset_max_retries_never_gives_up() -> None:
    budget = RetryBudget(RetrySettings(max_retries=None, initial_s=1, max_s=64), rng=random.Random(3))
    delays = [budget.after_failure() for _ in range(200)]
    assert max(delays) <= 64 and budget.failures == 200
    budget.reset()
    assert budget.after_failure() <= 1.0


def test_a_deadline_ends_retries_and_rate_limit_waits_that_would_start_after_it() -> None:
    now = [0.0]
    budget = RetryBudget(
        RetrySettings(max_retries=None, initial_s=1.0, max_s=8.0, deadline_s=10.0),
        rng=random.Random(1),
        clock=lambda: now[0],
    )
    assert budget.remaining_s() == 10.0
    waited = 0.0
    with pytest.raises(RetriesExhausted) as gave_up:
        while True:
            delay = budget.after_failure("HTTP 500")
            waited += delay
            now[0] = waited
    assert gave_up.value.reason == "failures" and "deadline 10 s" in str(gave_up.value)
    assert waited < 10.0 and budget.remaining_s() == pytest.approx(10.0 - waited)
    limited = RetryBudget(RetrySettings(deadline_s=5.0), clock=lambda: 0.0)
    with pytest.raises(RetriesExhausted) as throttled:
        limited.after_rate_limit(6.0)  # patience (300 s) would allow it; the deadline does not
    assert throttled.value.reason == "rate_limited"
    assert RetryBudget(RetrySettings()).remaining_s() is None  # no deadline: none left to count


def test_inside_until_deadline_failures_retry_until_the_deadline_not_max_retries() -> None:
    policy = RetrySettings(max_retries=1, initial_s=0.01, max_s=0.01, deadline_s=60.0)
    with until_deadline():
        budget = RetryBudget(policy, clock=lambda: 0.0)
    for _ in range(50):
        budget.after_failure()  # max_retries = 1 no longer applies
    outside = RetryBudget(policy)
    outside.after_failure()
    with pytest.raises(RetriesExhausted):
        outside.after_failure()
    with until_deadline():  # without a deadline the policy keeps its max_retries
        bounded = RetryBudget(RetrySettings(max_retries=0))
    with pytest.raises(RetriesExhausted):
        bounded.after_failure()
