"""An engine's /metrics with figures the test sets, and a restart that zeroes them, as a vLLM process
that is replaced does: its counters start again from 0 under the same labels. For the Prometheus
source's counter-reset case (tests/integration/test_prometheus_source.py).

    with RestartingEngine() as eng:
        eng.observe([0.05, 0.3])   # two requests' TTFT (s)
        eng.restart()
        eng.url                    # http://127.0.0.1:PORT/metrics
"""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.fakes.known_timing_server import BUCKETS


class RestartingEngine:
    def __init__(self) -> None:
        self.ttft: list[float] = []
        self.kv_tokens = 0
        self.nixl_failures = 0
        self._lock = threading.Lock()
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = engine.text().encode()
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.target = f"127.0.0.1:{self.server.server_address[1]}"

    def observe(self, ttft: list[float], kv_tokens: int = 0, nixl_failures: int = 0) -> None:
        with self._lock:
            self.ttft += ttft
            self.kv_tokens += kv_tokens
            self.nixl_failures += nixl_failures

    def restart(self) -> None:
        with self._lock:
            self.ttft, self.kv_tokens, self.nixl_failures = [], 0, 0

    def text(self) -> str:
        with self._lock:
            vals, kv, nf = list(self.ttft), self.kv_tokens, self.nixl_failures
        name = "vllm:time_to_first_token_seconds"
        out = [f"# TYPE {name} histogram"]
        out += [f'{name}_bucket{{le="{le}"}} {sum(v <= le for v in vals)}' for le in BUCKETS]
        out += [f'{name}_bucket{{le="+Inf"}} {len(vals)}', f"{name}_sum {sum(vals)}", f"{name}_count {len(vals)}",
                "# TYPE vllm:prompt_tokens_by_source counter",
                f'vllm:prompt_tokens_by_source_total{{source="external_kv_transfer"}} {kv}',
                "# TYPE vllm:nixl_num_failed_transfers counter",
                f"vllm:nixl_num_failed_transfers_total {nf}"]
        return "\n".join(out) + "\n"

    def __enter__(self) -> RestartingEngine:
        threading.Thread(target=self.server.serve_forever, name="restarting-engine", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
