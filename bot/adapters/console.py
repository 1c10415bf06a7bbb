"""The terminal adapter: the whole pipeline in a REPL (the embedded default, no chat platform).

One session is one thread: the first line is a question, later lines are follow-ups with the
session's history; ``/rca ...`` works as in Slack. What each context source gave is shown once
gathered, tokens are printed as they arrive, and each answer ends with a footer line: TTFT, TPOT,
tokens, sources. On a terminal, lines are read through the standard library's ``readline`` (line
editing, and history kept in a file between sessions) where Python has it.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TextIO

from rich.console import Console

from bot.adapters.base import ChatAdapter, MessageSink, ReplyStream
from bot.adapters.streaming import format_footer_line
from bot.types import FinalAnswer, IncomingMessage, MessageKind, SourceNote, StepUpdate

PROMPT = "opsbot> "
QUIT_WORDS = {"/quit", "/exit", ":q"}
HISTORY_LINES = 1000
"""Lines of REPL history kept in the history file."""


def _readline() -> ModuleType | None:
    """The standard library's readline (GNU readline or libedit), or ``None`` where Python has none."""
    try:
        import readline
    except ImportError:  # Windows, or a Python built without it: plain line reading
        return None
    return readline


class ConsoleReply(ReplyStream):
    """Prints new text as it arrives; the footer once the answer is done."""

    def __init__(self, out: TextIO, console: Console, thread_id: str) -> None:
        self._out = out
        self._console = console
        self._thread_id = thread_id
        self._shown = ""

    @property
    def thread_id(self) -> str:
        return self._thread_id

    async def show_sources(self, sources: Sequence[SourceNote]) -> None:
        """One dim line once context is gathered: ``kubernetes ✓ · prometheus ✗ timeout``."""
        if not sources:
            return
        marks = " · ".join(
            f"{s.name} ✓" if s.status in ("ok", "empty", "skipped") else f"{s.name} ✗ {s.status}"
            for s in sources
        )
        self._console.print(f"[dim]context: {marks}[/dim]", highlight=False)

    steps_in_text = False
    """Steps are printed as lines of their own (:meth:`show_step`), not as answer text."""

    async def show_step(self, step: StepUpdate, checklist: str) -> None:
        """One dim line per finished step (``✅ [2] kube_logs ... — 40 log lines``)."""
        if step.state != "pending":
            # markup off: a tool's title or result may hold [brackets] that rich would eat
            self._console.print(step.line(), style="dim", highlight=False, markup=False)

    async def update(self, text: str) -> None:
        # Redaction may rewrite text already shown; then wait for the final answer to reprint.
        if text.startswith(self._shown):
            self._out.write(text[len(self._shown) :])
            self._out.flush()
            self._shown = text
            if text and self.first_visible_at is None:
                self.first_visible_at = time.perf_counter()

    async def finish(self, answer: FinalAnswer) -> None:
        if self.first_visible_at is None:
            self.first_visible_at = time.perf_counter()
        if answer.error is not None:
            # A note, not model text: shown as notices are (``:warning:`` as its emoji, no Slack bold).
            if self._shown:
                self._out.write("\n")
                self._out.flush()
            self._console.print(answer.text.replace("*", ""), highlight=False, markup=False, soft_wrap=True)
        else:
            if answer.text.startswith(self._shown):
                self._out.write(answer.text[len(self._shown) :])
            else:
                self._out.write("\n" + answer.text)
            self._out.write("\n")
            self._out.flush()
        stats = format_footer_line(answer)
        if answer.tpot_ms is not None:
            stats += f" · {answer.tpot_ms:.1f} ms/token"
        self._console.print(f"[dim]— {stats}[/dim]", highlight=False)


class ConsoleAdapter(ChatAdapter):
    """Reads questions from a terminal (or any text stream) and prints streamed answers."""

    platform = "console"

    def __init__(
        self, *, stdin: TextIO | None = None, stdout: TextIO | None = None, history_file: Path | None = None
    ) -> None:
        self._in = stdin or sys.stdin
        self._out = stdout or sys.stdout
        self.history_file = history_file
        """Where the terminal's line history is kept between sessions (``None``: not kept)."""
        self._console = Console(file=self._out, highlight=False)
        self._submit: MessageSink | None = None
        self.session = uuid.uuid4().hex[:12]
        self.user = getpass.getuser()
        self._asked = 0

    async def start(self, submit: MessageSink) -> None:
        """Take lines from :meth:`repl` once it runs."""
        self._submit = submit

    async def stop(self) -> None:
        """Stop taking lines."""
        self._submit = None

    async def open_reply(self, message: IncomingMessage) -> ReplyStream:
        return ConsoleReply(self._out, self._console, message.thread_id or self.session)

    async def send_notice(self, message: IncomingMessage, text: str, *, ephemeral: bool = False) -> None:
        self._console.print(text.replace("*", ""), highlight=False, markup=False, soft_wrap=True)

    async def post_to_channel(self, channel: str, text: str, thread_id: str | None = None) -> str:
        self._console.print(text, highlight=False)
        return thread_id or self.session

    async def ask(self, text: str) -> None:
        """Ask ``text`` as if it had been typed (shown after the prompt), and wait for the answer."""
        if self._submit is None:
            raise RuntimeError("ConsoleAdapter.start() must be called before ask()")
        self._out.write(f"{PROMPT}{text}\n")
        self._out.flush()
        await self._submit(self.to_message(text))

    async def repl(self) -> None:
        """Answer lines until end of input or ``/quit``; each answer completes before the next prompt."""
        if self._submit is None:
            raise RuntimeError("ConsoleAdapter.start() must be called before repl()")
        interactive = self._in.isatty()
        # readline edits what the real terminal types (``input()`` uses it); any other stream is read plainly.
        editing = _readline() if interactive and self._in is sys.stdin and self._out is sys.stdout else None
        if editing is not None:
            self._load_history(editing)
        try:
            while True:
                if editing is not None:
                    line = await asyncio.to_thread(_input_line)
                else:
                    if interactive:
                        self._out.write(PROMPT)
                        self._out.flush()
                    line = await asyncio.to_thread(self._in.readline)
                if not line:
                    break
                text = line.strip()
                if not text:
                    continue
                if text in QUIT_WORDS:
                    break
                await self._submit(self.to_message(text))  # one answer at a time, as in a thread
        finally:
            if editing is not None:
                self._save_history(editing)

    def _load_history(self, editing: ModuleType) -> None:
        editing.set_history_length(HISTORY_LINES)
        if self.history_file is not None and self.history_file.is_file():
            with contextlib.suppress(OSError):
                editing.read_history_file(str(self.history_file))

    def _save_history(self, editing: ModuleType) -> None:
        if self.history_file is None:
            return
        with contextlib.suppress(OSError):  # a read-only home loses the history, not the session
            self.history_file.parent.mkdir(parents=True, exist_ok=True)
            editing.write_history_file(str(self.history_file))

    def to_message(self, text: str) -> IncomingMessage:
        """A typed line as an ``IncomingMessage`` of this session's thread."""
        self._asked += 1
        if text.startswith("/rca"):
            kind, text = MessageKind.COMMAND, text[len("/rca") :].strip()
        elif self._asked == 1:
            kind = MessageKind.DIRECT
        else:
            kind = MessageKind.FOLLOWUP
        return IncomingMessage(
            platform=self.platform,
            event_id=f"{self.session}:{self._asked}",
            channel="terminal",
            user=self.user,
            user_name=self.user,
            text=text,
            kind=kind,
            thread_id=self.session,
            message_id=str(self._asked),
        )


def _input_line() -> str:
    """One line typed at the prompt through readline (``""`` at end of input, like ``readline()``)."""
    try:
        return input(PROMPT) + "\n"
    except EOFError:
        return ""
