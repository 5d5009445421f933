# Two commands do everything on a fresh machine (each runs the idempotent set-up first):
#   make release   the main job on the embedded default (overlays/local)
#   make test      the test suite (what CI runs via .ci/run)
.PHONY: setup release test bench-render

setup:
	bash scripts/setup.sh

release: setup
	.venv/bin/pdops release --overlay overlays/local

test: setup
	.venv/bin/python -m pytest -q

bench-render: setup
	.venv/bin/python -m workflows.bench_render
