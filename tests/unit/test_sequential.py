"""The scheduled canary as a sequential test (validation/sequential.py): false alarms per 30 days of
48 runs a day, detection of a sustained slowdown, and what it says before it can judge."""
from __future__ import annotations

import math

import numpy as np
import pytest

from validation import sequential
from validation.reports.bench import BenchReport, Samples
from validation.sequential import CanaryConfig, RunStat, canary_decision

RUNS_PER_30_DAYS = 48 * 30


def test_false_alarms_per_30_days_match_the_cusum_run_length():
    """In control (stable unchanged, run-to-run noise only): Siegmund's approximation of the average run
    length at k 0.5, h 6 is about 2,570 runs, so 0.56 false alarms in 30 days of 48 runs; 400 simulated
    months land within Monte Carlo error of it (each run judged alone at 95 % would alarm 72 times)."""
    rng = np.random.default_rng(0)
    alarms = [len(sequential.cusum(rng.normal(0, 1, RUNS_PER_30_DAYS), 0.5, 6.0)[1]) for _ in range(400)]
    arl = (math.exp(2 * 0.5 * (6 + 1.166)) - 2 * 0.5 * (6 + 1.166) - 1) / (2 * 0.5 ** 2)
    assert RUNS_PER_30_DAYS / arl == pytest.approx(0.56, abs=0.01)
    assert 0.4 <= np.mean(alarms) <= 0.75, np.mean(alarms)


def test_a_sustained_ten_percent_slowdown_alarms_within_a_few_runs():
    rng = np.random.default_rng(1)
    sd = 0.03                     # run-to-run sd of the log p90 ratio
    calm = [RunStat(float(x)) for x in rng.normal(0, sd, 40)]
    assert not canary_decision(calm, CanaryConfig()).alarm
    slow, d = list(calm), None
    while d is None or not d.alarm and len(slow) < 50:
        slow.append(RunStat(math.log(1.1) + float(rng.normal(0, sd))))
        d = canary_decision(slow, CanaryConfig())
    n = len(slow) - len(calm)
    assert d.alarm and n <= 4 and "sustained slowdown: alarm" in d.message, (n, d.message)
    assert d.statistic > 6.0 and d.sigma == pytest.approx(sd, rel=0.4)


def test_before_the_spread_is_known_no_alarm_and_it_says_so():
    d = canary_decision([RunStat(0.5), RunStat(0.6)])
    assert not d.alarm and "not known before 8 runs" in d.message
    # with each run's own standard error it can start at once
    d = canary_decision([RunStat(0.5, se=0.05)] * 2)
    assert d.alarm and d.sigma == 0.05


def test_merge_keeps_blocks_when_both_runs_have_them():
    def run(block):
        return BenchReport(requests_total=2, requests_ok=2, errors=0,
                           samples=Samples(ttft=[1.0, 2.0], block=block, outcomes=[1, 1], outcome_block=block))
    m = sequential.merge_bench(run([0, 1]), run([2, 3]))
    assert m.samples.block == [0, 1, 2, 3] and m.samples.outcome_block == [0, 1, 2, 3]
    assert sequential.merge_bench(run([0, 1]), run(None)).samples.block is None
