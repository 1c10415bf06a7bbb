"""Real ``opsbot run`` processes for the reliability tests, configured by environment only.

bot = BotProcess("a", tmp_path, model, env={...})
await bot.start()          # spawns ``python -m bot.cli run``; output goes to tmp_path/a.log
await bot.wait_ready()     # GET /readyz answers 200
bot.kill()                 # SIGKILL, as an OOM kill or a lost node does
await bot.stop()           # SIGTERM and wait (graceful shutdown)
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def base_env(data_dir: Path, model: Path, scenarios: dict[str, Any]) -> dict[str, str]:
    """Environment of an opsbot on the CPU engine and the tiny model, nothing else enabled."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSBOT_")}
    env.update(
        {
            # the repository first, then whatever the caller's path adds (the H200's unpacked
            # vLLM bundle and wheels live there, not in site-packages)
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
            "OPSBOT_DATA_DIR": str(data_dir),
            "OPSBOT_ENGINE__BACKEND": "cpu",
            "OPSBOT_ENGINE__MODEL": str(model),
            "OPSBOT_ENGINE__MAX_MODEL_LEN": "2048",
            "OPSBOT_SCENARIOS": json.dumps(scenarios),
            "OPSBOT_HTTP__HOST": "127.0.0.1",
            "OPSBOT_SLO__ENABLED": "false",
        }
    )
    return env


class BotProcess:
    """One ``opsbot run`` subprocess with its own HTTP port and log file."""

    def __init__(self, name: str, tmp_path: Path, env: dict[str, str]) -> None:
        self.name = name
        self.port = free_port()
        self.log_path = tmp_path / f"{name}.log"
        self.env = {**env, "OPSBOT_HTTP__ENABLED": "true", "OPSBOT_HTTP__PORT": str(self.port)}
        self.proc: asyncio.subprocess.Process | None = None
        self._log: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._log = self.log_path.open("ab")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bot.cli",
            "run",
            env=self.env,
            cwd=self.log_path.parent,
            stdout=self._log,
            stderr=asyncio.subprocess.STDOUT,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    async def wait_ready(self, timeout_s: float = 90.0) -> None:
        """Until ``/readyz`` answers 200 (engine loaded, database reachable)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        async with aiohttp.ClientSession() as session:
            while True:
                assert self.proc is not None
                if self.proc.returncode is not None:
                    raise AssertionError(f"{self.name} exited {self.proc.returncode}:\n{self.log()[-3000:]}")
                try:
                    async with session.get(f"{self.url}/readyz") as response:
                        if response.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                if asyncio.get_running_loop().time() > deadline:
                    raise AssertionError(f"{self.name} not ready after {timeout_s} s:\n{self.log()[-3000:]}")
                await asyncio.sleep(0.2)

    async def readyz(self) -> int:
        """The status ``/readyz`` answers now."""
        async with aiohttp.ClientSession() as session, session.get(f"{self.url}/readyz") as response:
            return response.status

    async def post(self, path: str, body: Any) -> int:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{self.url}{path}", json=body) as response,
        ):
            return response.status

    def kill(self) -> None:
        """SIGKILL: nothing of opsbot's own shutdown runs."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    async def wait(self, timeout_s: float = 90.0) -> int:
        assert self.proc is not None
        code = await asyncio.wait_for(self.proc.wait(), timeout_s)
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    async def stop(self) -> None:
        """SIGTERM and wait; SIGKILL if it does not end (test clean-up)."""
        if self.proc is None or self.proc.returncode is not None:
            return
        self.terminate()
        try:
            await self.wait(60)
        except TimeoutError:
            self.kill()
            await self.wait(10)
