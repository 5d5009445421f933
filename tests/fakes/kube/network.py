"""Pod and Service networking of the test cluster on 127.0.0.0/8 (all of 127/8 reaches lo on Linux).

- Every pod the fake KubeRay starts gets its own address 127.A.B.x (`status.podIP`); its
  processes listen there: the Ray Serve proxy on :8000 (forwarded to the cluster's application)
  and Ray's per-node metrics agent on :8080.
- Every Service gets a clusterIP 127.A.C.x from the API server (as the Service IP allocator
  does), and a forwarder on clusterIP:port that does what kube-proxy does: each connection goes
  to one ready endpoint (a pod the selector matches, Running, condition Ready True, not
  terminating), `targetPort` resolved by number or by container port name; no endpoint ->
  the connection is refused. So a Service that selects no serving pod is really unreachable.
`hosts()` gives the `<svc>.<ns>.svc.cluster.local` -> clusterIP lines for an /etc/hosts.
"""
from __future__ import annotations

import asyncio
import itertools
import random
import socket
from collections.abc import Callable
from typing import Any

from tests.fakes.kube.store import BY_KIND, Key, Store


def _free_block() -> tuple[int, int]:
    """127.A.B.0/24 for pods and 127.A.B+1.0/24 for Services, unused by another test cluster."""
    for _ in range(200):
        a, b = random.randint(16, 250), random.randrange(0, 250, 2)
        with socket.socket() as s:
            try:
                s.bind((f"127.{a}.{b}.1", 0))
                s.close()
            except OSError:
                continue
        with socket.socket() as s:  # nobody listening on the block's first pod address
            s.settimeout(0.05)
            if s.connect_ex((f"127.{a}.{b}.2", 8080)) != 0:
                return a, b
    raise RuntimeError("no free 127.x.y.0/24 block")


class Network:
    def __init__(self, store: Store, loop: asyncio.AbstractEventLoop) -> None:
        self.store, self.loop = store, loop
        a, b = _free_block()
        self._pod_ips = (f"127.{a}.{b}.{i}" for i in itertools.count(2) if i < 255)
        self._svc_ips = (f"127.{a}.{b + 1}.{i}" for i in itertools.count(2) if i < 255)
        self.listeners: dict[tuple[str, int], asyncio.AbstractServer] = {}
        self._rr = itertools.count()
        self._service_ips: dict[tuple[str, str], str] = {}
        self.errors: list[BaseException] = []
        self._hosts: tuple[int, str] | None = None   # (store revision, hosts lines)
        store.allocate_ip = lambda: next(self._svc_ips)
        store.listeners.append(self._changed)

    def pod_ip(self) -> str:
        return next(self._pod_ips)

    # ---- listeners (always run on the cluster's loop) ----

    async def listen(self, ip: str, port: int, handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Any]) -> None:
        if (ip, port) in self.listeners:
            return
        self.listeners[(ip, port)] = await asyncio.start_server(handler, ip, port, reuse_address=True)

    async def close(self, ip: str, port: int | None = None) -> None:
        for key in [k for k in self.listeners if k[0] == ip and (port is None or k[1] == port)]:
            server = self.listeners.pop(key)
            server.close()
            if hasattr(server, "close_clients"):
                server.close_clients()

    def forward_to(self, pick: Callable[[], tuple[str, int] | None]):
        """A connection handler piping bytes to the address `pick` returns (None: refuse)."""
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            target = pick()
            try:
                if target is None:
                    raise OSError("no endpoints")
                up_reader, up_writer = await asyncio.open_connection(*target)
            except OSError:
                writer.transport.abort()
                return
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True)
        return handle

    # ---- Services ----

    def _changed(self, key: Key, obj: dict | None) -> None:
        res, ns, name = key
        if res.kind != "Service":
            return
        self.loop.call_soon_threadsafe(lambda: self.loop.create_task(self._logged(self._sync_service(ns, name, obj))))

    async def _logged(self, coro) -> None:
        try:
            await coro
        except Exception as exc:  # noqa: BLE001 - kept for the test to see, not lost in a task
            self.errors.append(exc)
            raise

    async def _sync_service(self, ns: str, name: str, svc: dict | None) -> None:
        if svc is None:
            gone = self._service_ips.pop((ns, name), None)
            if gone:
                await self.close(gone)
            return
        ip = (svc.get("spec") or {}).get("clusterIP")
        if not ip or ip == "None":
            return
        self._service_ips[(ns, name)] = ip
        for port in svc["spec"].get("ports") or []:
            await self.listen(ip, port["port"], self.forward_to(lambda p=port: self.endpoint(ns, name, p)))

    def endpoints(self, ns: str, name: str) -> list[dict]:
        """Ready pods the Service selects (what the EndpointSlice controller would list)."""
        svc = self.store.find(BY_KIND["Service"], ns, name)
        selector = ((svc or {}).get("spec") or {}).get("selector")
        if not selector:
            return []
        pods, _ = self.store.list(BY_KIND["Pod"], ns, lambda labels: all(labels.get(k) == v for k, v in selector.items()))
        return [p for p in pods if _ready(p)]

    def endpoint(self, ns: str, name: str, port: dict) -> tuple[str, int] | None:
        ready = self.endpoints(ns, name)
        if not ready:
            return None
        pod = ready[next(self._rr) % len(ready)]
        target = port.get("targetPort", port["port"])
        if isinstance(target, str):
            named = [p["containerPort"] for c in pod.get("spec", {}).get("containers") or [] for p in c.get("ports") or []
                     if p.get("name") == target]
            if not named:
                return None
            target = named[0]
        return pod["status"]["podIP"], int(target)

    def hosts(self) -> str:
        """/etc/hosts lines for every Service; the pod runner asks every 20 ms, so kept until the next write."""
        if self._hosts is not None and self._hosts[0] == self.store.revision:
            return self._hosts[1]
        services, revision = self.store.list(BY_KIND["Service"], None)
        self._hosts = (revision, self._hosts_lines(services))
        return self._hosts[1]

    @staticmethod
    def _hosts_lines(services: list[dict]) -> str:
        return "".join(f"{s['spec']['clusterIP']} {s['metadata']['name']}.{s['metadata']['namespace']}.svc.cluster.local "
                       f"{s['metadata']['name']}.{s['metadata']['namespace']}.svc\n"
                       for s in services if (s.get("spec") or {}).get("clusterIP") not in (None, "None"))


def _ready(pod: dict) -> bool:
    status = pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return ready and status.get("phase") == "Running" and bool(status.get("podIP")) \
        and not pod["metadata"].get("deletionTimestamp")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()
