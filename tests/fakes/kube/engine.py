"""A RayCluster's Serve application in the test cluster: OpenAI API plus per-node metrics as Ray exports them.

The application is a `KnownTimingServer` (tests/fakes/known_timing_server.py) reached through the
Serve proxy of every serving pod (pod:8000). Metrics follow Ray's layout, which is what pdops
must cope with on EKS: each Ray node (pod) runs a metrics agent on :8080 that exports only the
processes on that node. The vLLM engines run on the worker pods, so `ray_vllm_*` series appear
only on workers, each engine's under its own ReplicaId; the head pod exports node and Serve
metrics, never an engine's. Names as vLLM's Ray stat logger makes them (vllm/v1/metrics/
ray_wrappers.py: `vllm:x` sanitised to `vllm_x`; Ray prefixes `ray_`).

Which engine saw a request: P/D sends every request through one prefill engine (max_tokens=1,
kv_producer) and one decode engine (kv_consumer, the prompt's KV arrives by NIXL), so each
request is recorded by one engine of each phase, chosen round robin among the live ones. A
replaced pod starts with empty series (new ReplicaId), as a restarted engine does. An aggregated
application (`build_openai_app`, the single-engine reference) computes the prompt itself: its
prompt tokens are `local_compute`, none arrive by KV transfer.

`server`: the OpenAI fake's class (default KnownTimingServer; tests/fakes/diff_fake.py DiffFake
answers with token ids that are a function of the request, as one model's greedy or seeded answers
are, so a P/D candidate and the reference agree), `plant`: a DiffFake divergence.
"""
from __future__ import annotations

import itertools
import threading
from typing import Any

from tests.fakes.known_timing_server import BUCKETS, KnownTimingServer

PROMPT_TOKENS = 8  # per request, counted as arriving by KV transfer on the decode engine


class EngineApp:
    def __init__(self, model: str, first_token_delay: float = 0.02, inter_token_delay: float = 0.005, tokens: int = 8,
                 server: type[KnownTimingServer] = KnownTimingServer, **extra: Any) -> None:
        self.server = server(first_token_delay=first_token_delay, inter_token_delay=inter_token_delay,
                             tokens=tokens, model=model, **extra).start()
        self.assigned: dict[str, list[str]] = {}   # pod name -> request ids its engine recorded
        self._seen: set[str] = set()
        self._rr = itertools.count()
        self._lock = threading.Lock()

    @property
    def address(self) -> tuple[str, int]:
        return self.server.host, self.server.port

    def stop(self) -> None:
        self.server.stop()

    def assign(self, phases: dict[str, list[str]]) -> None:
        """Give every request not yet recorded to one live engine pod of each phase."""
        with self._lock:
            for rid in [r for r in list(self.server.timings) if r not in self._seen]:
                if not self.server.timings[rid]["content"]:
                    continue  # no token yet: recorded when it has one
                self._seen.add(rid)
                n = next(self._rr)
                for pods in phases.values():
                    if pods:
                        self.assigned.setdefault(pods[n % len(pods)], []).append(rid)

    def metrics(self, pod: str, phase: str | None, pod_ip: str, replica: str, model: str, aggregated: bool = False) -> str:
        """What Ray's metrics agent on `pod` exports."""
        node = f'NodeAddress="{pod_ip}",SessionName="session_fake",Version="2.60.0"'
        out = ["# TYPE ray_node_cpu_utilization gauge", f"ray_node_cpu_utilization{{{node},instance=\"{pod}\"}} 3.0"]
        if phase is None:  # the head: Serve's controller and proxy, no engine
            return "\n".join(out + ["# TYPE ray_serve_num_http_requests_total counter",
                                    f'ray_serve_num_http_requests_total{{{node},application="pd-llm"}} {len(self._seen)}']) + "\n"
        rids = list(self.assigned.get(pod, []))
        ttft, itl, tpot = [], [], []
        for rid in rids:
            t = self.server.timings.get(rid) or {}
            content, tokens = t.get("content") or [], t.get("tokens") or []
            if not content:
                continue
            ttft.append(content[0] - t["received"])
            if phase == "decode" or aggregated:
                itl += [(b - a) / m for (a, b), m in zip(zip(content, content[1:]), tokens[1:])]
                if sum(tokens) > 1:
                    tpot.append((content[-1] - content[0]) / (sum(tokens) - 1))
        engine = f'{node},ReplicaId="{replica}",WorkerId="{abs(hash(pod)):x}",model_name="{model}",engine="0"'
        for name, vals in (("time_to_first_token_seconds", ttft), ("inter_token_latency_seconds", itl),
                           ("request_time_per_output_token_seconds", tpot)):
            metric = f"ray_vllm_{name}"
            out.append(f"# TYPE {metric} histogram")
            out += [f'{metric}_bucket{{{engine},le="{le}"}} {sum(v <= le for v in vals)}' for le in BUCKETS]
            out += [f'{metric}_bucket{{{engine},le="+Inf"}} {len(vals)}', f"{metric}_sum{{{engine}}} {sum(vals)}",
                    f"{metric}_count{{{engine}}} {len(vals)}"]
        source = "external_kv_transfer" if phase == "decode" and not aggregated else "local_compute"
        out += ["# TYPE ray_vllm_prompt_tokens_by_source_total counter",
                f'ray_vllm_prompt_tokens_by_source_total{{{engine},source="{source}"}} {PROMPT_TOKENS * len(ttft)}',
                "# TYPE ray_vllm_nixl_num_failed_transfers_total counter",
                f"ray_vllm_nixl_num_failed_transfers_total{{{engine}}} 0"]
        return "\n".join(out) + "\n"
