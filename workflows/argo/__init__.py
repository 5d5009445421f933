"""The Argo side, built with Hera: pd-release and pd-canary (definitions.py), Argo Events (events.py), and the
pipeline's RBAC (rbac.py). Nothing here talks to a cluster; every step runs `pdops` (workflows/cli)."""
