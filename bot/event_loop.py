"""The event loop every ``opsbot`` command runs on: uvloop where it is installed, else asyncio's own.

One loop carries the whole bot: the platforms' sockets, the store, the context sources, the
admission queue and (with the vLLM engine) vLLM's front end. Under a burst each request's work
before the engine sees it waits behind every other request's, so the loop's own cost per callback
and per socket read is paid on the path to the first token. uvloop (libuv, what ``vllm serve``
runs on) does that scheduling and socket work in C; ``bench/e2e_bench.py --event-loop`` measures
the difference end to end. ``event_loop = "asyncio"`` keeps the standard loop (a debugger or a
profiler that wants pure-Python frames, a platform without uvloop).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

from bot.errors import OpsbotError

logger = logging.getLogger(__name__)

EventLoopChoice = Literal["auto", "uvloop", "asyncio"]
"""``auto``: uvloop when it can be imported, else asyncio; ``uvloop``: uvloop or a clear error."""

T = TypeVar("T")


class EventLoopUnavailable(OpsbotError, RuntimeError):
    """``event_loop = "uvloop"`` on a machine without uvloop."""


def uvloop_available() -> bool:
    """Whether uvloop can be imported here (it is a Linux / macOS dependency of opsbot and vLLM)."""
    return importlib.util.find_spec("uvloop") is not None


def resolve(choice: EventLoopChoice) -> Literal["uvloop", "asyncio"]:
    """The loop ``choice`` stands for on this machine."""
    if choice == "asyncio":
        return "asyncio"
    if uvloop_available():
        return "uvloop"
    if choice == "uvloop":
        raise EventLoopUnavailable(
            "event_loop = 'uvloop' but uvloop is not installed (pip install uvloop, or set "
            "event_loop = 'asyncio')"
        )
    return "asyncio"


def loop_factory(choice: EventLoopChoice) -> Callable[[], asyncio.AbstractEventLoop]:
    """A function that makes a new loop of the kind ``choice`` resolves to."""
    if resolve(choice) == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def run(main: Coroutine[Any, Any, T], choice: EventLoopChoice = "auto") -> T:
    """``asyncio.run(main)`` on the loop ``choice`` resolves to (``asyncio.Runner`` keeps the
    standard run's clean-up: cancel what is left, shut down async generators and the executor)."""
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return runner.run(main)


def running_loop_name() -> str:
    """``uvloop`` or ``asyncio``: what the running loop is (for logs, ``opsbot status`` and bench
    metadata)."""
    loop = asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


async def stop_task(task: asyncio.Future[Any] | None) -> None:
    """Cancel ``task`` (a background loop: a sweeper, a supervisor, an edit loop) and wait until it
    has ended, so nothing it does outlives its owner's stop. ``None`` or a finished task is fine."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
