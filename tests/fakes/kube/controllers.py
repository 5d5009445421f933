"""Two kube-controller-manager loops the target depends on, run every tick of the test cluster.

- EndpointSlice controller (pkg/controller/endpointslice): one slice `<svc>-fake` per Service with a
  selector, labelled `kubernetes.io/service-name`, listing the selected pods with an IP, each with
  conditions.ready (Ready condition, not terminating) and a targetRef to the pod.
- Disruption controller (pkg/controller/disruption/disruption.go): a PDB's status. With
  maxUnavailable or a percentage minAvailable, getExpectedScale needs each pod's controller to be
  a Deployment/ReplicaSet/StatefulSet/ReplicationController (or to have a scale subresource);
  for a pod owned by anything else (KubeRay's RayCluster) it fails with `found no controllers for
  pod "x"` and failSafe sets disruptionsAllowed=0 (condition DisruptionAllowed False, SyncFailed).
  An integer minAvailable counts the pods themselves: expected = matching pods, desiredHealthy =
  minAvailable, disruptionsAllowed = healthy - desiredHealthy (never below 0).
"""
from __future__ import annotations

from tests.fakes.kube.store import BY_KIND, ApiError, Store, now

SCALABLE = ("Deployment", "ReplicaSet", "StatefulSet", "ReplicationController")
SVC, POD, SLICE, PDB = (BY_KIND[k] for k in ("Service", "Pod", "EndpointSlice", "PodDisruptionBudget"))


def _selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _ready(pod: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in (pod.get("status") or {}).get("conditions") or []) \
        and not pod["metadata"].get("deletionTimestamp")


def endpoint_slices(store: Store) -> None:
    for svc in store.list(SVC, None)[0]:
        selector, ns = (svc.get("spec") or {}).get("selector"), svc["metadata"]["namespace"]
        if not selector:
            continue
        pods = [p for p in store.list(POD, ns)[0] if _selects(selector, p["metadata"].get("labels") or {})
                and (p.get("status") or {}).get("podIP")]
        endpoints = [{"addresses": [p["status"]["podIP"]], "conditions": {"ready": _ready(p), "terminating": bool(p["metadata"].get("deletionTimestamp"))},
                      "targetRef": {"kind": "Pod", "name": p["metadata"]["name"], "namespace": ns, "uid": p["metadata"]["uid"]}}
                     for p in sorted(pods, key=lambda p: p["metadata"]["name"])]
        name = f"{svc['metadata']['name']}-fake"
        body = {"metadata": {"name": name, "labels": {"kubernetes.io/service-name": svc["metadata"]["name"]},
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": svc["metadata"]["name"],
                                                  "uid": svc["metadata"]["uid"], "controller": True}]},
                "addressType": "IPv4", "endpoints": endpoints,
                "ports": [{"name": p.get("name", ""), "port": p.get("targetPort", p["port"]) if isinstance(p.get("targetPort"), int) else p["port"],
                           "protocol": "TCP"} for p in svc["spec"].get("ports") or []]}
        current = store.find(SLICE, ns, name)
        try:
            if current is None:
                store.create(SLICE, ns, body, "endpointslice-controller")
            elif current.get("endpoints") != endpoints:
                store.update(SLICE, ns, name, {**current, "endpoints": endpoints}, "endpointslice-controller")
        except ApiError as exc:
            if exc.code not in (404, 409):
                raise


def _since(pdb: dict, status: str) -> str:
    old = [c for c in (pdb.get("status") or {}).get("conditions") or [] if c.get("type") == "DisruptionAllowed"]
    return old[0]["lastTransitionTime"] if old and old[0].get("status") == status else now()


def disruption(store: Store) -> None:
    for pdb in store.list(PDB, None)[0]:
        ns, spec = pdb["metadata"]["namespace"], pdb.get("spec") or {}
        match = (spec.get("selector") or {}).get("matchLabels") or {}
        pods = [p for p in store.list(POD, ns)[0] if _selects(match, p["metadata"].get("labels") or {})]
        healthy = sum(1 for p in pods if _ready(p))
        status: dict
        if "maxUnavailable" in spec or isinstance(spec.get("minAvailable"), str):
            unmanaged = [p for p in pods if not any(r.get("controller") and r.get("kind") in SCALABLE
                                                    for r in p["metadata"].get("ownerReferences") or [])]
            if unmanaged:
                status = {"disruptionsAllowed": 0, "currentHealthy": healthy, "desiredHealthy": 0, "expectedPods": 0,
                          "conditions": [{"type": "DisruptionAllowed", "status": "False", "reason": "SyncFailed",
                                          "lastTransitionTime": _since(pdb, "False"),
                                          "message": f'found no controllers for pod "{unmanaged[0]["metadata"]["name"]}"'}]}
            else:  # not reached by pdops (KubeRay pods): scale of the controllers is not modelled
                status = {"disruptionsAllowed": 0, "currentHealthy": healthy, "expectedPods": len(pods)}
        else:
            desired = int(spec.get("minAvailable") or 0)
            allowed = max(0, healthy - desired) if pods else 0
            status = {"disruptionsAllowed": allowed, "currentHealthy": healthy, "desiredHealthy": desired,
                      "expectedPods": len(pods), "conditions": [{
                          "type": "DisruptionAllowed", "status": "True" if allowed else "False",
                          "reason": "SufficientPods" if allowed else "InsufficientPods", "message": "",
                          "lastTransitionTime": _since(pdb, "True" if allowed else "False")}]}
        status["observedGeneration"] = pdb["metadata"].get("generation")
        if pdb.get("status") != status:
            try:
                store.update(PDB, ns, pdb["metadata"]["name"], {**pdb, "status": status}, "disruption-controller", subresource="status")
            except ApiError as exc:
                if exc.code not in (404, 409):
                    raise
