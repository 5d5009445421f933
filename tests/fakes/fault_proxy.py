"""A fault-injecting HTTP proxy in front of an OpenAI-compatible endpoint on 127.0.0.1.

It forwards every request to the upstream unchanged, except that completion requests (paths ending
in /completions) can be made to fail in one of two ways a broken candidate really fails:
- `fail_every=N`: every Nth such request is answered 503 with an OpenAI error body;
- `hang_every=N`: every Nth streamed answer stops after `hang_after_events` SSE events and then
  sends nothing more, with the connection left open (a stalled engine behind a healthy ingress).
  Counted in events, not reads: Ray Serve batches a stream, and one read can hold all of it.

    with FaultProxy("http://127.0.0.1:9400/candidate/v1", fail_every=3) as proxy:
        proxy.base_url      # http://127.0.0.1:PORT/candidate/v1
        proxy.injected      # {"5xx": n, "hang": n}
"""
from __future__ import annotations

import asyncio
import itertools
import threading
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding"}


class FaultProxy:
    def __init__(self, upstream_base_url: str, fail_every: int = 0, hang_every: int = 0,
                 hang_after_events: int = 2) -> None:
        parts = urlsplit(upstream_base_url)
        assert parts.hostname == "127.0.0.1", "the proxy only forwards to 127.0.0.1"
        self.upstream_origin, self.path = f"{parts.scheme}://{parts.netloc}", parts.path
        self.fail_every, self.hang_every, self.hang_after_events = fail_every, hang_every, hang_after_events
        self.injected = {"5xx": 0, "hang": 0}
        self._completions = itertools.count(1)
        self._streams = itertools.count(1)
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.path}"

    def __enter__(self) -> FaultProxy:
        threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True).start()
        if not self._ready.wait(10):
            raise RuntimeError("fault proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop and self._stop:
            self._loop.call_soon_threadsafe(self._stop.set)

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as self._client:
            self._ready.set()
            await self._stop.wait()
        await runner.cleanup()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        completion = request.method == "POST" and request.path.endswith("/completions")
        if completion and self.fail_every and next(self._completions) % self.fail_every == 0:
            self.injected["5xx"] += 1
            error = {"error": {"message": "injected fault: upstream unavailable", "type": "ServiceUnavailable",
                               "code": 503}}
            return web.json_response(error, status=503)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        async with self._client.request(request.method, self.upstream_origin + request.path_qs, data=body,
                                        headers=headers, auto_decompress=False) as upstream:
            streamed = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
            hang = (completion and streamed and self.hang_every
                    and next(self._streams) % self.hang_every == 0)
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP})
            await response.prepare(request)
            pending, events = b"", 0
            async for chunk in upstream.content.iter_any():
                if not hang:
                    await response.write(chunk)
                    continue
                pending += chunk
                while b"\n\n" in pending and events < self.hang_after_events:
                    event, pending = pending.split(b"\n\n", 1)
                    await response.write(event + b"\n\n")
                    events += 1
                if events >= self.hang_after_events:
                    self.injected["hang"] += 1
                    assert self._stop is not None
                    await self._stop.wait()        # silent, connection open, until the client gives up
                    return response
            if pending:
                await response.write(pending)
            await response.write_eof()
            return response

