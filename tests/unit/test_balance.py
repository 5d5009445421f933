"""Phase balance (validation/balance.py) on the known-timing fake made to queue on one side: its
engines export per-phase series as Ray Serve LLM's do (tests/fakes/pd_queues.py), the benchmark
samples their gauges during the load, and the verdict names the side that was set short."""
from __future__ import annotations

import pytest

from tests.fakes.known_timing_server import KnownTimingServer
from tests.fakes.pd_queues import PDQueues
from validation import profiles
from validation.balance import Balance, judge, markdown_lines
from validation.bench import BenchConfig, run_bench
from validation.config import BalancePolicy
from validation.reports.bench import BenchReport

CASES = {
    # one prefill slot of 50 ms against 12 in flight: requests wait for prefill
    "prefill-bound": (PDQueues(prefill_slots=1, decode_slots=16, prefill_s=0.05), profiles.custom(64, 8)),
    # two decode slots (KV room) for 32-token answers: requests wait for decode
    "decode-bound": (PDQueues(prefill_slots=8, decode_slots=2, prefill_s=0.005, transfer_s=0.01),
                     profiles.custom(8, 32)),
    # room on both sides; 32-token answers keep the window near 0.8 s so the 0.2 s gauge sampler gets
    # >= 2 samples even on a loaded CI machine (8-token answers gave a 0.22 s window: 1 sample, flaky)
    "balanced": (PDQueues(prefill_slots=8, decode_slots=16, prefill_s=0.005), profiles.custom(8, 32)),
}


def bench(pd: PDQueues, prof, interval: float = 0.2, policy: BalancePolicy | None = None,
          phases: bool = True) -> BenchReport:
    with KnownTimingServer(first_token_delay=0.0, inter_token_delay=0.005, tokens=64, pd=pd) as srv:
        return run_bench(BenchConfig(srv.base_url, "fake-model", prof, concurrency=12, requests=60,
                                     metrics_url=srv.base_url[:-3] + "/metrics", metrics_phases=pd.phases if phases else None,
                                     sample_interval_s=interval, balance_policy=policy))


@pytest.mark.parametrize("verdict", list(CASES))
def test_verdict_names_the_side_that_was_set_short(verdict):
    pd, prof = CASES[verdict]
    b = bench(pd, prof)
    bal = Balance.model_validate(b.balance)
    assert bal.verdict == verdict, bal.reasons
    for name, p in bal.phases.items():
        assert p.engines == 1 and p.waiting_from == "gauges" and p.gauge_samples >= 2
        assert p.requests == 60          # every request went through both phases' histograms
    if verdict == "balanced":
        assert bal.suggestion is None and all(not p.queues for p in bal.phases.values())
        return
    side = verdict.split("-")[0]
    other = "decode" if side == "prefill" else "prefill"
    assert bal.phases[side].waiting_per_engine >= 5.0 > bal.phases[other].waiting_per_engine
    # the sampled gauges and Little's law on the queue-time histogram agree on how many waited
    assert bal.phases[side].waiting_mean == pytest.approx(bal.phases[side].waiting_little, rel=0.35)
    assert bal.suggestion.phase == side and bal.suggestion.replicas >= 2
    # throughput: prefill engines count prompt tokens, decode engines generated tokens (the counters,
    # not their deprecated gauge copies: 60 requests x 64 prompt words over the window)
    pre = bal.phases["prefill"]
    assert pre.prompt_tokens_per_s * pre.window_s == pytest.approx(60 * prof.prompt_tokens, rel=0.05)
    assert bal.phases["decode"].itl_ms_p90 is not None and bal.phases["prefill"].itl_ms_p90 is None
    lines = "\n".join(markdown_lines([("#0", b)]))
    assert f"**{verdict}**" in lines and f"advice: {side} 1 -> {bal.suggestion.replicas} replicas" in lines


def test_without_gauge_samples_littles_law_decides():
    pd, prof = CASES["decode-bound"]
    bal = Balance.model_validate(bench(pd, prof, interval=600).balance)
    assert bal.verdict == "decode-bound"
    assert {p.waiting_from for p in bal.phases.values()} == {"queue-time histogram"}


def test_threshold_comes_from_the_policy():
    pd, prof = CASES["prefill-bound"]
    bal = Balance.model_validate(bench(pd, prof, policy=BalancePolicy(queue_per_engine=50)).balance)
    assert bal.verdict == "balanced" and bal.phases["prefill"].pressure < 1


def test_a_run_without_per_phase_metrics_has_no_balance():
    pd, prof = CASES["prefill-bound"]
    assert "balance" not in bench(pd, prof, phases=False)


def test_both_sides_queueing_names_the_worse_one():
    base = dict(engines=1, window_s=10.0, gauge_samples=5, running_mean=2.0)
    bal = judge({"prefill": {**base, "phase": "prefill", "waiting_mean": 12.0},
                 "decode": {**base, "phase": "decode", "waiting_mean": 6.0, "kv_usage_mean": 0.5}})
    assert bal.verdict == "prefill-bound" and bal.reasons[0].startswith("both phases queue")
    assert bal.suggestion.replicas == 7      # 1 x (2 running + 12 waiting) / 2
    even = judge({"prefill": {**base, "phase": "prefill", "waiting_mean": 6.0},
                  "decode": {**base, "phase": "decode", "waiting_mean": 6.0}})
    assert even.verdict == "balanced" and "short of both" in even.reasons[0]


def test_engines_are_counted_per_replica_and_waiting_is_per_engine():
    pd = PDQueues(prefill_engines=2, decode_engines=3, prefill_slots=1, decode_slots=16, prefill_s=0.05)
    bal = Balance.model_validate(bench(pd, profiles.custom(64, 8)).balance)
    pre = bal.phases["prefill"]
    assert (pre.engines, bal.phases["decode"].engines) == (2, 3)
    assert pre.waiting_per_engine == pytest.approx(pre.waiting_mean / 2)


def test_per_pod_sources_tagged_by_phase_give_the_same_verdict():
    """The Kubernetes target's shape: each worker pod's metrics agent is a source tagged #prefill or #decode."""
    pd, prof = CASES["decode-bound"]
    with KnownTimingServer(first_token_delay=0.0, inter_token_delay=0.005, tokens=64, pd=pd) as srv:
        root = srv.base_url[:-3]
        b = run_bench(BenchConfig(srv.base_url, "fake-model", prof, concurrency=12, requests=60, sample_interval_s=0.2,
                                  metrics_url=f"{root}/metrics/prefill#prefill,{root}/metrics/decode#decode"))
    bal = Balance.model_validate(b.balance)
    assert bal.verdict == "decode-bound" and {p.engines for p in bal.phases.values()} == {1}
    assert bal.phases["decode"].waiting_from == "gauges" and bal.phases["decode"].requests == 60
