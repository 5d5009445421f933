"""The Kubernetes target's selection of a slot in the environment's Prometheus (spec
`metrics.prometheus_url`, validation/prometheus.py): the labels the candidate's endpoint names are
the ones the applied PodMonitor's relabelling puts on every series of exactly that colour's engine
pods, with their phase (prometheus-operator promcfg.go: podTargetLabels -> sanitizeLabelName)."""
from __future__ import annotations

import re
from pathlib import Path

from tests.kube_support import LOCAL_NS, Lines, live, record, target
from workflows.names import COLOUR_LABEL, PHASE_LABEL
from workflows.render.manifest import dump_manifest, render
from workflows.targets.base import ReleaseRecord
from workflows.targets.kube.objects import release_objects
from workflows.targets.kube.traffic import prom_label

ROOT = Path(__file__).resolve().parents[2]


def test_the_applied_podmonitor_carries_colour_and_phase_onto_every_series():
    prod = render(ROOT / "overlays" / "prod", validate_serve_config=False)
    rec = ReleaseRecord.of(dump_manifest(prod.objects), name="pd-llm", model=prod.spec.model.id, revision="a" * 40)
    rec.colour = "green"
    monitor = next(o for o in release_objects(rec, "llm-prod") if o["kind"] == "PodMonitor")
    assert monitor["spec"]["podTargetLabels"] == [COLOUR_LABEL, PHASE_LABEL]


def test_the_candidate_endpoint_selects_its_own_engine_pods_by_their_labels(cluster, manifests):
    t = target(cluster)
    t.apply(record(manifests), Lines())
    endpoint = t.wait_ready(30, Lines())
    colour = t.status().candidate.release.colour
    assert endpoint.prometheus_labels == {"namespace": LOCAL_NS, "pdops_dev_colour": colour}
    assert endpoint.prometheus_phase_label == "pdops_dev_phase"
    # each worker pod's target labels, as the PodMonitor's relabelling makes them
    workers = [p for p in live(cluster, "pods").values() if p["metadata"]["labels"].get("ray.io/node-type") == "worker"]
    assert workers
    for pod in workers:
        labels = {prom_label(k): v for k, v in pod["metadata"]["labels"].items()}
        labels["namespace"] = pod["metadata"]["namespace"]
        assert all(labels.get(k) == v for k, v in endpoint.prometheus_labels.items()), labels
        assert labels[endpoint.prometheus_phase_label] in {"prefill", "decode"}
    assert {prom_label(k) for k in (COLOUR_LABEL, PHASE_LABEL)} == {"pdops_dev_colour", "pdops_dev_phase"}
    assert all(re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", k) for k in endpoint.prometheus_labels)


def test_the_spec_takes_a_prometheus_url_and_names_a_bad_one():
    import pytest
    import yaml

    from workflows.errors import InputError
    from workflows.spec.release import parse_spec

    data = yaml.safe_load((ROOT / "overlays" / "prod" / "release.yaml").read_text())
    assert parse_spec(data, "release.yaml").metrics.prometheus_url is None
    data["metrics"] = {"prometheus_url": "http://prometheus-operated.monitoring.svc:9090"}
    assert parse_spec(data, "release.yaml").metrics.prometheus_url == "http://prometheus-operated.monitoring.svc:9090"
    data["metrics"] = {"prometheus_url": "prometheus-operated:9090"}
    with pytest.raises(InputError, match=r"metrics\.prometheus_url"):
        parse_spec(data, "release.yaml")
