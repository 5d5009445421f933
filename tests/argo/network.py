"""Cluster networking for the steps: Service DNS names -> loopback "clusterIPs", and kube-proxy.

Each Service name `<svc>.<ns>.svc.cluster.local` gets its own address in 127.0.0.0/8 (written to
the pods' /etc/hosts: cluster DNS). On that address and the Service's port a small TCP proxy
forwards every connection to the backend the Service selects *at connect time* (kube-proxy):
the stable Service `pd-llm` follows its `pdops.dev/colour` selector as the target switches it,
and `pd-llm-<colour>-serve-svc` / `-head-svc` (created by KubeRay for a RayCluster) reach that
colour's engine. An engine here is a KnownTimingServer on 127.0.0.1 (real HTTP, known latencies).
"""
from __future__ import annotations

import asyncio
import random
import threading
from typing import Callable

Backend = Callable[[], "tuple[str, int] | None"]


class ServiceNetwork:
    def __init__(self) -> None:
        self.hosts: dict[str, str] = {}
        self._net = (random.randint(64, 250), random.randint(1, 250))  # unlikely to collide with other tests
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kube-proxy", daemon=True)
        self._thread.start()
        self._servers: list[asyncio.AbstractServer] = []

    def address(self, name: str) -> str:
        if name not in self.hosts:
            self.hosts[name] = f"127.{self._net[0]}.{self._net[1]}.{len(self.hosts) + 2}"
        return self.hosts[name]

    def service(self, name: str, port: int, backend: Backend) -> None:
        """Listen on the Service's address:port; connect each client to backend() (None: refused)."""
        ip = self.address(name)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            target = backend()
            if target is None:
                writer.close()
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(*target)
            except OSError:
                writer.close()
                return
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True)

        async def listen() -> asyncio.AbstractServer:
            return await asyncio.start_server(handle, ip, port)
        self._servers.append(asyncio.run_coroutine_threadsafe(listen(), self._loop).result(10))

    def close(self) -> None:
        async def stop() -> None:
            for s in self._servers:
                s.close()
        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()
