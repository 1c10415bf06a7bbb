"""The event loop the commands run on (``bot/event_loop.py``): uvloop by default, asyncio on request,
one clear line where uvloop is asked for and missing."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from bot import event_loop
from tests.bot.test_cli import assert_one_line_error, run


async def _loop_name_and_a_socket_round_trip() -> str:
    # a real socket pair through the loop's transports: what the platforms, the store and the
    # fake servers use, not only call_soon
    received: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.set_result(await reader.readexactly(5))
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"hello")
    await writer.drain()
    assert await asyncio.wait_for(received, 5) == b"hello"
    writer.close()
    server.close()
    await server.wait_closed()
    return event_loop.running_loop_name()


@pytest.mark.skipif(sys.platform == "win32", reason="uvloop has no Windows build")
def test_auto_is_uvloop_where_it_is_a_dependency() -> None:
    assert event_loop.uvloop_available()
    assert event_loop.resolve("auto") == "uvloop"
    assert event_loop.run(_loop_name_and_a_socket_round_trip(), "auto") == "uvloop"


def test_asyncio_keeps_the_standard_loop() -> None:
    assert event_loop.resolve("asyncio") == "asyncio"
    assert event_loop.run(_loop_name_and_a_socket_round_trip(), "asyncio") == "asyncio"


def test_run_cleans_up_like_asyncio_run() -> None:
    left: list[asyncio.Task[None]] = []

    async def main() -> int:
        left.append(asyncio.create_task(asyncio.sleep(3600)))
        return 7

    assert event_loop.run(main(), "auto") == 7
    assert left[0].cancelled()  # what is left running is cancelled, as asyncio.run does


def test_uvloop_asked_for_and_missing_is_one_line_and_exit_2(tmp_path: Path) -> None:
    # a machine without uvloop: an import of it fails, as after `pip uninstall uvloop`
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['uvloop'] = None\n")
    env = {"OPSBOT_EVENT_LOOP": "uvloop", "PYTHONPATH": f"{hide}:{Path(__file__).resolve().parents[2]}"}
    proc = run(["config", "show"], tmp_path, env=env)
    assert proc.returncode == 2
    assert_one_line_error(proc, "uvloop is not installed", "event_loop = 'asyncio'")
    # auto falls back to asyncio on that machine
    proc = run(["config", "show"], tmp_path, env={**env, "OPSBOT_EVENT_LOOP": "auto"})
    assert proc.returncode == 0, proc.stderr
