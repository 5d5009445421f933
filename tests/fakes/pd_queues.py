"""A prefill/decode pair with known capacity for the known-timing fake: each request takes a prefill
slot for `prefill_s`, then a decode slot (its KV room) for its output tokens; with too few slots on
one side requests wait there, first come first served. /metrics then shows what Ray Serve LLM's
engines export (vllm/v1/metrics/ray_wrappers.py: vLLM's names with ':' -> '_', Ray's `ray_` prefix,
`_total` on counters plus the deprecated gauge copy without it (ray/_private/metrics_agent.py),
and the tags model_name, engine, ReplicaId and Ray's own WorkerId, Component, NodeAddress,
SessionName, Version), so the scrape, the phase split and the balance verdict read real shapes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.08, 0.1, 0.2, 0.5, 1.0)


@dataclass
class _Req:
    received: float
    prefill: tuple[int, float, float]          # engine, start, end
    decode: tuple[int, float, float, float]     # engine, slot taken, running from, end
    prompt_tokens: int
    output_tokens: int
    itl: float


@dataclass
class PDQueues:
    prefill_engines: int = 1
    decode_engines: int = 1
    prefill_slots: int = 1       # requests one prefill engine runs at once
    decode_slots: int = 8        # sequences one decode engine holds at once (its KV room)
    prefill_s: float = 0.05      # one request's prefill
    transfer_s: float = 0.0      # KV arrival after the decode slot is taken ("deferred" waiting)
    model: str = "fake-model"
    app: str = "pd-llm-blue"
    reqs: list[_Req] = field(default_factory=list)
    _pfree: list[list[float]] = field(default_factory=list)
    _dfree: list[list[float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._pfree = [[0.0] * self.prefill_slots for _ in range(self.prefill_engines)]
        self._dfree = [[0.0] * self.decode_slots for _ in range(self.decode_engines)]

    def replica(self, phase: str, engine: int) -> str:
        return f"{self.app}#{'Prefill' if phase == 'prefill' else 'Decode'}:{self.model}#{phase[0]}{engine}"

    @property
    def phases(self) -> dict[str, dict[str, list[str]]]:
        """The label selection of each phase's engines (what the local target's endpoint gives)."""
        return {"prefill": {"ReplicaId": [self.replica("prefill", e) for e in range(self.prefill_engines)]},
                "decode": {"ReplicaId": [self.replica("decode", e) for e in range(self.decode_engines)]}}

    @staticmethod
    def _earliest(free: list[list[float]]) -> tuple[int, int]:
        return min(((e, s) for e in range(len(free)) for s in range(len(free[e]))), key=lambda es: free[es[0]][es[1]])

    def admit(self, received: float, prompt_tokens: int, output_tokens: int, itl: float) -> float:
        """Reserve the request's slots; returns its first token's offset from `received`."""
        pe, ps = self._earliest(self._pfree)
        p_start = max(received, self._pfree[pe][ps])
        p_end = self._pfree[pe][ps] = p_start + self.prefill_s
        de, ds = self._earliest(self._dfree)
        taken = max(p_end, self._dfree[de][ds])
        running = taken + self.transfer_s
        end = self._dfree[de][ds] = running + max(0, output_tokens - 1) * itl
        self.reqs.append(_Req(received, (pe, p_start, p_end), (de, taken, running, end), prompt_tokens,
                              output_tokens, itl))
        return running - received

    # ---- /metrics ------------------------------------------------------------------------------
    def metrics_text(self, now: float | None = None, phase: str | None = None) -> str:
        """Every engine's series, or one phase's (as one Kubernetes worker pod's metrics agent shows)."""
        now = time.perf_counter() if now is None else now
        out: list[str] = []
        for name, engines in (("prefill", self.prefill_engines), ("decode", self.decode_engines)):
            if phase not in (None, name):
                continue
            for e in range(engines):
                out += self._engine(name, e, now)
        return "\n".join(out) + "\n"

    def _labels(self, phase: str, engine: int, **extra: str) -> str:
        tags = {"Component": "core_worker", "NodeAddress": "127.0.0.1", "ReplicaId": self.replica(phase, engine),
                "SessionName": "session_fake", "Version": "2.60.0", "WorkerId": f"{phase[0]}{engine:02d}ab",
                "engine": "0", "model_name": self.model, **extra}
        return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(tags.items())) + "}"

    def _engine(self, phase: str, engine: int, now: float) -> list[str]:
        lab = lambda **x: self._labels(phase, engine, **x)  # noqa: E731
        mine = [r for r in self.reqs if (r.prefill if phase == "prefill" else r.decode)[0] == engine]
        if phase == "prefill":
            spans = [(r.received, r.prefill[1], r.prefill[1], r.prefill[2]) for r in mine]  # arrived, taken, runs, ends
            slots = self.prefill_slots
        else:
            spans = [(r.prefill[2], r.decode[1], r.decode[2], r.decode[3]) for r in mine]
            slots = self.decode_slots
        capacity = sum(1 for a, t, _, _ in spans if a <= now < t)
        deferred = sum(1 for _, t, run, _ in spans if t <= now < run)
        running = sum(1 for _, _, run, end in spans if run <= now < end)
        held = sum(1 for _, t, _, end in spans if t <= now < end)
        out = [f"ray_vllm_num_requests_running{lab()} {running}",
               f"ray_vllm_num_requests_waiting{lab()} {capacity + deferred}",
               f'ray_vllm_num_requests_waiting_by_reason{lab(reason="capacity")} {capacity}',
               f'ray_vllm_num_requests_waiting_by_reason{lab(reason="deferred")} {deferred}',
               f"ray_vllm_kv_cache_usage_perc{lab()} {held / slots}"]
        queued = [run - a for a, _, run, _ in spans if run <= now]
        inference = [end - run for _, _, run, end in spans if end <= now]
        out += _histogram("ray_vllm_request_queue_time_seconds", lab, queued, QUEUE_BUCKETS)
        out += _histogram("ray_vllm_request_inference_time_seconds", lab, inference, QUEUE_BUCKETS)
        out += _histogram("ray_vllm_time_to_first_token_seconds", lab,
                          [run - r.received for r, (_, _, run, _) in zip(mine, spans) if run <= now], QUEUE_BUCKETS)
        if phase == "prefill":
            prompt = sum(r.prompt_tokens for r, (_, _, _, end) in zip(mine, spans) if end <= now)
            generated = sum(1 for _, _, _, end in spans if end <= now)   # P/D's prefill leg: max_tokens=1
            itl: list[float] = []
        else:
            started = [(r, run) for r, (_, _, run, _) in zip(mine, spans) if run <= now]
            prompt = 0
            generated = sum(min(r.output_tokens, 1 + int((now - run) / r.itl) if r.itl else r.output_tokens)
                            for r, run in started)
            itl = [r.itl for r, run in started for _ in range(min(r.output_tokens, 1 + int((now - run) / r.itl)) - 1)] \
                if all(r.itl for r, _ in started) else []
            kv = sum(r.prompt_tokens for r, _ in started)
            out += [f'ray_vllm_prompt_tokens_by_source_total{lab(source="external_kv_transfer")} {kv}',
                    f'ray_vllm_prompt_tokens_by_source{lab(source="external_kv_transfer")} {kv}']
        out += _histogram("ray_vllm_inter_token_latency_seconds", lab, itl, ITL_BUCKETS)
        for name, value in (("prompt_tokens", prompt), ("generation_tokens", generated)):
            out += [f"ray_vllm_{name}_total{lab()} {value}", f"ray_vllm_{name}{lab()} {value}"]
        return out


def _histogram(name: str, lab, values: list[float], buckets: tuple[float, ...]) -> list[str]:
    out = [f'{name}_bucket{lab(le=str(b))} {sum(v <= b for v in values)}' for b in buckets]
    return out + [f'{name}_bucket{lab(le="+Inf")} {len(values)}', f"{name}_sum{lab()} {sum(values)}",
                  f"{name}_count{lab()} {len(values)}"]
