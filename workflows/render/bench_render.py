"""Prints how long rendering every overlay takes (`make bench-render`): import once, then per overlay."""
from __future__ import annotations

import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    started = time.perf_counter()
    import ray.llm._internal.serve.serving_patterns.prefill_decode.builder  # noqa: F401

    from workflows.render.manifest import render
    from workflows.render.serve_config import validate_with_ray  # noqa: F401 - first import of Ray's models

    print(f"import of Ray Serve LLM config models: {time.perf_counter() - started:.2f} s (once per process)")
    total = 0.0
    for overlay in sorted(p for p in (ROOT / "overlays").iterdir() if (p / "kustomization.yaml").exists()):
        t = time.perf_counter()
        rendered = render(overlay)
        took = time.perf_counter() - t
        total += took
        print(f"render {overlay.name:<8} {len(rendered.objects)} objects  {took * 1000:7.1f} ms")
    print(f"all overlays: {total:.2f} s")


if __name__ == "__main__":
    main()
