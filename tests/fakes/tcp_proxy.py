"""A TCP proxy the test controls, for putting a real server (PostgreSQL) through an outage.

    proxy = TcpProxy("127.0.0.1", 5432)
    port = await proxy.start()          # listens on 127.0.0.1:<free port>
    await proxy.refuse()                # connections are refused (nothing listens), open ones reset
    await proxy.reset_connections()     # accept, then reset every connection at once (RST)
    await proxy.accept()                # forward again, on the same port
    await proxy.close()

Outages are made at the TCP level, so the real client library sees exactly what it would see
when a database host goes away: ECONNREFUSED on connect, ECONNRESET on established sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from typing import Literal

Mode = Literal["forward", "reset"]


class TcpProxy:
    """Forwards 127.0.0.1:<port> to ``target_host:target_port`` until told otherwise."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.port = 0
        self.mode: Mode = "forward"
        self.connections_accepted = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        """Start listening (on a free port the first time, then on the same port); return the port."""
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def refuse(self) -> None:
        """Stop listening, so connects get ECONNREFUSED, and reset every open connection."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        await self._reset_all()

    async def reset_connections(self) -> None:
        """Keep accepting, but reset each new connection at once, and reset every open one."""
        self.mode = "reset"
        await self._reset_all()

    async def accept(self) -> None:
        """Forward again (restarting the listener on the same port if :meth:`refuse` stopped it)."""
        self.mode = "forward"
        if self._server is None:
            await self.start()

    async def close(self) -> None:
        """Stop everything."""
        await self.refuse()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _reset_all(self) -> None:
        for writer in list(self._writers):
            _abort_with_rst(writer)
        self._writers.clear()

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.connections_accepted += 1
        if self.mode == "reset":
            _abort_with_rst(client_writer)
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                self.target_host, self.target_port
            )
        except OSError:
            _abort_with_rst(client_writer)
            return
        self._writers.update((client_writer, upstream_writer))
        pipes = [
            asyncio.ensure_future(self._pipe(client_reader, upstream_writer)),
            asyncio.ensure_future(self._pipe(upstream_reader, client_writer)),
        ]
        self._pipes.update(pipes)
        try:
            await asyncio.gather(*pipes, return_exceptions=True)
        finally:
            self._pipes.difference_update(pipes)
            for writer in (client_writer, upstream_writer):
                self._writers.discard(writer)
                with contextlib.suppress(Exception):
                    writer.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            # Half-close is enough for PostgreSQL's protocol; a reset on the other side ends it too.
            with contextlib.suppress(Exception):
                writer.close()


def _abort_with_rst(writer: asyncio.StreamWriter) -> None:
    """Close a connection with a TCP RST (SO_LINGER 0) instead of a polite FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
