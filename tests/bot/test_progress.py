"""The answer watchdog (bot/progress.py): no progress for ``stall_s`` ends the block with
``AnswerStalled``; platform calls that complete keep it alive; waits for the engine do not count;
somebody else's cancel (shutdown) stays a cancel."""

from __future__ import annotations

import asyncio
import time

import pytest

from bot.errors import AnswerStalled
from bot.progress import AnswerWatch, note_progress, waiting_for_engine


async def test_an_answer_with_no_progress_is_stopped_after_stall_s() -> None:
    started = time.monotonic()
    with pytest.raises(AnswerStalled, match="no progress for 0.2 s"):
        async with AnswerWatch(0.2):
            await asyncio.Event().wait()  # a wait that never ends (a hung call)
    assert 0.2 <= time.monotonic() - started < 0.6


async def test_completed_platform_calls_keep_an_answer_alive_also_from_its_own_tasks() -> None:
    async def call() -> None:  # a reply's edit, in a task the answer started
        await asyncio.sleep(0.05)
        note_progress()

    async with AnswerWatch(0.2) as watch:
        for _ in range(12):  # 0.6 s in all, 3 x stall_s, never 0.2 s without a completed call
            await asyncio.create_task(call())
    assert not watch.stalled
    note_progress()  # outside an answer: nothing to touch, no error


async def test_time_spent_waiting_for_the_engine_does_not_count() -> None:
    async with AnswerWatch(0.1) as watch:
        with waiting_for_engine():
            await asyncio.sleep(0.35)  # a long admission queue: the engine's own watchdog owns it
        await asyncio.sleep(0.05)  # then a short step of the answer's own
    assert not watch.stalled


async def test_a_shutdown_cancel_is_not_mistaken_for_a_stall() -> None:
    async def answer() -> None:
        async with AnswerWatch(5.0):
            await asyncio.sleep(10)

    task = asyncio.create_task(answer())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_no_stall_time_means_no_watchdog() -> None:
    async with AnswerWatch(None) as watch:
        await asyncio.sleep(0.05)
    assert not watch.stalled
