"""App-wide rate budgets (bot/adapters/ratelimit.py): buckets, fair sharing, holds, deadlines."""

from __future__ import annotations

import asyncio
import time

import pytest

from bot.adapters.ratelimit import BudgetStalled, BudgetTimeout, Priority, RateBudget, Ticket, prepaid
from bot.config import RateLimit


async def _calls(budget: RateBudget, method: str, n: int, **kw: object) -> list[float]:
    starts: list[float] = []

    async def one() -> None:
        async with budget.slot(method, **kw):  # type: ignore[arg-type]
            starts.append(time.monotonic())

    await asyncio.gather(*(one() for _ in range(n)))
    return sorted(starts)


async def test_a_burst_goes_at_once_and_the_rest_refills_so_no_window_exceeds_the_limit() -> None:
    # 600/min with a burst of 5: the other 595 of each minute refill one every ~0.1 s
    budget = RateBudget({"chat.update": RateLimit(per_minute=600, burst=5)})
    starts = await _calls(budget, "chat.update", 20)
    refill = 60 / 595
    assert starts[4] - starts[0] < refill  # the burst, before the first refill
    assert (starts[-1] - starts[4]) / 15 >= refill * 0.95  # then one per refill interval
    # scaled window check: within any 1 s at most burst + 1 s of refill (+1 for event-loop jitter)
    assert max(sum(1 for t in starts if s <= t < s + 1.0) for s in starts) <= 5 + 10 + 1


async def test_a_call_in_flight_holds_its_token_until_it_completes() -> None:
    budget = RateBudget({"m": RateLimit(per_minute=120, burst=1)})  # one at a time, 0.5 s apart
    order: list[str] = []

    async def slow() -> None:
        async with budget.slot("m"):
            order.append("slow starts")
            await asyncio.sleep(0.3)
            order.append("slow ends")

    async def quick() -> None:
        await asyncio.sleep(0.01)
        async with budget.slot("m"):
            order.append("quick starts")

    t0 = time.monotonic()
    await asyncio.gather(slow(), quick())
    assert order == ["slow starts", "slow ends", "quick starts"]
    # the refill counts from the completion (0.3 s), not from the start
    assert time.monotonic() - t0 >= 0.3 + 60 / 119 * 0.95


async def test_a_final_edit_goes_first_then_the_stream_that_waited_longest() -> None:
    budget = RateBudget({"chat.update": RateLimit(per_minute=600, burst=1)})
    served: list[str] = []
    blocker = await budget.acquire("chat.update")  # the bucket is busy while the others queue

    async def ask(name: str, ticket: Ticket) -> None:
        async with budget.slot("chat.update", ticket=ticket):
            served.append(name)

    now = time.monotonic()
    tasks = [
        asyncio.create_task(ask("recent stream", Ticket(Priority.STREAM, now - 1))),
        asyncio.create_task(ask("old stream", Ticket(Priority.STREAM, now - 9))),
        asyncio.create_task(ask("final", Ticket(Priority.FINAL))),
        asyncio.create_task(ask("housekeeping", Ticket(Priority.BACKGROUND, now - 60))),
    ]
    await asyncio.sleep(0.05)
    blocker.release()
    await asyncio.gather(*tasks)
    assert served == ["final", "old stream", "recent stream", "housekeeping"]


async def test_a_hold_stops_one_method_everywhere_and_nothing_else() -> None:
    budget = RateBudget(channel_limits={"chat.postMessage": (0.0, 1)})
    budget.hold("chat.update", 0.3)
    t0 = time.monotonic()
    others = await _calls(budget, "reactions.add", 3)
    held = await _calls(budget, "chat.update", 2, channel="C9")
    assert others[-1] - t0 < 0.1
    assert held[0] - t0 >= 0.3


async def test_an_all_calls_hold_stops_every_method() -> None:
    budget = RateBudget({"*": RateLimit(per_minute=6000, burst=50)})
    budget.hold("*", 0.2)
    t0 = time.monotonic()
    starts = await _calls(budget, "POST /reactions", 1)
    assert starts[0] - t0 >= 0.2


async def test_a_waiter_that_gets_no_slot_in_time_leaves_empty_handed_and_blocks_nobody() -> None:
    budget = RateBudget({"reactions.add": RateLimit(per_minute=2, burst=1)})
    first = await budget.acquire("reactions.add")
    first.release()
    with pytest.raises(BudgetTimeout):
        await budget.acquire("reactions.add", max_wait_s=0.1)
    assert budget.waiting() == 0


async def test_a_cancelled_waiter_is_forgotten() -> None:
    budget = RateBudget({"m": RateLimit(per_minute=2, burst=1)})
    (await budget.acquire("m")).release()
    task = asyncio.create_task(budget.acquire("m"))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert budget.waiting() == 0


async def test_a_busy_channel_does_not_hold_up_the_others() -> None:
    budget = RateBudget(channel_limits={"chat.postMessage": (0.5, 1)})
    t0 = time.monotonic()
    busy = asyncio.create_task(_calls(budget, "chat.postMessage", 3, channel="C1"))
    quiet = await _calls(budget, "chat.postMessage", 1, channel="C2")
    assert quiet[0] - t0 < 0.1
    starts = await busy
    assert starts[-1] - starts[0] >= 2 * 0.5 * 0.95


async def test_turned_off_budgets_let_everything_through_but_still_honour_retry_after() -> None:
    budget = RateBudget({"chat.update": RateLimit(per_minute=2, burst=1)}, enabled=False)
    t0 = time.monotonic()
    await _calls(budget, "chat.update", 10)
    assert time.monotonic() - t0 < 0.1
    budget.hold("chat.update", 0.2)
    starts = await _calls(budget, "chat.update", 1)
    assert starts[0] - t0 >= 0.2


async def test_spare_counts_waiters_and_promised_calls() -> None:
    budget = RateBudget({"chat.update": RateLimit(per_minute=60, burst=3)})
    assert budget.spare("chat.update") == 3
    budget.reserve("chat.update")
    assert budget.spare("chat.update") == 2
    permit = await budget.acquire("chat.update")
    assert budget.spare("chat.update") == 1
    budget.unreserve("chat.update")
    permit.release()
    assert budget.spare("chat.update") == 2  # the used token refills over the minute
    assert budget.spare("unbudgeted.method") > 1000


async def test_a_prepaid_permit_is_used_once_for_its_method() -> None:
    budget = RateBudget({"m": RateLimit(per_minute=60, burst=1), "other": RateLimit(per_minute=60, burst=2)})
    permit = await budget.acquire("m")
    with prepaid(permit):
        other = await budget.acquire("other")
        assert other is not permit
        assert await budget.acquire("m") is permit  # spent: the call's first try
        with pytest.raises(BudgetTimeout):  # a retry queues again (the bucket's burst is used up)
            await budget.acquire("m", max_wait_s=0.05)
    other.release()
    permit.release()


def _problems(kind: str) -> float:
    from prometheus_client import REGISTRY

    return (
        REGISTRY.get_sample_value("opsbot_rate_budget_problems_total", {"budget": "test", "kind": kind})
        or 0.0
    )


async def test_a_wait_whose_full_bucket_never_frees_fails_as_stalled_and_is_reported_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    budget = RateBudget(
        channel_limits={"post": (0.01, 2)}, name="test", stall_after_s=0.2
    )  # a burst of 2 per channel
    held = [await budget.acquire("post", "C1") for _ in range(2)]  # never released: a bug
    before = _problems("stalled")
    started = time.monotonic()
    with pytest.raises(BudgetStalled):
        await budget.acquire("post", "C1")
    assert 0.2 <= time.monotonic() - started < 1.0  # failed, not hung
    with pytest.raises(BudgetStalled):  # a later wait gets its own stall time, then fails too
        await budget.acquire("post", "C1")
    assert budget.stalled == 2 and _problems("stalled") == before + 2
    assert len([r for r in caplog.records if r.levelname == "ERROR" and "cannot come" in r.getMessage()]) == 1
    other = await budget.acquire("post", "C2")  # other channels were never blocked
    for permit in (*held, other):
        permit.release()
    (await budget.acquire("post", "C1")).release()  # released: the channel works again


async def test_a_bucket_full_of_calls_that_complete_is_no_stall() -> None:
    budget = RateBudget(channel_limits={"post": (0.01, 1)}, name="test", stall_after_s=0.15)

    async def call() -> None:
        async with budget.slot("post", "C1"):
            await asyncio.sleep(0.05)  # each call completes well within the stall time

    await asyncio.gather(*(call() for _ in range(10)))  # ten calls in a row take ~0.5 s in all
    assert budget.stalled == 0


async def test_waiting_while_holding_an_unspent_permit_of_the_same_bucket_is_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    budget = RateBudget({"*": RateLimit(per_minute=600, burst=5)}, name="test")
    before = _problems("wait_while_holding")
    permit = await budget.acquire("POST /posts")
    with prepaid(permit):
        (await budget.acquire("GET /users/me")).release()  # another method on the same "*" bucket
        assert await budget.acquire("POST /posts") is permit  # the passed permit pays, no report
    permit.release()
    assert _problems("wait_while_holding") == before + 1
    assert any("unspent POST /posts permit" in r.getMessage() for r in caplog.records)
