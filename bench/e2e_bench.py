"""End-to-end benchmark: the real ``opsbot run`` process driven as a chat workspace would drive it.

The bot runs as a subprocess (``bench/opsbot_synthetic.py run``: ``opsbot run`` with the bench's
backends registered) against the fake Slack (Socket Mode, or signed HTTP events and slash
commands) or the fake Mattermost (websocket posts, HTTP slash commands) of ``tests/fakes/``, run
in this process, all on loopback. Every request is one question by its own user, so each is
followed from the event the fake sent to the answer the fake received, and joined with its
request row in the bot's SQLite store.

Per request, on the one monotonic clock both processes share (Linux ``CLOCK_MONOTONIC``):
``ack`` (Socket Mode envelope acknowledged / HTTP answer / slash command answer), ``sign of
life`` (reaction, thread status, ephemeral note, the ``/rca`` channel post, or a command's
ephemeral answer), ``placeholder`` (the answer's first message in the thread), ``first token``
(the first post / ``chat.update`` / ``chat.appendStream`` / post patch carrying answer text, as the
fake server received it), ``final`` (the answer's last write); the row's queue / context / TTFT /
TPOT; and ``event -> engine submit`` from the engine's submit record (``OPSBOT_BENCH_RECORD``).

Patterns (``--patterns``): ``burst8`` / ``burst32`` / ``burst64`` (all at once over
``--channels`` channels, ``--rca-share`` of them ``/rca``), ``poisson`` (``--rate`` per second for
``--seconds``), ``incident`` (56 threads answered first, then 56 long follow-ups in them, and 8
urgent ``/rca`` once every follow-up streams at the fake platform). ``--sweep 25,50,100`` runs
Poisson mentions at each rate (60 s) and reports the highest sustained: no loss or duplicate and
event -> submit P99 <= 25 ms.

Every pass of a pattern is an *episode*, reported on its own and pooled; P99 is by nearest rank
(:func:`pct`); CPU is every bot process's, in ns, over the requests its window holds
(``bench/episodes.py`` puts several runs side by side: issue 40). ``--budgets on`` keeps the platforms'
published rate limits on both sides (the fakes enforce them, opsbot budgets for them); ``off``
removes both (an engine comparison).

Usage::

    python bench/e2e_bench.py --engine synthetic --platforms slack-socket,mattermost \
        --patterns burst8,burst32,burst64,poisson,incident --sweep 25,50,100,150
    python bench/e2e_bench.py --render bench/results/e2e_bench-2026-12-01.json

Results: JSON (every request), Markdown and a PNG beside it; ``--render`` redraws MD + PNG.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import functools
import gzip
import json
import logging
import math
import os
import platform
import random
import re
import resource
import shlex
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "tests"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from fakes.mattermost_server import FakeMattermost  # noqa: E402
from fakes.slack_server import FakeSlack  # noqa: E402
from run_meta import gpu_line, package_versions, source_commit  # noqa: E402

from bot import event_loop  # noqa: E402

logger = logging.getLogger("e2e_bench")

PLATFORMS = ("slack-socket", "slack-http", "mattermost")
PATTERNS = ("burst8", "burst32", "burst64", "poisson", "incident")
STAGES = ("ack", "sign_of_life", "placeholder", "first_token", "final")
"""Times per request, in ms after the event was sent (``None``: the platform has no such step)."""
SEGMENTS = (
    ("event → sign of life", None, "sign_of_life"),
    ("→ placeholder", "sign_of_life", "placeholder"),
    ("→ first token visible", "placeholder", "first_token"),
    ("→ final message", "first_token", "final"),
)
"""The stacked bar: consecutive stages (P50 of each request's difference)."""
PLACEHOLDERS = ("_thinking…_", "thinking…", "_thinking..._")
SLASH_TOKEN = "bench-slash-token"
INCIDENT_STREAMS = 56
INCIDENT_URGENT = 8
INCIDENT_URGENT_DELAY_S = 0.3
ROW_FIELDS = (
    "request_id",
    "user",
    "channel",
    "thread_id",
    "scenario",
    "lane",
    "status",
    "queue_ms",
    "context_ms",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "post_ms",
    "prompt_tokens",
    "cached_tokens",
    "output_tokens",
)


# --- requests -------------------------------------------------------------------------------------


@dataclass
class Req:
    """One question of the benchmark and what happened to it (times: monotonic seconds)."""

    seq: int
    pattern: str
    kind: str
    """``mention``, ``rca`` or ``followup``."""
    channel: str
    user: str
    text: str
    thread: str | None = None
    """The thread a follow-up is asked in (the earlier answer's)."""
    sent: float | None = None
    ack: float | None = None
    sign_of_life: float | None = None
    placeholder: float | None = None
    first_token: float | None = None
    final: float | None = None
    answers: int = 0
    """Finished answers (messages with the footer) seen for it: 1 is right, more is a duplicate."""
    message_id: str | None = None
    """The asking message's id (Slack ``ts``, Mattermost post id)."""
    root: str | None = None
    """The answer's thread (the asking message, the ``/rca`` channel post, or ``thread``)."""
    row: dict[str, Any] | None = None
    rows: int = 0
    submitted: float | None = None
    envelope: str | None = None
    """Socket Mode: the envelope whose acknowledgement is the ack."""
    error: str | None = None
    episode: int = 1
    """Which run of its pattern in this bot process it belongs to (an incident's seeds: their
    incident's): every episode is reported on its own as well as pooled."""

    @property
    def tag(self) -> str:
        return f"ref b{self.seq:05d}"

    def ms(self, stage: str) -> float | None:
        value = getattr(self, stage)
        return None if value is None or self.sent is None else (value - self.sent) * 1000


def question(kind: str, seq: int, channel_name: str) -> str:
    """Plain questions that route to chat (mentions, follow-ups) and root cause (``/rca``)."""
    if kind == "rca":
        return f"checkout-api latency is high in {channel_name} ref b{seq:05d}"
    if kind == "followup":
        return f"and how does memory look for it now? ref b{seq:05d}"
    return f"how busy is the payments queue in {channel_name} right now? ref b{seq:05d}"


def is_answer_text(text: str | None) -> bool:
    if not text:
        return False
    t = text.replace("▍", "").strip()
    return bool(t) and t not in PLACEHOLDERS


# --- workspaces -------------------------------------------------------------------------------------


class Workspace:
    """A fake chat platform with channels, and the bot's settings to reach it."""

    platform = "abstract"

    def __init__(self, channels: int, budgets: bool) -> None:
        self.n_channels = channels
        self.budgets = budgets
        self.channels: list[str] = []
        self.bot_url = ""

    async def start(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    def settings(self) -> dict[str, Any]:
        raise NotImplementedError

    def new_user(self, channel: str, seq: int) -> str:
        """A member of ``channel`` who asks question ``seq``; returns the user id."""
        raise NotImplementedError

    async def connected(self) -> bool:
        raise NotImplementedError

    async def send(self, req: Req) -> None:
        raise NotImplementedError

    def collect(self, reqs: Sequence[Req]) -> None:
        """Fill each request's stage times from what the fake server recorded."""
        raise NotImplementedError

    def finished(self, reqs: Sequence[Req]) -> int:
        """How many of ``reqs`` have a finished answer (cheap enough to poll)."""
        self.collect(reqs)
        return sum(1 for r in reqs if r.final is not None and r.answers)

    def call_counts(self) -> dict[str, int]:
        """Web API / REST calls the bot made, by method."""
        raise NotImplementedError

    @staticmethod
    def windows(reqs: Sequence[Req]) -> dict[int, float]:
        """Per request, when the next question in its thread was sent (its answer's writes end
        before that: a follow-up's answer goes into the same thread)."""
        by_root: dict[tuple[str, str], list[float]] = {}
        for r in reqs:
            if r.root is not None and r.sent is not None:
                by_root.setdefault((r.channel, r.root), []).append(r.sent)
        out: dict[int, float] = {}
        for r in reqs:
            later = [
                t for t in by_root.get((r.channel, r.root or ""), []) if r.sent is not None and t > r.sent
            ]
            out[r.seq] = min(later, default=float("inf"))
        return out

    def cpu_s(self) -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime


class SlackWorkspace(Workspace):
    def __init__(self, channels: int, budgets: bool, mode: str) -> None:
        super().__init__(channels, budgets)
        self.mode = mode
        self.platform = f"slack-{mode}"
        self.fake = FakeSlack(tiers=None if budgets else {}, channel_post=None if not budgets else (1.0, 3))
        self.channels = [f"C{i:06d}" for i in range(channels)]
        self._index_at = 0
        self._events: dict[tuple[str, str], list[tuple[float, str, str, bool]]] = {}

    async def start(self) -> None:
        await self.fake.start()
        for ch in self.channels:
            self.fake.channel_names[ch] = f"inc-{ch.lower()}"

    async def close(self) -> None:
        await self.fake.close()

    def new_user(self, channel: str, seq: int) -> str:
        """A workspace member who asks (``users.info`` knows them, as a real workspace does)."""
        user = f"U{seq:08d}"
        self.fake.add_user(user, f"asker{seq:05d}")
        return user

    def settings(self) -> dict[str, Any]:
        f = self.fake
        return {
            "slack": {
                "enabled": True,
                "mode": self.mode,
                "bot_token": f.bot_token,
                "app_token": f.app_token,
                "signing_secret": f.signing_secret,
                "api_base_url": f.api_url,
                "rate_budgets": self.budgets,
            }
        }

    async def connected(self) -> bool:
        if self.mode == "socket":
            return bool(self.fake.open_connections >= 1)
        return any(c.method == "auth.test" and c.ok for c in self.fake.calls)

    async def send(self, req: Req) -> None:
        f = self.fake
        if req.kind == "rca":
            payload = f.slash_command(req.channel, req.user, req.text)
            req.sent = time.monotonic()
            if self.mode == "socket":
                env = await f.deliver("slash_commands", payload)
                req.envelope = env.envelope_id
            else:
                post = await f.post_to_app(self.bot_url, "command", payload)
                req.ack = post.answered_at
            return
        event = f.user_message(req.channel, req.user, self._text(req), thread_ts=req.thread)
        req.message_id = event["ts"]
        events = f.mention_events(event) if req.kind == "mention" else [event]
        req.sent = time.monotonic()
        for ev in events:
            if self.mode == "socket":
                envs = await f.deliver_event(ev)
                if req.envelope is None:
                    req.envelope = envs[0].envelope_id
            else:
                post = await f.post_to_app(self.bot_url, "event", f.event_callback(ev))
                if req.ack is None:
                    req.ack = post.answered_at

    def call_counts(self) -> dict[str, int]:
        return dict(Counter(c.method for c in self.fake.calls).most_common())

    def _text(self, req: Req) -> str:
        return f"<@{self.fake.bot_user_id}> {req.text}" if req.kind == "mention" else req.text

    def _index(self) -> None:
        """Every accepted write of the bot by thread: (at, method, text, carries the footer)."""
        calls = self.fake.calls
        for call in calls[self._index_at :]:
            if not call.ok or call.method not in (
                "chat.postMessage",
                "chat.update",
                "chat.startStream",
                "chat.appendStream",
                "chat.stopStream",
            ):
                continue
            p = call.params
            channel = str(p.get("channel") or "")
            thread = p.get("thread_ts")
            if call.method in ("chat.update", "chat.appendStream", "chat.stopStream"):
                msg = self.fake.find(channel, str(p.get("ts") or ""))
                thread = msg.thread_ts if msg is not None else None
            if not thread:
                continue
            if call.method.endswith("Stream"):  # slack_sdk sends streamed text as markdown chunks
                text = FakeSlack._stream_text(p)[0]
            else:
                text = str(p.get("text") or "")
            footer = any(b.get("type") == "context" for b in (p.get("blocks") or []) if isinstance(b, dict))
            self._events.setdefault((channel, str(thread)), []).append((call.at, call.method, text, footer))
        self._index_at = len(calls)

    def collect(self, reqs: Sequence[Req]) -> None:
        self._index()
        f = self.fake
        for r in reqs:
            if r.sent is None:
                continue
            if self.mode == "socket" and r.ack is None:
                env = f.envelopes.get(r.envelope or "")
                if env is not None and env.acked_at is not None:
                    r.ack = env.acked_at
            if r.root is None:
                if r.kind == "rca":
                    root = next(
                        (
                            m
                            for m in f.messages.get(r.channel, [])
                            if m.bot_id and not m.thread_ts and r.tag in m.text
                        ),
                        None,
                    )
                    if root is None:
                        continue
                    r.root, r.sign_of_life = root.ts, root.posted_at
                else:
                    r.root = r.thread or r.message_id
            if r.sign_of_life is None and r.kind != "rca":
                signs: list[float] = []
                msg = f.find(r.channel, r.message_id or "")
                if msg is not None:
                    signs += [at for at, op, _ in msg.reaction_log if op == "add"]
                signs += [e["at"] for e in f.ephemerals if e.get("user") == r.user]
                signs += [
                    at for at, ch, th, st in f.thread_statuses if ch == r.channel and th == r.root and st
                ]
                if signs:
                    r.sign_of_life = min(signs)
        until = self.windows(reqs)
        for r in reqs:
            if r.sent is None or r.root is None:
                continue
            events = [e for e in self._events.get((r.channel, r.root), []) if r.sent <= e[0] < until[r.seq]]
            if not events:
                continue
            r.placeholder = events[0][0]
            texts = [at for at, _, text, footer in events if footer or is_answer_text(text)]
            r.first_token = texts[0] if texts else None
            r.answers = sum(1 for e in events if e[3])
            if r.answers:
                r.final = max(at for at, *_ in events)
            # the answer's first message is a sign of life too, when nothing came earlier
            r.sign_of_life = min(r.sign_of_life or r.placeholder, r.placeholder)


class MattermostWorkspace(Workspace):
    platform = "mattermost"

    def __init__(self, channels: int, budgets: bool) -> None:
        super().__init__(channels, budgets)
        self.fake = FakeMattermost(rate_limit=(10.0, 100) if budgets else None)
        self._index_at = 0
        self._events: dict[str, list[tuple[float, str, bool]]] = {}
        self._reactions: dict[str, float] = {}
        self._names: dict[str, str] = {}

    async def start(self) -> None:
        await self.fake.start()
        self.channels = [
            self.fake.add_channel(f"inc-{i:03d}", [self.fake.bot_user_id]) for i in range(self.n_channels)
        ]
        self._names = {cid: self.fake.channels[cid]["name"] for cid in self.channels}

    async def close(self) -> None:
        await self.fake.close()

    def settings(self) -> dict[str, Any]:
        return {
            "mattermost": {
                "enabled": True,
                **self.fake.settings_kwargs(),
                "slash_command_token": SLASH_TOKEN,
                "action_secret": "bench-action-secret",
                "public_url": self.bot_url.rsplit("/mattermost", 1)[0],
                "rate_budgets": self.budgets,
            }
        }

    async def connected(self) -> bool:
        return bool(self.fake.live_connections() >= 1)

    def call_counts(self) -> dict[str, int]:
        paths = Counter(f"{c.method} {re.sub(r'[a-z0-9]{26}', '{id}', c.path)}" for c in self.fake.calls)
        return dict(paths.most_common())

    def new_user(self, channel: str, seq: int) -> str:
        uid: str = self.fake.add_user(f"asker{seq:05d}")
        self.fake.members[channel].add(uid)
        return uid

    async def send(self, req: Req) -> None:
        f = self.fake
        if req.kind == "rca":
            req.sent = time.monotonic()
            status, _, elapsed = await f.send_slash_command(
                self.bot_url, token=SLASH_TOKEN, user_id=req.user, channel_id=req.channel, text=req.text
            )
            req.ack = req.sign_of_life = req.sent + elapsed
            if status != 200:
                req.error = f"slash command answered {status}"
            return
        text = f"@opsbot {req.text}" if req.kind == "mention" else req.text
        req.sent = time.monotonic()
        post = await f.user_posts(req.user, req.channel, text, root_id=req.thread or "")
        req.message_id = post["id"]

    def _index(self) -> None:
        calls = self.fake.calls
        for call in calls[self._index_at :]:
            if call.status >= 300 or not isinstance(call.body, dict):
                continue
            body = call.body
            if call.method == "POST" and call.path == "/api/v4/reactions":
                post = str(body.get("post_id", ""))
                self._reactions.setdefault(post, call.started)
                continue
            if call.method == "POST" and call.path == "/api/v4/posts":
                root = str(body.get("root_id") or "")
            elif call.method == "PUT" and call.path.endswith("/patch"):
                post = self.fake.posts.get(call.path.split("/")[-2])
                root = str(post.get("root_id") or "") if post else ""
            else:
                continue
            if root:
                message = str(body.get("message") or "")
                footer = "\n\n---\n:mag: " in message
                self._events.setdefault(root, []).append((call.started, message, footer))
        self._index_at = len(calls)

    def collect(self, reqs: Sequence[Req]) -> None:
        self._index()
        f = self.fake
        for r in reqs:
            if r.sent is None:
                continue
            if r.root is None:
                if r.kind == "rca":
                    root = next(
                        (
                            p
                            for p in f.posts.values()
                            if p["user_id"] == f.bot_user_id
                            and not p.get("root_id")
                            and r.tag in p["message"]
                        ),
                        None,
                    )
                    if root is None:
                        continue
                    r.root = root["id"]
                else:
                    r.root = r.thread or r.message_id
            if r.sign_of_life is None and r.message_id in self._reactions:
                r.sign_of_life = self._reactions[r.message_id or ""]
        until = self.windows(reqs)
        for r in reqs:
            if r.sent is None or r.root is None:
                continue
            events = [e for e in self._events.get(r.root, []) if r.sent <= e[0] < until[r.seq]]
            if not events:
                continue
            r.placeholder = events[0][0]
            texts = [at for at, text, footer in events if footer or is_answer_text(text)]
            r.first_token = texts[0] if texts else None
            r.answers = sum(1 for e in events if e[2])
            if r.answers:
                r.final = max(at for at, *_ in events)
            # the answer's first message is a sign of life too, when nothing came earlier
            r.sign_of_life = min(r.sign_of_life or r.placeholder, r.placeholder)


def make_workspace(name: str, channels: int, budgets: bool) -> Workspace:
    if name == "mattermost":
        return MattermostWorkspace(channels, budgets)
    return SlackWorkspace(channels, budgets, name.removeprefix("slack-"))


# --- the bot process --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)


def write_toml(data: dict[str, Any], path: Path) -> None:
    """Top-level keys, then one ``[section]`` per dict (nested dicts as inline tables)."""
    lines = [f"{k} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for key, value in data.items():
        if isinstance(value, dict):
            lines.append(f"\n[{key}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in value.items()]
    path.write_text("\n".join(lines) + "\n")


class BotProcess:
    """``opsbot run`` (through the bench launcher) as a subprocess with its own data folder."""

    def __init__(self, workdir: Path, settings: dict[str, Any], extra_env: dict[str, str]) -> None:
        self.workdir = workdir
        self.settings = settings
        self.extra_env = extra_env
        self.record = workdir / "submits.jsonl"
        self.log = workdir / "opsbot.log"
        self.db = workdir / "opsbot.db"
        self.proc: asyncio.subprocess.Process | None = None
        self.http_port = int(settings["http"]["port"])

    async def start(self) -> None:
        config = self.workdir / "opsbot.toml"
        write_toml(self.settings, config)
        env = {
            **os.environ,
            "OPSBOT_CONFIG": str(config),
            "OPSBOT_BENCH_RECORD": str(self.record),
            "OPSBOT_SUPERVISED": "1",  # the bench stops it (SIGTERM) and waits for its children
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            **self.extra_env,
        }
        self._log = self.log.open("wb")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(ROOT / "bench" / "opsbot_synthetic.py"),
            "run",
            cwd=str(self.workdir),
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a kill reaches its engine processes too (killpg)
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def bot_pids(self) -> list[int]:
        """The opsbot process and its bot workers (``workers`` > 1: children running the same
        launcher), not vLLM's engine processes."""
        assert self.proc is not None
        pids = [self.proc.pid]
        with contextlib.suppress(OSError):
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
            for child in children:
                with contextlib.suppress(OSError):
                    if b"opsbot_synthetic.py" in Path(f"/proc/{child}/cmdline").read_bytes():
                        pids.append(int(child))
        return pids

    @staticmethod
    def cpu_ns(pid: int) -> int | None:
        """CPU nanoseconds (user + system, every thread, those that ended included) of process
        ``pid`` so far, from the kernel's per-process CPU clock (what ``time.process_time_ns`` reads
        inside it); ``None`` once it has exited. /proc's stat counts in clock ticks (10 ms), too
        coarse for a few milliseconds per request."""
        try:
            # Linux's CPU clock of another process: MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
            return time.clock_gettime_ns(((~pid) << 3) | 2)
        except OSError:
            return None

    def cpu_ns_by_pid(self) -> dict[int, int]:
        """:meth:`cpu_ns` of the engine host and every live worker, by pid (never vLLM's engine
        processes: their CPU is the GPU side's, the same for every design)."""
        out: dict[int, int] = {}
        for pid in self.bot_pids():
            ns = self.cpu_ns(pid)
            if ns is not None:
                out[pid] = ns
        return out

    @staticmethod
    def _stat_cpu_s(stat_path: str) -> float:
        with contextlib.suppress(OSError):
            fields = Path(stat_path).read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return 0.0

    def cpu_by_process_s(self) -> dict[str, float]:
        """:meth:`cpu_s` by process: ``bot`` (the engine host, with workers) and ``worker N``."""
        pids = self.bot_pids()
        return {
            ("bot" if n == 0 else f"worker {n}"): self._stat_cpu_s(f"/proc/{pid}/stat")
            for n, pid in enumerate(pids)
        }

    def cpu_s(self) -> float:
        """User + system CPU seconds of the opsbot processes so far (with workers: the engine host
        and every worker; never vLLM's engine processes)."""
        return sum(self._stat_cpu_s(f"/proc/{pid}/stat") for pid in self.bot_pids())

    def main_thread_cpu_s(self) -> float:
        """User + system CPU seconds of the event loops' threads alone (each process's main thread):
        the rest of :meth:`cpu_s` is spent beside them (worker threads, vLLM's own)."""
        return sum(self._stat_cpu_s(f"/proc/{pid}/task/{pid}/stat") for pid in self.bot_pids())

    def thread_cpu_s(self) -> dict[str, float]:
        """CPU seconds by thread name (the event loop is ``python``'s main thread; a worker's
        threads are named ``worker N: ...``)."""
        assert self.proc is not None
        out: dict[str, float] = {}
        for n, pid in enumerate(self.bot_pids()):
            prefix = f"worker {n}: " if n else ""
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError):
                    head = task.joinpath("stat").read_text().rsplit(")", 1)[0]
                    name = prefix + head.split("(", 1)[1] + ("" if task.name != str(pid) else " (main)")
                    out[name] = out.get(name, 0.0) + self._stat_cpu_s(str(task / "stat"))
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    async def ready(self, workspace: Workspace, timeout_s: float) -> None:
        import aiohttp

        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if not self.alive():
                    raise RuntimeError(
                        f"opsbot exited with {self.proc.returncode if self.proc else '?'}:\n{self.tail()}"
                    )
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with session.get(f"http://127.0.0.1:{self.http_port}/readyz") as resp:
                        if resp.status == 200 and await workspace.connected():
                            return
                await asyncio.sleep(0.2)
        raise RuntimeError(f"opsbot not ready within {timeout_s:.0f} s:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    async def stop(self, timeout_s: float = 90.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                await self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def rows(self) -> dict[str, list[dict[str, Any]]]:
        """Request rows by user (each benchmark request has a user of its own)."""
        out: dict[str, list[dict[str, Any]]] = {}
        if not self.db.exists():
            return out
        with contextlib.closing(sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)) as conn:
            cols = ", ".join(ROW_FIELDS)
            for values in conn.execute(f"SELECT {cols} FROM opsbot_requests"):  # noqa: S608 - our columns
                row = dict(zip(ROW_FIELDS, values, strict=True))
                out.setdefault(str(row["user"]), []).append(row)
        return out

    async def flush_submits(self, timeout_s: float = 5.0) -> None:
        """Have the engine host write its submit records now (SIGUSR2) and wait for the file."""
        if not self.alive() or self.proc is None:
            return
        before = self.record.stat().st_mtime_ns if self.record.exists() else 0
        os.kill(self.proc.pid, signal.SIGUSR2)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.record.exists() and self.record.stat().st_mtime_ns != before:
                return
            await asyncio.sleep(0.05)

    def submits(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        if self.record.exists():
            for line in self.record.read_text().splitlines():
                item = json.loads(line)
                out[item["request_id"]] = item
        return out


# --- patterns -----------------------------------------------------------------------------------------


class Driver:
    """Sends a pattern's requests through one workspace and waits for their answers."""

    def __init__(self, ws: Workspace, args: argparse.Namespace, progress: Callable[[str], None]) -> None:
        self.ws = ws
        self.args = args
        self.say = progress
        self.seq = 0
        self.rng = random.Random(args.seed)
        self.tasks: set[asyncio.Task[None]] = set()
        self.step_info: dict[str, Any] = {}
        """What the running pattern observed beyond its requests (kept in its ``patterns`` entry)."""

    def new(self, pattern: str, kind: str, channel: str, thread: str | None = None) -> Req:
        self.seq += 1
        user = self.ws.new_user(channel, self.seq)
        if isinstance(self.ws, MattermostWorkspace):
            name = self.ws.fake.channels[channel]["name"]
        else:
            name = f"inc-{channel.lower()}"
        return Req(self.seq, pattern, kind, channel, user, question(kind, self.seq, name), thread=thread)

    def mix(self, pattern: str, n: int) -> list[Req]:
        """``n`` questions over the channels, ``--rca-share`` of them ``/rca`` (spread evenly)."""
        chans = self.ws.channels
        every = round(1 / self.args.rca_share) if self.args.rca_share > 0 else 0
        return [
            self.new(pattern, "rca" if every and i % every == every - 1 else "mention", chans[i % len(chans)])
            for i in range(n)
        ]

    def fire(self, req: Req) -> None:
        async def go() -> None:
            try:
                await self.ws.send(req)
            except Exception as exc:  # the request counts as lost; the run goes on
                req.error = f"send failed: {type(exc).__name__}: {exc}"

        task = asyncio.create_task(go())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def wait(self, reqs: Sequence[Req], label: str, deadline_s: float) -> float:
        """Until every request is answered or the deadline passes; returns the seconds waited."""
        t0 = time.monotonic()
        last = ""
        while True:
            if self.tasks:
                await asyncio.sleep(0.05)
            done = self.ws.finished(reqs)
            sent = sum(1 for r in reqs if r.sent is not None)
            elapsed = time.monotonic() - t0
            bar = "#" * int(20 * done / max(len(reqs), 1))
            line = f"{label}: [{bar:<20}] {done}/{len(reqs)} answered, {sent} sent, {elapsed:5.1f} s"
            if line[:-8] != last[:-8] or int(elapsed) % 5 == 0:
                self.say(line)
            last = line
            if (done >= len(reqs) and not self.tasks) or elapsed > deadline_s:
                return elapsed
            await asyncio.sleep(0.25)

    async def until_streaming(self, reqs: Sequence[Req], deadline_s: float) -> None:
        """Until every request's first answer text has reached the fake platform (polled every
        10 ms), or ``deadline_s`` passes (the step then records how many were streaming)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < deadline_s:
            self.ws.collect(reqs)
            if all(r.first_token is not None for r in reqs):
                return
            await asyncio.sleep(0.01)
        self.say(f"incident: not every follow-up streaming after {deadline_s:.0f} s; urgent sent anyway")

    async def burst(self, n: int) -> list[Req]:
        reqs = self.mix(f"burst{n}", n)
        for r in reqs:
            self.fire(r)
        await self.wait(reqs, f"burst{n}", self.args.pattern_timeout_s)
        return reqs

    async def poisson(
        self, rate: float, seconds: float, label: str, rca_share: float | None = None
    ) -> list[Req]:
        reqs: list[Req] = []
        t0 = time.monotonic()
        at = 0.0
        share = self.args.rca_share if rca_share is None else rca_share
        chans = self.ws.channels
        while True:
            at += self.rng.expovariate(rate)
            if at > seconds:
                break
            delay = t0 + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            kind = "rca" if self.rng.random() < share else "mention"
            req = self.new(label, kind, chans[len(reqs) % len(chans)])
            reqs.append(req)
            self.fire(req)
        await self.wait(reqs, label, self.args.pattern_timeout_s)
        return reqs

    async def incident(self) -> list[Req]:
        """56 threads answered first (kept apart as ``incident-seed``), then 56 follow-ups in them
        (background lane, long answers) and 8 urgent ``/rca`` once every follow-up is streaming:
        its first answer text seen at the fake platform (``--urgent-when``)."""
        chans = self.ws.channels
        seeds = [self.new("incident-seed", "mention", chans[i % len(chans)]) for i in range(INCIDENT_STREAMS)]
        for r in seeds:
            self.fire(r)
        await self.wait(seeds, "incident seed threads", self.args.pattern_timeout_s)
        follow = [
            self.new("incident", "followup", r.channel, thread=r.root) for r in seeds if r.root is not None
        ]
        for r in follow:
            self.fire(r)
        t0 = time.monotonic()
        if self.args.urgent_when == "streaming":
            await self.until_streaming(follow, self.args.pattern_timeout_s / 2)
        else:
            await asyncio.sleep(INCIDENT_URGENT_DELAY_S)
        # what the urgent questions met: the claim "while 56 answers stream" is checked, not assumed
        self.ws.collect(follow)
        self.step_info = {
            "urgent_after_s": round(time.monotonic() - t0, 3),
            "followups": len(follow),
            "followups_streaming_at_urgent": sum(
                1 for r in follow if r.first_token is not None and r.final is None
            ),
            "followups_finished_at_urgent": sum(1 for r in follow if r.final is not None),
        }
        urgent = [self.new("incident", "rca", chans[i % len(chans)]) for i in range(INCIDENT_URGENT)]
        for r in urgent:
            self.fire(r)
        await self.wait(follow + urgent, "incident", self.args.pattern_timeout_s)
        return seeds + follow + urgent


# --- one platform ---------------------------------------------------------------------------------------


def parse_value(text: str) -> Any:
    """``KEY=VALUE`` values: JSON where they parse (numbers, booleans, lists), else the string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def bot_settings(args: argparse.Namespace, ws: Workspace, workdir: Path, http_port: int) -> dict[str, Any]:
    short = {"max_tokens": args.answer_tokens}
    engine: dict[str, Any] = {
        "backend": args.engine,
        "max_model_len": args.max_model_len,
        "request_timeout_s": args.pattern_timeout_s,
        "drain_timeout_s": 5,
    }
    if args.model:
        engine["model"] = args.model
    if args.engine == "synthetic":
        engine["extra_engine_args"] = {
            "tokens_per_s": args.tokens_per_s,
            "ttft_ms": args.synthetic_ttft_ms,
            "tick_s": args.synthetic_tick_s,
        }
    if args.engine == "openai":
        engine["base_url"] = args.base_url
        if args.served_model_name:
            engine["served_model_name"] = args.served_model_name
    for item in args.engine_arg:
        key, _, value = item.partition("=")
        engine[key] = parse_value(value)
    admission: dict[str, Any] = {}
    if (args.admission or ("unlimited" if args.engine == "synthetic" else "default")) == "unlimited":
        # the synthetic engine has no batch to protect: the GPU-sized lane limits would queue
        # requests in admission and hide what opsbot itself sustains
        admission = {
            "max_in_flight": {},
            "max_prefilling": {},
            "max_prefill_tokens": {},
            "hold_background_while_urgent_prefills": False,
        }
    if args.urgent_first_wait_s is not None:
        admission["urgent_first_wait_s"] = args.urgent_first_wait_s
    return {
        "data_dir": str(workdir),
        "event_loop": args.event_loop,
        "workers": args.workers,
        "admission": admission,
        "log_level": args.bot_log_level,
        "engine": engine,
        "store": {"url": f"sqlite+aiosqlite:///{workdir / 'opsbot.db'}"},
        "http": {"enabled": True, "host": "127.0.0.1", "port": http_port},
        "scenarios": {
            "chat": {"max_tokens": args.answer_tokens},
            "root_cause": {"max_tokens": args.rca_tokens},
            "change_review": short,
            "alert_summary": short,
        },
        **ws.settings(),
    }


async def run_platform(
    name: str, args: argparse.Namespace, say: Callable[[str], None], followup_tokens: int | None = None
) -> dict[str, Any]:
    """One bot process on one fake platform: every pattern, then the sweep; every request kept."""
    ws = make_workspace(name, args.channels, args.budgets == "on")
    await ws.start()
    workdir = Path(tempfile.mkdtemp(prefix=f"e2e-{name}-", dir=args.workdir))
    http_port = free_port()
    if isinstance(ws, SlackWorkspace):
        ws.bot_url = f"http://127.0.0.1:{http_port}/slack/events"
    else:
        ws.bot_url = f"http://127.0.0.1:{http_port}/mattermost/command"
    settings = bot_settings(args, ws, workdir, http_port)
    env = {"OPSBOT_BENCH_PROFILE": f"{args.profile}.{name}"} if args.profile else {}
    bot = BotProcess(workdir, settings, env)
    out: dict[str, Any] = {"platform": name, "workdir": str(workdir), "patterns": []}
    driver = Driver(ws, args, say)
    reqs: list[Req] = []
    t_start = time.monotonic()
    try:
        await bot.start()
        say(f"{name}: starting opsbot ({args.engine} engine) ...")
        await bot.ready(ws, args.start_timeout_s)
        out["startup_s"] = round(time.monotonic() - t_start, 1)
        say(f"{name}: opsbot ready in {out['startup_s']} s")
        # idle cost: what the process spends with nothing to do (pings, health, SLO guard)
        # (ns clocks, as the patterns: 10 ms ticks read 0 here)
        i0, w0 = bot.cpu_ns_by_pid(), time.monotonic()
        await asyncio.sleep(args.idle_s)
        idle_ns = sum(ns - i0.get(pid, 0) for pid, ns in bot.cpu_ns_by_pid().items())
        out["idle_cpu_fraction"] = round(idle_ns / 1e9 / (time.monotonic() - w0), 4)
        if args.profile and bot.proc is not None:
            for pid in bot.bot_pids():  # the profile starts now, in the host and in every worker
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGUSR1)
        steps: list[tuple[str, Callable[[], Awaitable[list[Req]]]]] = []
        for pattern in args.patterns:
            if pattern.startswith("burst"):
                steps.append((pattern, functools.partial(driver.burst, int(pattern.removeprefix("burst")))))
            elif pattern == "poisson":
                steps.append((pattern, functools.partial(driver.poisson, args.rate, args.seconds, "poisson")))
            elif pattern == "incident":
                steps.append((pattern, driver.incident))
        for rate in args.sweep:
            label = f"sweep{rate:g}"
            steps.append((label, functools.partial(driver.poisson, rate, args.sweep_seconds, label, 0.0)))
        seen: Counter[str] = Counter()
        for label, step in steps:
            seen[label] += 1
            driver.step_info = {}
            c0, m0, b0, w0 = bot.cpu_s(), bot.main_thread_cpu_s(), ws.cpu_s(), time.monotonic()
            p0, n0 = bot.cpu_by_process_s(), bot.cpu_ns_by_pid()
            got = await step()
            n1 = bot.cpu_ns_by_pid()
            wall = time.monotonic() - w0
            for r in got:
                r.episode = seen[label]
            reqs += got
            out["patterns"].append(
                {
                    "pattern": label,
                    "episode": seen[label],
                    "requests": len([r for r in got if r.pattern == label]),
                    # every request sent in the window (an incident's 56 seeds too): the CPU
                    # the window measured is divided by these
                    "requests_in_window": len(got),
                    "wall_s": round(wall, 2),
                    # a worker started in the window counts from 0; one that died in it loses
                    # its last reading (restarts are in the bot's log)
                    "opsbot_cpu_ns": sum(ns - n0.get(pid, 0) for pid, ns in n1.items()),
                    "opsbot_cpu_ns_by_pid": {str(pid): ns - n0.get(pid, 0) for pid, ns in n1.items()},
                    **driver.step_info,
                    "opsbot_cpu_s": round(bot.cpu_s() - c0, 3),
                    "opsbot_main_thread_cpu_s": round(bot.main_thread_cpu_s() - m0, 3),
                    "bench_cpu_s": round(ws.cpu_s() - b0, 3),
                    # with workers: the engine host's share and each worker's (a restarted
                    # worker's counter starts again, so it can read low)
                    "opsbot_cpu_by_process_s": {
                        k: round(v - p0.get(k, 0.0), 3) for k, v in bot.cpu_by_process_s().items()
                    },
                    "loadavg": os.getloadavg(),
                }
            )
            if not bot.alive():
                raise RuntimeError(f"opsbot died during {label}:\n{bot.tail()}")
            if label.startswith("sweep"):
                verdict = await sweep_now(bot, ws, got, args.sweep_submit_p99_ms)
                say(f"{label}: {verdict}")
                if args.sweep_stop and not verdict.startswith("sustained"):
                    say(f"{label}: not sustained, the sweep ends here (--sweep-stop)")
                    break
            await asyncio.sleep(args.pause_s)
    except Exception as exc:
        logger.exception("%s failed", name)
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        with contextlib.suppress(Exception):
            out["thread_cpu_s"] = bot.thread_cpu_s()
        out["exit_code"] = await bot.stop()
        ws.collect(reqs)
        out["platform_calls"] = ws.call_counts()
        await ws.close()
    rows, submits = bot.rows(), bot.submits()
    for r in reqs:
        mine = rows.get(r.user, [])
        r.rows = len(mine)
        if mine:
            r.row = mine[0]
            sub = submits.get(str(r.row["request_id"]))
            if sub is not None:
                r.submitted = float(sub["submitted"])
    out["requests"] = [request_json(r) for r in reqs]
    if args.dump_prompts:
        out["prompts"] = [
            {k: s[k] for k in ("request_id", "lane", "scenario", "max_tokens", "prompt_token_ids")}
            for s in submits.values()
        ]
    out["log_tail"] = bot.tail(15)
    return out


async def sweep_now(bot: BotProcess, ws: Workspace, got: Sequence[Req], limit_ms: float) -> str:
    """The verdict on one swept rate while the bot still runs (the report's own comes from the same
    rows and submit records at the end): ``sustained ...`` or ``not sustained ...``."""
    ws.collect(got)
    await bot.flush_submits()
    rows, submits = bot.rows(), bot.submits()
    lost = dup = 0
    delays = []
    for r in got:
        mine = rows.get(r.user, [])
        lost += not r.answers or not mine
        dup += r.answers > 1 or len(mine) > 1
        sub = submits.get(str(mine[0]["request_id"])) if mine else None
        if sub is not None and r.sent is not None:
            delays.append((float(sub["submitted"]) - r.sent) * 1000)
    p99 = pct(delays, 99)
    ok = lost == 0 and dup == 0 and p99 is not None and p99 <= limit_ms
    shown = "–" if p99 is None else f"{p99:.1f}"
    text = f"{len(got)} requests, submit P99 {shown} ms, {lost} lost, {dup} duplicated"
    return ("sustained: " if ok else "not sustained: ") + text


def request_json(r: Req) -> dict[str, Any]:
    out: dict[str, Any] = {
        "seq": r.seq,
        "pattern": r.pattern,
        "episode": r.episode,
        "kind": r.kind,
        "channel": r.channel,
        "answers": r.answers,
        "rows": r.rows,
        "error": r.error,
        "sent_s": None if r.sent is None else round(r.sent, 4),
    }
    for stage in STAGES:
        value = r.ms(stage)
        out[f"{stage}_ms"] = None if value is None else round(value, 2)
    sub = r.ms("submitted")
    out["submit_ms"] = None if sub is None else round(sub, 3)
    if r.row is not None:
        for key in (
            "request_id",
            "scenario",
            "lane",
            "status",
            "queue_ms",
            "context_ms",
            "ttft_ms",
            "tpot_ms",
            "e2e_ms",
            "post_ms",
            "prompt_tokens",
            "cached_tokens",
            "output_tokens",
        ):
            value = r.row[key]
            out[f"row_{key}" if key.endswith("_ms") else key] = (
                round(value, 2) if isinstance(value, float) else value
            )
    return out


# --- summaries --------------------------------------------------------------------------------------------


def pct(values: Sequence[float], p: float) -> float | None:
    """The ``p``-th percentile by nearest rank: the value at rank ceil(p/100 * n) of the sorted
    values, a value that was measured (no interpolation toward a lower neighbour). For n <= 100,
    P99 is the largest value: a burst of 64's P99 is its slowest request; of 128 pooled requests,
    the second slowest."""
    xs = sorted(values)
    if not xs:
        return None
    rank = math.ceil(round(p * len(xs) / 100, 9))  # round: 0.99 * 100 must not become rank 100.0001
    return xs[min(max(rank, 1), len(xs)) - 1]


def with_episodes(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's requests, each with its ``episode`` (results before issue 40 lack it: a pattern run
    k times is then cut into k equal shares in sending order, as it was sent)."""
    reqs = sorted(run.get("requests", []), key=lambda r: r["seq"])
    if all("episode" in r for r in reqs):
        return reqs
    runs = Counter(step["pattern"] for step in run.get("patterns", []))
    by_pattern: dict[str, list[dict[str, Any]]] = {}
    for r in reqs:
        by_pattern.setdefault(r["pattern"], []).append(r)
    out = []
    for pattern, mine in by_pattern.items():
        k = runs.get(pattern) or runs.get(pattern.split("-")[0]) or 1
        share = max(len(mine) // k, 1)
        out += [{**r, "episode": min(i // share + 1, k)} for i, r in enumerate(mine)]
    return sorted(out, key=lambda r: r["seq"])


def _cpu_ns(step: dict[str, Any]) -> float:
    """A pattern window's opsbot CPU in ns (from the clock ticks of results before issue 40)."""
    return float(step["opsbot_cpu_ns"]) if "opsbot_cpu_ns" in step else step["opsbot_cpu_s"] * 1e9


def cpu_cells(steps: Sequence[dict[str, Any]], idle: float) -> dict[str, Any]:
    """CPU of one or several windows of a pattern, pooled: the windows' CPU over the requests sent in
    them (an incident's window holds its seeds, its follow-ups and its urgent questions)."""
    if not all("wall_s" in s for s in steps):  # a result without CPU readings
        return {}
    n = sum(s.get("requests_in_window", s.get("requests", 0)) for s in steps)
    wall = sum(s["wall_s"] for s in steps)
    if not n or not wall:
        return {}
    cpu_ns = sum(_cpu_ns(s) for s in steps)
    out: dict[str, Any] = {
        "requests_in_window": n,
        "opsbot_cpu_ms_per_request": round(cpu_ns / 1e6 / n, 3),
        "opsbot_cpu_ms_per_request_less_idle": round((cpu_ns / 1e9 - idle * wall) * 1000 / n, 3),
        "opsbot_cpu_fraction": round(cpu_ns / 1e9 / wall, 3),
        "bench_cpu_fraction": round(sum(s["bench_cpu_s"] for s in steps) / wall, 3),
        "loadavg_1m": round(max(s["loadavg"][0] for s in steps), 2),
    }
    if all(s.get("opsbot_main_thread_cpu_s") is not None for s in steps):  # absent in older results
        out["opsbot_main_thread_cpu_ms_per_request"] = round(
            sum(s["opsbot_main_thread_cpu_s"] for s in steps) * 1000 / n, 3
        )
    return out


def stage_cells(sel: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts, loss, duplicates and each stage's P50 / P99 of some requests."""
    row: dict[str, Any] = {
        "n": len(sel),
        "lost": sum(1 for r in sel if not r["answers"] or not r["rows"]),
        "duplicated": sum(1 for r in sel if r["answers"] > 1 or r["rows"] > 1),
        "not_ok": sum(1 for r in sel if r.get("status") not in (None, "ok")),
    }
    for key in (
        *(f"{s}_ms" for s in STAGES),
        "submit_ms",
        "row_queue_ms",
        "row_context_ms",
        "row_ttft_ms",
        "row_tpot_ms",
    ):
        vals = [r[key] for r in sel if r.get(key) is not None]
        row[key] = {"p50": _r(pct(vals, 50)), "p99": _r(pct(vals, 99)), "n": len(vals)}
    return row


def summarize(platform_run: dict[str, Any]) -> list[dict[str, Any]]:
    """Per pattern and kind: one row per episode (``episode`` 1, 2, ...) and, for a pattern run more
    than once, the episodes pooled (``episode`` ``pooled``); ``episodes`` says how many it had.
    CPU: each episode's window, and the windows pooled."""
    out = []
    reqs = with_episodes(platform_run)
    steps = platform_run.get("patterns", [])
    idle = platform_run.get("idle_cpu_fraction") or 0.0
    for pattern in dict.fromkeys(r["pattern"] for r in reqs):
        mine = [r for r in reqs if r["pattern"] == pattern]
        eps = sorted({r["episode"] for r in mine})
        windows = [dict(s) for s in steps if s["pattern"] == pattern]  # copies: counts are added
        for i, step in enumerate(windows, 1):
            if "requests_in_window" not in step:  # before issue 40: count the episode's own and seeds
                ep = step.get("episode", i)
                step["requests_in_window"] = sum(
                    1 for r in reqs if r["episode"] == ep and r["pattern"] in (pattern, f"{pattern}-seed")
                )
        groups: list[tuple[int | str, list[dict[str, Any]], list[dict[str, Any]]]] = []
        for ep in eps:
            # results before issue 40 have no episode per step: the k-th step of a pattern is episode k
            own = [s for i, s in enumerate(windows, 1) if s.get("episode", i) == ep]
            groups.append((ep, [r for r in mine if r["episode"] == ep], own))
        if len(eps) > 1:
            groups.append(("pooled", mine, windows))
        for ep, sel_ep, own in groups:
            kinds = sorted({r["kind"] for r in sel_ep})
            for kind in ("all", *kinds) if len(kinds) > 1 else ("all",):
                sel = sel_ep if kind == "all" else [r for r in sel_ep if r["kind"] == kind]
                row: dict[str, Any] = {
                    "platform": platform_run["platform"],
                    "pattern": pattern,
                    "episode": ep,
                    "episodes": len(eps),
                    "kind": kind,
                    **stage_cells(sel),
                }
                if kind == "all" and own:
                    row.update(cpu_cells(own, idle))
                    infos = [s for s in own if "followups_streaming_at_urgent" in s]
                    if infos:
                        row["followups_streaming_at_urgent"] = min(
                            s["followups_streaming_at_urgent"] for s in infos
                        )
                        row["urgent_after_s"] = max(s["urgent_after_s"] for s in infos)
                out.append(row)
    return out


def worst_episodes(summary: Sequence[dict[str, Any]], stage: str = "first_token_ms") -> list[dict[str, Any]]:
    """Per platform, pattern and kind: the episode whose ``stage`` P99 is the worst, beside the
    pooled P99: the headline of a repeated burst is its worst episode, not the pool."""
    best: dict[tuple[str, str, str], dict[str, Any]] = {}
    pooled: dict[tuple[str, str, str], float | None] = {}
    for row in summary:
        key = (row["platform"], row["pattern"], row["kind"])
        p99 = row[stage]["p99"]
        if row["episode"] == "pooled" or row["episodes"] == 1:
            pooled[key] = p99
        if row["episode"] == "pooled" or p99 is None:
            continue
        if key not in best or p99 > best[key]["p99"]:
            best[key] = {"platform": key[0], "pattern": key[1], "kind": key[2], "episode": row["episode"],
                         "episodes": row["episodes"], "p99": p99}  # fmt: skip
    return [{**v, "pooled_p99": pooled.get(k)} for k, v in best.items()]


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def sweep_verdict(summary: list[dict[str, Any]], submit_p99_ms: float) -> dict[str, Any]:
    """Highest swept rate per platform with every request answered once, no duplicate, and
    event -> engine submit P99 within ``submit_p99_ms`` (the bot kept up)."""
    out: dict[str, Any] = {}
    for row in summary:
        if not row["pattern"].startswith("sweep") or row["kind"] != "all":
            continue
        if row["episode"] != "pooled" and row["episodes"] > 1:
            continue
        rate = float(row["pattern"].removeprefix("sweep"))
        p99 = row["submit_ms"]["p99"]
        ok = row["lost"] == 0 and row["duplicated"] == 0 and p99 is not None and p99 <= submit_p99_ms
        best = out.setdefault(row["platform"], {"sustained_per_s": None, "rates": {}})
        best["rates"][f"{rate:g}"] = {
            "ok": ok, "n": row["n"], "submit_p50_ms": row["submit_ms"]["p50"], "submit_p99_ms": p99,
            "lost": row["lost"], "duplicated": row["duplicated"],
            "cpu_ms_per_request": row.get("opsbot_cpu_ms_per_request"),
            "opsbot_cpu_fraction": row.get("opsbot_cpu_fraction"),
            "bench_cpu_fraction": row.get("bench_cpu_fraction"),
        }  # fmt: skip
        if ok and (best["sustained_per_s"] is None or rate > best["sustained_per_s"]):
            best["sustained_per_s"] = rate
    return out


# --- report ---------------------------------------------------------------------------------------------


def fmt(cell: dict[str, Any] | None) -> str:
    if not cell or cell.get("p50") is None:
        return "–"
    return f"{cell['p50']:.0f} / {cell['p99']:.0f}"


def markdown(report: dict[str, Any]) -> str:
    meta = report["meta"]
    lines = [
        f"# End-to-end benchmark ({meta['date']})",
        "",
        f"- command: `{meta['command']}`",
        f"- commit: {meta.get('commit', 'not recorded (before issue 40)')}",
        f"- host: {meta['host']}, {meta['cpu']}, {meta['cores']} cores, load average at start "
        f"{meta['loadavg_start']}; GPU: {meta.get('gpu') or 'none'}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
        f"- engine: {report['config']['engine']}, rate budgets {report['config']['budgets']}, "
        f"{report['config']['channels']} channels, event loop "
        f"{report['config'].get('event_loop_resolved', 'asyncio')}, "
        f"{report['config'].get('workers', 1)} bot process(es) (workers)",
        "",
        "Times in ms after the event left the fake platform, P50 / P99 by nearest rank (P99 of 100 "
        "or fewer requests is the slowest one). Every episode of a pattern is a row; `pooled` rows "
        "join a repeated pattern's episodes. *first token* is the first answer text the fake server "
        "received; *submit* is the engine's submit; *queue / TTFT / TPOT* are the request row's; "
        "*CPU ms/req* is every opsbot process's CPU (engine host and workers, ns clocks) in the "
        "pattern's window over the requests sent in it.",
        "",
        "| platform | pattern | episode | kind | n | lost | dup | ack | sign of life | placeholder "
        "| first token | final | submit | queue | TTFT | TPOT | CPU ms/req |",
        "|---|---|---|---|---:|---:|---:|---|---|---|---|---|---|---|---|---|---:|",
    ]
    for row in report["summary"]:
        cpu = row.get("opsbot_cpu_ms_per_request")
        lines.append(
            f"| {row['platform']} | {row['pattern']} | {row.get('episode', 'pooled')} | {row['kind']} | "
            f"{row['n']} | {row['lost']} | "
            f"{row['duplicated']} | {fmt(row['ack_ms'])} | {fmt(row['sign_of_life_ms'])} | "
            f"{fmt(row['placeholder_ms'])} | {fmt(row['first_token_ms'])} | {fmt(row['final_ms'])} | "
            f"{_fmt_submit(row['submit_ms'])} | {fmt(row['row_queue_ms'])} | {fmt(row['row_ttft_ms'])} | "
            f"{_fmt_submit(row['row_tpot_ms'])} | {'' if cpu is None else f'{cpu:.2f}'} |"
        )
    worst = [w for w in report.get("worst", []) if w["episodes"] > 1]
    if worst:
        lines += [
            "",
            "## Worst episode beside the pool (the headline is the worst)",
            "",
            "| platform | pattern | kind | episodes | worst episode | its first token P99 | pooled P99 |",
            "|---|---|---|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {w['platform']} | {w['pattern']} | {w['kind']} | {w['episodes']} | {w['episode']} | "
            f"**{w['p99']:.0f}** | {w['pooled_p99']:.0f} |"
            for w in worst
            if w["pooled_p99"] is not None
        ]
    urgent = [
        r for r in report["summary"] if "followups_streaming_at_urgent" in r and r["episode"] != "pooled"
    ]
    if urgent:
        sent_when = [
            f"{r['platform']} episode {r['episode']}: {r['followups_streaming_at_urgent']} follow-ups "
            f"streaming after {r['urgent_after_s']} s"
            for r in urgent
        ]
        lines += ["", "Urgent `/rca` sent when: " + "; ".join(sent_when)]
    cpu_rows = [r for r in report["summary"] if r.get("opsbot_cpu_ms_per_request") is not None]
    if cpu_rows:
        lines += [
            "",
            "## opsbot's own cost",
            "",
            "| platform | pattern | episode | requests in window | CPU ms / request | less idle "
            "| event loop thread ms / request | opsbot CPU share | bench CPU share | load 1 min |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in cpu_rows:
            main = r.get("opsbot_main_thread_cpu_ms_per_request")
            lines.append(
                f"| {r['platform']} | {r['pattern']} | {r.get('episode', 'pooled')} | "
                f"{r.get('requests_in_window', r['n'])} | {r['opsbot_cpu_ms_per_request']:.2f} | "
                f"{r['opsbot_cpu_ms_per_request_less_idle']:.2f} | {'' if main is None else f'{main:.2f}'} | "
                f"{r['opsbot_cpu_fraction']:.2f} | "
                f"{r['bench_cpu_fraction']:.2f} | {r['loadavg_1m']} |"
            )
    if report.get("sweep"):
        limit = report["config"]["sweep_submit_p99_ms"]
        lines += [
            "",
            f"## Highest sustained mention rate (submit P99 <= {limit:g} ms, 0 lost, 0 duplicated)",
            "",
        ]
        for name, verdict in report["sweep"].items():
            rates = ", ".join(
                f"{rate}/s {'ok' if v['ok'] else 'NOT sustained'} (n {v.get('n', '?')}, submit P50 / P99 "
                f"{v.get('submit_p50_ms')} / {v['submit_p99_ms']} ms, {v['lost']} lost, "
                f"CPU {v.get('cpu_ms_per_request')} ms/req, opsbot CPU share {v.get('opsbot_cpu_fraction')})"
                for rate, v in verdict["rates"].items()
            )
            lines.append(f"- {name}: **{verdict['sustained_per_s']}/s** ({rates})")
    for run in report["runs"]:
        if run.get("error"):
            lines += ["", f"**{run['platform']} failed:** {run['error']}"]
    return "\n".join(lines) + "\n"


def _fmt_submit(cell: dict[str, Any] | None) -> str:
    if not cell or cell.get("p50") is None:
        return "–"
    return f"{cell['p50']:.1f} / {cell['p99']:.1f}"


def plot(report: dict[str, Any], path: Path) -> None:
    """Left: event -> first token visible per pattern (box plot); right: P50 per stage, stacked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[float]] = {}
    stacks: dict[str, list[float]] = {}
    for run in report["runs"]:
        reqs = run.get("requests", [])
        for pattern in dict.fromkeys(r["pattern"] for r in reqs):
            mine = [r for r in reqs if r["pattern"] == pattern]
            label = f"{run['platform']}\n{pattern}"
            groups[label] = [r["first_token_ms"] for r in mine if r["first_token_ms"] is not None]
            seg = []
            for _, start, end in SEGMENTS:
                diffs = [
                    r[f"{end}_ms"] - (r[f"{start}_ms"] if start else 0.0)
                    for r in mine
                    if r.get(f"{end}_ms") is not None and (start is None or r.get(f"{start}_ms") is not None)
                ]
                seg.append(max(pct(diffs, 50) or 0.0, 0.0))
            stacks[label] = seg
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 6))
    labels = [k for k, v in groups.items() if v]
    if labels:
        left.boxplot([groups[k] for k in labels], whis=(1, 99), showfliers=True)
        left.set_xticks(range(1, len(labels) + 1), labels, rotation=60, fontsize=7)
    left.set_ylabel("event → first token visible (ms)")
    left.set_yscale("log")
    left.set_title("Latency distribution (whiskers P1-P99)")
    bottoms = [0.0] * len(stacks)
    names = list(stacks)
    for i, (seg_name, _, _) in enumerate(SEGMENTS):
        heights = [stacks[n][i] for n in names]
        right.bar(range(len(names)), heights, bottom=bottoms, label=seg_name)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    right.set_xticks(range(len(names)), names, rotation=60, fontsize=7)
    right.set_ylabel("ms (P50 of each stage)")
    right.set_title("Where the time goes, per stage")
    right.legend(fontsize=8)
    meta = report["meta"]
    fig.suptitle(
        f"opsbot end to end, {report['config']['engine']} engine, budgets "
        f"{report['config']['budgets']} — {meta['date']}, {meta['host']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(report: dict[str, Any], out: Path) -> None:
    report["summary"] = [row for run in report["runs"] for row in summarize(run)]
    report["worst"] = worst_episodes(report["summary"])
    report["sweep"] = sweep_verdict(report["summary"], report["config"]["sweep_submit_p99_ms"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, separators=(",", ":")) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    plot(report, out.with_suffix(".png"))


def meta(argv: Sequence[str]) -> dict[str, Any]:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions: dict[str, str] = {"python": platform.python_version()}
    versions.update(
        package_versions(
            "bot", "slack_sdk", "slack_bolt", "aiohttp", "uvloop", "vllm", "torch", "transformers"
        )
    )
    gpu = gpu_line()
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": "python " + " ".join(shlex.quote(a) for a in argv),
        "host": platform.node(),
        "commit": source_commit(ROOT),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "gpu": gpu,
        "versions": versions,
    }


# --- raw vLLM, the very same prompts ----------------------------------------------------------------------


def read_result(path: Path) -> dict[str, Any]:
    """A result JSON as this bench writes it, or gzipped (``bench/results`` keeps large ones so)."""
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)


def common_prefix(seqs: Sequence[Sequence[int]]) -> list[int]:
    """The longest prefix every sequence shares (the rendered system prompt of the bot's prompts)."""
    if not seqs:
        return []
    first = list(seqs[0])
    n = len(first)
    for seq in seqs[1:]:
        n = min(n, len(seq))
        for i in range(n):
            if seq[i] != first[i]:
                n = i
                break
    return first[:n]


async def raw_replay(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Replay a bot run's prompts (``--dump-prompts``) on raw ``AsyncLLM`` with the same engine
    arguments, warm-up and arrival times (each pattern's offsets from its first event), and compare
    raw TTFT with the bot's event -> first token visible, pattern by pattern."""
    from types import SimpleNamespace

    from engine_bench import RawEngine

    from inference.config import EngineConfig
    from inference.engine import Lane

    source = read_result(args.raw_replay)
    run = source["runs"][0]
    prompts = {p["request_id"]: p for p in run.get("prompts", [])}
    if not prompts:
        raise SystemExit(f"{args.raw_replay} has no prompts: run the bot side with --dump-prompts")
    reqs = [r for r in run["requests"] if r.get("request_id") in prompts and r.get("sent_s") is not None]
    engine = {k: parse_value(v) for k, v in (a.partition("=")[::2] for a in source["config"]["engine_args"])}
    model = source["config"]["model"]
    cfg = EngineConfig(
        model=model,
        max_model_len=source["config"].get("max_model_len", 4096),
        request_timeout_s=None,
        **engine,
    )
    ids = [prompts[r["request_id"]]["prompt_token_ids"] for r in reqs]
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    wl = SimpleNamespace(warmup_ids=common_prefix(ids), vocab_size=vocab)
    print(f"raw AsyncLLM: {len(reqs)} prompts, shared prefix {len(wl.warmup_ids)} tokens", file=sys.stderr)
    results: list[dict[str, Any]] = []
    async with RawEngine(cfg, wl, cfg.quantization) as eng:  # type: ignore[arg-type]
        client = eng.client()
        for pattern in dict.fromkeys(r["pattern"] for r in reqs):
            mine = [r for r in reqs if r["pattern"] == pattern]
            t0 = min(r["sent_s"] for r in mine)
            start = time.monotonic()

            async def one(
                r: dict[str, Any], start: float = start, t0: float = t0, pattern: str = pattern
            ) -> dict[str, Any]:
                await asyncio.sleep(max(0.0, start + r["sent_s"] - t0 - time.monotonic()))
                p = prompts[r["request_id"]]
                got = await client.one(p["prompt_token_ids"], p["max_tokens"], Lane(p["lane"]))
                return {"seq": r["seq"], "pattern": pattern, "kind": r["kind"], **got}

            outs = await asyncio.gather(*(one(r) for r in mine))
            results += outs
            p99 = pct([o["ttft"] for o in outs], 99) or 0.0
            print(f"raw {pattern}: {len(outs)} requests, TTFT P99 {p99:.1f} ms", file=sys.stderr)
        facts = eng.facts()
    compare = []
    for pattern in dict.fromkeys(r["pattern"] for r in reqs):
        for kind in ("all", *sorted({r["kind"] for r in reqs if r["pattern"] == pattern})):
            bot = [
                r["first_token_ms"]
                for r in reqs
                if r["pattern"] == pattern and kind in ("all", r["kind"]) and r["first_token_ms"] is not None
            ]
            raw = [o["ttft"] for o in results if o["pattern"] == pattern and kind in ("all", o["kind"])]
            b99, r99 = pct(bot, 99), pct(raw, 99)
            compare.append({
                "pattern": pattern, "kind": kind, "n": len(raw),
                "bot_first_token_p50_ms": _r(pct(bot, 50)), "bot_first_token_p99_ms": _r(b99),
                "raw_ttft_p50_ms": _r(pct(raw, 50)), "raw_ttft_p99_ms": _r(r99),
                "p99_ratio": round(b99 / r99, 3) if b99 and r99 else None,
            })  # fmt: skip
    report: dict[str, Any] = {
        "meta": meta(argv),
        "source": str(args.raw_replay),
        "engine": facts,
        "raw": results,
        "compare": compare,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    lines = [
        f"# Raw AsyncLLM on the bot's own prompts ({report['meta']['date']})",
        "",
        f"- command: `{report['meta']['command']}`; source: `{args.raw_replay}`",
        f"- GPU: {report['meta']['gpu'] or 'none'}; versions: "
        + ", ".join(f"{k} {v}" for k, v in report["meta"]["versions"].items()),
        "",
        "Bot: event -> first token visible in the fake platform; raw: TTFT from its own submit (ms).",
        "",
        "| pattern | kind | n | bot P50 | bot P99 | raw P50 | raw P99 | bot / raw P99 |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in compare:
        lines.append(
            f"| {c['pattern']} | {c['kind']} | {c['n']} | {c['bot_first_token_p50_ms']} | "
            f"{c['bot_first_token_p99_ms']} | {c['raw_ttft_p50_ms']} | {c['raw_ttft_p99_ms']} | "
            f"{c['p99_ratio']} |"
        )
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), file=sys.stderr)
    return 0


# --- command line ---------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--render", type=Path, help="re-render the Markdown and PNG of this JSON result; nothing runs"
    )
    p.add_argument(
        "--raw-replay",
        type=Path,
        metavar="BOT_RUN.json",
        help="replay that run's prompts (--dump-prompts) on raw vLLM AsyncLLM and compare",
    )
    p.add_argument(
        "--engine", default="synthetic", help="the bot's engine.backend: synthetic, vllm, openai, cpu"
    )
    p.add_argument("--model", help="engine.model (a folder); unset: the tiny offline test model")
    p.add_argument("--base-url", help="engine.base_url for --engine openai")
    p.add_argument("--served-model-name", help="engine.served_model_name for --engine openai")
    p.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="more [engine] settings, e.g. load_format=dummy, quantization=fp8 (repeatable)",
    )
    p.add_argument("--platforms", default="slack-socket", help=f"comma list of {', '.join(PLATFORMS)}")
    p.add_argument(
        "--patterns",
        default="burst8,burst32,burst64,poisson,incident",
        help=f"comma list of {', '.join(PATTERNS)} (or none)",
    )
    p.add_argument("--channels", type=int, default=16, help="channels the requests are spread over")
    p.add_argument(
        "--rca-share", type=float, default=0.25, help="share of /rca among burst and Poisson requests"
    )
    p.add_argument("--rate", type=float, default=10.0, help="Poisson pattern: arrivals per second")
    p.add_argument("--seconds", type=float, default=10.0, help="Poisson pattern: arrival window in seconds")
    p.add_argument(
        "--sweep", default="", help="comma list of mention rates per second for the sustained-rate sweep"
    )
    p.add_argument(
        "--sweep-seconds",
        type=float,
        default=60.0,
        help="arrival window of each swept rate (issue 40: >= 60)",
    )
    p.add_argument(
        "--sweep-submit-p99-ms",
        type=float,
        default=25.0,
        help="a swept rate is sustained when event -> engine submit P99 stays within this",
    )
    p.add_argument(
        "--sweep-stop",
        action="store_true",
        help="end the sweep at the first rate not sustained (rates rising: the ones above it are lost)",
    )
    p.add_argument(
        "--urgent-when",
        choices=["streaming", "delay"],
        default="streaming",
        help="incident: send the urgent /rca once every follow-up shows answer text at the fake "
        f"platform (streaming), or {INCIDENT_URGENT_DELAY_S} s after the follow-ups (delay, before issue 40)",
    )
    p.add_argument(
        "--budgets",
        choices=["on", "off"],
        default="off",
        help="platform rate limits in the fakes and opsbot's budgets for them",
    )
    p.add_argument(
        "--admission",
        choices=["default", "unlimited"],
        help="lane admission limits: the shipped ones, or none (default: none for the synthetic engine)",
    )
    p.add_argument(
        "--urgent-first-wait-s",
        type=float,
        default=None,
        help="admission.urgent_first_wait_s of the bot (0: off; default: the shipped value)",
    )
    p.add_argument(
        "--event-loop",
        choices=["auto", "uvloop", "asyncio"],
        default="auto",
        help="the bot's event_loop setting (auto: uvloop where installed, as shipped)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="the bot's workers setting (N > 1: an engine host and N worker processes; CPU counts all)",
    )
    p.add_argument("--answer-tokens", type=int, default=64, help="max_tokens of mentions and follow-ups")
    p.add_argument("--rca-tokens", type=int, default=64, help="max_tokens of /rca (root cause)")
    p.add_argument(
        "--tokens-per-s", type=float, default=50.0, help="synthetic engine: tokens per second per request"
    )
    p.add_argument(
        "--synthetic-ttft-ms", type=float, default=20.0, help="synthetic engine: time to first token"
    )
    p.add_argument(
        "--synthetic-tick-s",
        type=float,
        default=0.05,
        help="synthetic engine: text handed over at most this often per request (0: every token, as "
        "vLLM with stream_interval 1; 0.05 at 150 tokens/s is ~8 tokens, as stream_interval 8)",
    )
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--pattern-timeout-s", type=float, default=120.0, help="most seconds a pattern may take")
    p.add_argument(
        "--start-timeout-s", type=float, default=300.0, help="most seconds opsbot may take to start"
    )
    p.add_argument(
        "--idle-s", type=float, default=3.0, help="seconds of idle CPU measured before the patterns"
    )
    p.add_argument("--pause-s", type=float, default=1.0, help="pause between patterns")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--dump-prompts",
        action="store_true",
        help="keep every prompt's token ids the bot submitted (for raw vLLM to replay)",
    )
    p.add_argument("--bot-log-level", default="WARNING")
    p.add_argument("--profile", help="cProfile the opsbot process into PROFILE.<platform> (the hot path)")
    p.add_argument("--workdir", help="where the bot's data folders go (default: the system temp folder)")
    p.add_argument(
        "--out",
        type=Path,
        default=ROOT / "bench" / "results" / f"e2e_bench-{dt.date.today().isoformat()}.json",
    )
    args = p.parse_args(argv)
    args.platforms = [x for x in args.platforms.split(",") if x]
    args.patterns = [x for x in args.patterns.split(",") if x and x != "none"]
    for name in args.platforms:
        if name not in PLATFORMS:
            p.error(f"unknown platform {name!r}: use {', '.join(PLATFORMS)}")
    for name in args.patterns:
        if name not in PATTERNS and not (name.startswith("burst") and name[5:].isdigit()):
            p.error(f"unknown pattern {name!r}: use {', '.join(PATTERNS)} (or burstN)")
    try:
        args.sweep = [float(x) for x in args.sweep.split(",") if x]
    except ValueError:
        p.error(f"--sweep takes rates like 25,50,100, got {args.sweep!r}")
    if args.profile:  # the bot runs in its own folder: a relative path would land there
        args.profile = str(Path(args.profile).resolve())
    if args.model and Path(args.model).exists():  # the bot runs in its own folder
        args.model = str(Path(args.model).resolve())
    if args.engine == "openai" and not args.base_url:
        p.error("--engine openai needs --base-url")
    return args


async def main_async(args: argparse.Namespace, argv: Sequence[str]) -> int:
    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    report: dict[str, Any] = {
        "meta": meta(argv),
        "config": {
            "engine": args.engine,
            "model": args.model,
            "budgets": args.budgets,
            "channels": args.channels,
            "rca_share": args.rca_share,
            "answer_tokens": args.answer_tokens,
            "rca_tokens": args.rca_tokens,
            "tokens_per_s": args.tokens_per_s if args.engine == "synthetic" else None,
            "engine_args": args.engine_arg,
            "admission": args.admission or ("unlimited" if args.engine == "synthetic" else "default"),
            "event_loop": args.event_loop,
            "workers": args.workers,
            # what the bot process (same interpreter) runs on: reports before 2026-12-02 ran asyncio
            "event_loop_resolved": event_loop.resolve(args.event_loop),
            "max_model_len": args.max_model_len,
            "sweep_submit_p99_ms": args.sweep_submit_p99_ms,
            "sweep_seconds": args.sweep_seconds,
            "urgent_when": args.urgent_when,
        },
        "runs": [],
    }
    # SIGTERM (a `timeout` around the bench) cancels the run: the bot is still stopped, and
    # what finished is still written
    task = asyncio.current_task()
    if task is not None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    failed = False
    for name in args.platforms:
        run = await run_platform(name, args, say)
        failed = failed or "error" in run
        report["runs"].append(run)
        write_report(report, args.out)  # after every platform: a timeout keeps what finished
    say(markdown(report))
    say(f"wrote {args.out}, {args.out.with_suffix('.md')} and {args.out.with_suffix('.png')}")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    args = parse_args(argv[1:])
    logging.basicConfig(
        level=os.environ.get("LOG_LEVEL", "WARNING"), format="%(asctime)s %(name)s %(message)s"
    )
    if args.render is not None:
        report = read_result(args.render)
        target = args.render.with_suffix("") if args.render.suffix == ".gz" else args.render
        write_report(report, target)
        print(f"re-rendered {target.with_suffix('.md')} and {target.with_suffix('.png')}")
        return 0
    if args.raw_replay is not None:
        sys.path.insert(0, str(ROOT / "bench"))
        return asyncio.run(raw_replay(args, argv))
    return asyncio.run(main_async(args, argv))


if __name__ == "__main__":
    sys.exit(main())
