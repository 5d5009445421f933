"""The Kubernetes target, one concern per module.

- api.py: Kubernetes API calls with typed errors (NotFound, Conflict, Forbidden, Invalid)
- lease.py: the release lock (client-go leader election semantics)
- capacity.py: will the candidate's pods fit, node by node
- history.py: the history ConfigMap, bounded in bytes
- objects.py: what is applied for a release in a colour (RayService, PDBs, stable Service)
- readiness.py: what a RayService's status says; why pods are not serving
- traffic.py: endpoints and metrics sources of a colour; draining on promote
- slots.py: rollout, promote, rollback
- target.py: KubernetesTarget
"""
