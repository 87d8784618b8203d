"""A TCP forwarder from the node's bridge address to the API server on loopback.

The API server listens on 127.0.0.1 only; in a pod, 127.0.0.1 is the pod itself. The API
server advertises the bridge address instead (the `kubernetes` Service's endpoint), and this
forwards that address to loopback, so a pod with in-cluster config (the chart's operator)
reaches it through the `kubernetes` Service as on any cluster.
"""

from __future__ import annotations

import asyncio

from .background import BackgroundLoop


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


class Forwarder:
    def __init__(self, listen_host: str, listen_port: int, target_host: str, target_port: int) -> None:
        self.listen = (listen_host, listen_port)
        self.target = (target_host, target_port)
        self._loop: BackgroundLoop | None = None
        self._server: asyncio.base_events.Server | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))

    def start(self) -> Forwarder:
        self._loop = BackgroundLoop("api-forwarder")

        async def serve() -> asyncio.base_events.Server:
            return await asyncio.start_server(self._handle, *self.listen)

        self._server = self._loop.run(serve())
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        if self._server is not None:
            server = self._server

            async def close() -> None:
                server.close()
                for task in asyncio.all_tasks():
                    if task is not asyncio.current_task():
                        task.cancel()

            self._loop.run(close(), timeout=30)
        self._loop.stop()
        self._loop = None
