"""Where a release runs: the Target protocol (base.py), local (local.py) and Kubernetes (kubernetes.py, kube/)."""
