"""The PodMonitor in the form that labels every scraped series with its slot: `podTargetLabels`
`pdops.dev/colour` and `pdops.dev/phase`.

prometheus-operator turns each name in a PodMonitor's `podTargetLabels` into one relabelling of the
scrape config it generates (pkg/prometheus/promcfg.go generatePodMonitorConfig: source
`__meta_kubernetes_pod_label_<sanitizeLabelName(l)>`, regex `(.+)`, target `sanitizeLabelName(l)`), so
the pod's own label value lands on every series of that pod as `pdops_dev_colour` / `pdops_dev_phase`;
a pod without the label (the head has no phase) gets none, and is still scraped. The Prometheus
metrics source (validation/prometheus.py) and the kubernetes target's slot selection
(targets/kube/traffic.py) select a colour's engines by these labels.

The list names labels, not values: the colour is set per slot at apply time on every pod template
(targets/kube/objects.py), the phase is in kustomize/base's worker templates. So `pdops render`
emits this form (the monitoring component carries it, and render() adds it to any other PodMonitor
an overlay brings) and the Kubernetes target applies the PodMonitor unchanged: a render applied
with kubectl, Argo CD or Flux gives the same series labels.
"""
from __future__ import annotations

from typing import Any

from workflows.names import COLOUR_LABEL, PHASE_LABEL

SLOT_TARGET_LABELS = (COLOUR_LABEL, PHASE_LABEL)


def with_slot_labels(podmonitor: dict[str, Any]) -> bool:
    """Add the missing SLOT_TARGET_LABELS to `spec.podTargetLabels`, in place, after any the
    PodMonitor already lists. True when it changed anything."""
    if not isinstance(podmonitor.get("spec"), dict):
        podmonitor["spec"] = {}
    labels = podmonitor["spec"].get("podTargetLabels") or []
    missing = [label for label in SLOT_TARGET_LABELS if label not in labels]
    podmonitor["spec"]["podTargetLabels"] = [*labels, *missing]
    return bool(missing)
