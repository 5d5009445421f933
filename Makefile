# Two commands do everything on a fresh machine (each runs the idempotent set-up first):
#   make release   the main job on the embedded default (overlays/local)
#   make test      the test suite (what CI runs via .ci/run)
.PHONY: setup release test test-e2e test-faults bench-render

setup:
	bash scripts/setup.sh

release: setup
	.venv/bin/pdops release --overlay overlays/local

test: setup
	.venv/bin/python -m pytest -q

# The real local P/D stack end to end: a release that promotes, one that rolls back (CI runs it).
test-e2e: setup
	.venv/bin/python -m pytest -q -m e2e tests/e2e/test_release_local.py

# Faults injected into the real stack (engines killed, never ready, pipeline killed, races).
test-faults: setup
	.venv/bin/python -m pytest -q -rP -m e2e tests/e2e/test_faults_local.py

bench-render: setup
	.venv/bin/python -m workflows.bench_render
