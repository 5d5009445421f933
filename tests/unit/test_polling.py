"""How long the targets' waits sleep (workflows/targets/polling.py) and how stale a release's metrics
are on Kubernetes (workflows/targets/kube/traffic.py export_lag_s). Nothing emulated: pure functions
over rendered overlays."""
from __future__ import annotations

import itertools

import pytest

from tests.kube_support import manifests, record  # noqa: F401 - fixture
from validation.server_metrics import RAY_METRICS_INTERVAL_ENV, RAY_METRICS_LAG_S
from workflows.targets import polling
from workflows.targets.kube.traffic import export_lag_s


def test_a_wait_looks_again_soon_then_every_poll_s():
    # client-go's wait.Backoff{Duration: 0.25 s, Factor: 2, Cap: poll_s}
    assert list(itertools.islice(polling.delays(5.0), 8)) == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]


def test_a_poll_shorter_than_the_first_step_is_kept():
    assert list(itertools.islice(polling.delays(0.05), 3)) == [0.05, 0.05, 0.05]


def test_a_minute_long_wait_asks_only_a_few_more_times_than_a_fixed_poll():
    looks = len(list(itertools.takewhile(lambda t: t < 60, itertools.accumulate(polling.delays(5.0)))))
    assert looks <= 60 / 5 + 4


@pytest.mark.parametrize("env", ["dev", "local"])
def test_the_base_sets_ray_to_export_every_two_seconds_and_the_lag_follows(manifests, env):  # noqa: F811
    assert export_lag_s(record(manifests, env)) == 2.5     # 2 s plus a quarter (Ray's 10 s showed 10.4 s)


def _interval(value: str | None, group: str | None = None):
    def edit(objects):
        rs = next(o for o in objects if o["kind"] == "RayService")
        for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
            if group not in (None, g["groupName"]):
                continue
            for c in g["template"]["spec"]["containers"]:
                env = [e for e in c.get("env") or [] if e["name"] != RAY_METRICS_INTERVAL_ENV]
                c["env"] = env + ([{"name": RAY_METRICS_INTERVAL_ENV, "value": value}] if value is not None else [])
    return edit


def test_a_render_without_the_setting_waits_out_rays_default(manifests):  # noqa: F811
    assert export_lag_s(record(manifests, "dev", edit=_interval(None))) == RAY_METRICS_LAG_S


def test_the_slowest_worker_group_decides(manifests):  # noqa: F811
    assert export_lag_s(record(manifests, "dev", edit=_interval("8000", "decode"))) == 10.0
    assert export_lag_s(record(manifests, "dev", edit=_interval(None, "prefill"))) == RAY_METRICS_LAG_S


def test_rays_one_second_floor_holds(manifests):  # noqa: F811
    assert export_lag_s(record(manifests, "dev", edit=_interval("100"))) == 1.25
