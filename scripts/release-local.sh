#!/usr/bin/env bash
# The main job on the embedded default. The local target (Ray P/D on this machine) is not built
# yet, so this stops after build-config + render + check, and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
run="runs/$(date -u +%Y%m%dT%H%M%SZ)-local"
mkdir -p "$run"
echo "[release] 1/3 build-config overlays/local -> $run/serve-config.yaml" >&2
.venv/bin/pdops build-config overlays/local > "$run/serve-config.yaml"
echo "[release] 2/3 render overlays/local -> $run/manifest.yaml" >&2
.venv/bin/pdops render overlays/local -o "$run/manifest.yaml"
echo "[release] 3/3 check $run/manifest.yaml" >&2
.venv/bin/pdops check -f "$run/manifest.yaml"
echo "[release] stopped after render+check: the local target (rollout/validate/promote) is not built yet (issue 4)" >&2
echo "[release] run folder: $run" >&2
