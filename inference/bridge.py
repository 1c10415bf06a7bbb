"""One engine, several bot processes: the engine host's side and the workers' side of a local socket.

Why: one Python process runs one event loop on one core, and under an incident burst that loop, not
the GPU, is what a mention waits for (the platform calls, the database, the prompt of every other
mention). ``opsbot run`` with ``workers = N`` keeps the engine (with its admission controller and
lanes) in one process, the *engine host*, and runs the chat adapters and the pipeline in N worker
processes that reach it through this bridge; the prompt is rendered to token ids in the worker, so
the host only schedules, generates and detokenizes.

Wire: a Unix socket that only the host's user can open (its folder is ``0700``); each frame is a
4-byte big-endian length and a pickle (both ends are the same program, started by the host).

- worker -> host: ``("gen", rid, engine, GenerationRequest)``, ``("close", rid)`` (the worker
  stopped reading: the host cancels the generation, which aborts it in the engine),
  ``("abort", request_id)`` (:meth:`Engine.abort`).
- host -> worker: ``("hello", info)`` once (engine names, routes, models, tokenizers, a snapshot),
  then ``("batch", [message, ...])`` frames, one per event-loop turn, holding ``("text", rid, str)``
  (new text; consecutive pieces of one generation within a turn are joined), ``("ev", rid,
  GenerationResult)``, ``("err", rid, error)`` (an ``EngineError``, rebuilt on the worker's side as
  the same class with the same fields), ``("end", rid)``, and ``("snap", snapshot)`` every
  ``SNAPSHOT_EVERY_S`` (each engine's health and stats, so a worker's ``/readyz``, ``/metrics`` and
  ``/rca status`` read the host's engine without a round trip).

When the host goes away every generation in flight fails with :class:`EngineDeadError` and the
workers' engines report not ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import pickle
import struct
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inference import engine as engine_module
from inference.engine import (
    ChatMessage,
    ChatTokenizer,
    Engine,
    EngineDeadError,
    EngineError,
    EngineGenerateError,
    EngineHealth,
    EngineStats,
    GenerationEvent,
    GenerationRequest,
    TextDelta,
)
from inference.engine_set import EngineSet

logger = logging.getLogger(__name__)

SNAPSHOT_EVERY_S = 0.25
"""How often the host pushes each engine's health and stats to every worker."""
_HEADER = struct.Struct(">I")
_MAX_FRAME = 64 * 1024 * 1024


def _frame(message: tuple[Any, ...]) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


async def _read_frame(reader: asyncio.StreamReader) -> tuple[Any, ...]:
    (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    if size > _MAX_FRAME:
        raise ValueError(f"bridge frame of {size} bytes (more than {_MAX_FRAME})")
    message = pickle.loads(await reader.readexactly(size))
    if not isinstance(message, tuple) or not message:
        raise ValueError(f"bridge frame is not a message: {type(message).__name__}")
    return message


def _error_state(exc: BaseException) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """An engine error as (class name, args, fields): rebuilt as the same class on the other side,
    without calling its ``__init__`` (whose signature may differ from its ``args``)."""
    if isinstance(exc, EngineError) and getattr(engine_module, type(exc).__name__, None) is type(exc):
        return type(exc).__name__, exc.args, dict(vars(exc))
    return EngineGenerateError.__name__, (f"{type(exc).__name__}: {exc}",), {}


def _rebuild_error(state: tuple[str, tuple[Any, ...], dict[str, Any]]) -> EngineError:
    name, args, fields = state
    cls = getattr(engine_module, name, None)
    if not (isinstance(cls, type) and issubclass(cls, EngineError)):
        cls = EngineGenerateError
    error = cls.__new__(cls)
    error.args = tuple(args)
    error.__dict__.update(fields)
    return error


class _Outbox:
    """Messages to one peer, sent together once per event-loop turn as one ``batch`` frame: the
    engine hands over the outputs of a whole batch step at once, and one pickle and one write per
    step instead of one per request saves the host's loop (the busiest one under a burst) a
    serialisation and a system call for each of them. Text for a generation that already has text
    waiting in this turn is joined to it."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self._messages: list[Any] = []
        self._text_at: dict[int, int] = {}
        """Where each generation's waiting text is in ``_messages`` (joined, not appended)."""

    def send(self, message: tuple[Any, ...]) -> None:
        if not self._messages:
            asyncio.get_running_loop().call_soon(self._flush)
        self._messages.append(message)

    def send_text(self, rid: int, text: str) -> None:
        """New text of generation ``rid`` (joined to its text already waiting in this turn)."""
        at = self._text_at.get(rid)
        if at is not None:
            _, _, waiting = self._messages[at]
            self._messages[at] = ("text", rid, waiting + text)
            return
        self._text_at[rid] = len(self._messages)
        self.send(("text", rid, text))

    def _flush(self) -> None:
        messages, self._messages = self._messages, []
        self._text_at.clear()
        if messages and not self.writer.is_closing():
            self.writer.write(_frame(("batch", messages)))


def _snapshot(engines: EngineSet) -> dict[str, tuple[EngineHealth, EngineStats]]:
    return {name: (engine.health(), engine.stats()) for name, engine in engines.items()}


class BridgeServer:
    """The engine host's end: serves ``engines`` (already started) to workers on ``path``."""

    def __init__(self, engines: EngineSet, models: Mapping[str, str], path: str) -> None:
        self.engines = engines
        self.models = dict(models)
        self.path = path
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.generations = 0
        """Generations served since start (for logs and tests)."""

    async def start(self) -> None:
        """Listen on ``path`` (the caller owns its folder and removes it)."""
        self._server = await asyncio.start_unix_server(self._serve, path=self.path)

    async def close(self) -> None:
        """Stop listening and cancel every connection (and so every generation it runs)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    def hello(self) -> dict[str, Any]:
        """What a worker needs to build its engine set and prompt builders."""
        return {
            "default": self.engines.default,
            "names": self.engines.names,
            "routes": self.engines.routes,
            "models": self.models,
            "backends": {name: engine.backend for name, engine in self.engines.items()},
            "tokenizers": {name: engine.tokenizer for name, engine in self.engines.items()},
            "snapshot": _snapshot(self.engines),
        }

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        running: dict[int, asyncio.Task[None]] = {}
        pusher: asyncio.Task[None] | None = None
        outbox = _Outbox(writer)
        try:
            writer.write(_frame(("hello", self.hello())))
            pusher = asyncio.create_task(self._push_snapshots(outbox), name="bridge-snapshots")
            while True:
                try:
                    message = await _read_frame(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the worker went away: the finally below cancels what it ran
                kind = message[0]
                if kind == "gen":
                    _, rid, name, request = message
                    running[rid] = asyncio.create_task(
                        self._generate(outbox, rid, name, request, running), name=f"bridge-gen-{rid}"
                    )
                elif kind == "close":
                    gen = running.pop(message[1], None)
                    if gen is not None:
                        gen.cancel()
                elif kind == "abort":
                    await self.engines.abort(str(message[1]))
                else:
                    logger.warning("bridge: unknown message %r from a worker (ignored)", kind)
        finally:
            if pusher is not None:
                pusher.cancel()
            for gen in list(running.values()):
                gen.cancel()
            await asyncio.gather(*running.values(), return_exceptions=True)
            writer.close()
            self._connections.discard(task)

    async def _generate(
        self,
        outbox: _Outbox,
        rid: int,
        name: str,
        request: GenerationRequest,
        running: dict[int, asyncio.Task[None]],
    ) -> None:
        self.generations += 1
        try:
            async for event in self.engines.get(name).generate(request):
                if isinstance(event, TextDelta):
                    outbox.send_text(rid, event.text)
                else:
                    outbox.send(("ev", rid, event))
            outbox.send(("end", rid))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the engine's error travels to the worker's pipeline
            if not isinstance(exc, EngineError):
                logger.warning("bridge: generation %s failed", request.request_id, exc_info=True)
            with contextlib.suppress(Exception):
                outbox.send(("err", rid, _error_state(exc)))
        finally:
            running.pop(rid, None)

    async def _push_snapshots(self, outbox: _Outbox) -> None:
        while not outbox.writer.is_closing():
            await asyncio.sleep(SNAPSHOT_EVERY_S)
            outbox.send(("snap", _snapshot(self.engines)))


@dataclass
class _Stream:
    queue: asyncio.Queue[tuple[Any, ...]] = field(default_factory=asyncio.Queue)


class BridgeClient:
    """A worker's connection to the engine host; :meth:`engine_set` is its :class:`EngineSet`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.info: dict[str, Any] = {}
        self.snapshot: dict[str, tuple[EngineHealth, EngineStats]] = {}
        self.lost: str | None = None
        """Why the host is unreachable (``None`` while connected)."""
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._streams: dict[int, _Stream] = {}
        self._ids = itertools.count(1)
        self._pump: asyncio.Task[None] | None = None
        self.on_lost: list[Any] = []
        """Callables run once (with the reason) when the connection to the host ends."""

    async def connect(self, timeout_s: float = 30.0) -> None:
        """Open the socket and read the host's hello."""
        reader, self._writer = await asyncio.wait_for(asyncio.open_unix_connection(self.path), timeout_s)
        self._reader = reader
        message = await asyncio.wait_for(_read_frame(reader), timeout_s)
        if message[0] != "hello":
            raise EngineError(f"the engine host answered {message[0]!r} instead of hello")
        self.info = message[1]
        self.snapshot = dict(self.info["snapshot"])
        self._pump = asyncio.create_task(self._read_loop(), name="bridge-client")

    def engine_set(self) -> EngineSet:
        """The host's engines as seen from this worker, with the host's routes and default."""
        engines = {name: BridgedEngine(self, name) for name in self.info["names"]}
        return EngineSet(engines, self.info["routes"], default=self.info["default"])

    @property
    def models(self) -> dict[str, str]:
        """Each engine's resolved model, by engine name."""
        return dict(self.info["models"])

    async def close(self) -> None:
        """Close the socket (generations still open fail as the host's would on a lost host)."""
        if self._writer is not None:
            self._writer.close()
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._pump
        self._fail_all("the bridge to the engine host was closed")

    def _send(self, message: tuple[Any, ...]) -> None:
        if self.lost is not None or self._writer is None:
            raise EngineDeadError(f"engine host unreachable: {self.lost or 'not connected'}")
        self._writer.write(_frame(message))

    async def _read_loop(self) -> None:
        assert self._reader is not None
        reason = "the engine host closed the bridge"
        try:
            while True:
                frame = await _read_frame(self._reader)
                for message in frame[1] if frame[0] == "batch" else (frame,):
                    if message[0] == "snap":
                        self.snapshot = message[1]
                        continue
                    stream = self._streams.get(message[1])
                    if stream is not None:
                        stream.queue.put_nowait(message)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            reason = f"the engine host closed the bridge ({type(exc).__name__})"
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            reason = f"unreadable message from the engine host: {exc}"
            logger.error("bridge: %s", reason)
        finally:
            self._fail_all(reason)

    def _fail_all(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason
            for callback in self.on_lost:
                with contextlib.suppress(Exception):
                    callback(reason)
        for stream in self._streams.values():
            stream.queue.put_nowait(("lost", 0, reason))

    async def generate(self, name: str, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        """Stream ``request`` from the host's engine ``name``; closing early cancels it there."""
        rid = next(self._ids)
        stream = _Stream()
        self._streams[rid] = stream
        done = False
        try:
            self._send(("gen", rid, name, request))
            while True:
                message = await stream.queue.get()
                kind = message[0]
                if kind == "text":
                    yield TextDelta(message[2])
                elif kind == "ev":
                    yield message[2]
                elif kind == "end":
                    done = True
                    return
                elif kind == "err":
                    done = True
                    raise _rebuild_error(message[2])
                else:  # lost
                    done = True
                    raise EngineDeadError(f"engine host unreachable: {message[2]}")
        finally:
            del self._streams[rid]
            if not done and self.lost is None:
                with contextlib.suppress(Exception):
                    self._send(("close", rid))

    async def abort(self, request_id: str) -> None:
        """Abort ``request_id`` on the host."""
        with contextlib.suppress(EngineDeadError):
            self._send(("abort", request_id))


class BridgedEngine(Engine):
    """One of the host's engines, from a worker: generation over the bridge, health and stats from
    the host's latest snapshot, the tokenizer the host sent (prompts are rendered here)."""

    def __init__(self, client: BridgeClient, name: str) -> None:
        self.client = client
        self.name = name
        self.backend = str(client.info["backends"][name])

    async def start(self, warmup_messages: Sequence[ChatMessage] = ()) -> None:
        """Nothing to do: the host started and warmed its engine before it accepted workers."""

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        """Stream from the host's engine of this name."""
        return self.client.generate(self.name, request)

    async def abort(self, request_id: str) -> None:
        """Abort on the host."""
        await self.client.abort(request_id)

    def health(self) -> EngineHealth:
        """The host's latest word on this engine; not ready once the host is unreachable."""
        if self.client.lost is not None:
            return EngineHealth(False, f"engine host unreachable: {self.client.lost}")
        return self.client.snapshot[self.name][0]

    def stats(self) -> EngineStats:
        """The host's latest stats of this engine."""
        return self.client.snapshot[self.name][1]

    async def shutdown(self, drain_timeout_s: float = 30.0) -> None:
        """The host owns the engine: a worker only closes its bridge (see :class:`BridgeClient`)."""

    def declare_dead(self, reason: str) -> bool:
        """Only the host decides that its engine is dead."""
        return False

    @property
    def tokenizer(self) -> ChatTokenizer:
        """The host engine's tokenizer (sent once in the hello)."""
        tokenizer: ChatTokenizer = self.client.info["tokenizers"][self.name]
        return tokenizer
