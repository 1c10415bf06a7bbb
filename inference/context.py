"""The request id of the work in progress, in a ``contextvars.ContextVar``.

The bot sets it where an event enters (:func:`request_scope` around handing a message to the
pipeline, so the answer's task inherits it); logging reads it for every line
(``bot.logs.RequestIdFilter``). It lives here, beside the engines, because an engine that moves a
request to a worker thread must carry the id across (:func:`run_in_request`), and ``inference/``
never imports ``bot/``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TypeVar

request_id_var: ContextVar[str | None] = ContextVar("opsbot_request_id", default=None)
"""The id of the request this code runs for (``None``: not inside a request)."""

_T = TypeVar("_T")


@contextlib.contextmanager
def request_scope(request_id: str | None) -> Iterator[None]:
    """Run the block (and every task it creates) as part of request ``request_id``."""
    token = request_id_var.set(request_id)
    try:
        yield
    finally:
        request_id_var.reset(token)


def run_in_request(request_id: str | None, fn: Callable[[], _T]) -> _T:
    """Call ``fn`` with ``request_id`` as the current request (worker threads start without one)."""
    with request_scope(request_id):
        return fn()
