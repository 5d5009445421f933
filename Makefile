# Two commands do everything on a fresh machine (each runs the idempotent set-up first):
#   make release   the main job on the embedded default (overlays/local)
#   make test      the test suite (what CI runs via .ci/run)
#   make lint      ruff, mypy and the import contracts over workflows/ and validation/ (CI runs it before the tests)
#   make docs      the manual: generated pages current, then `mkdocs build --strict` into build/site
.PHONY: setup release lint docs test test-argo test-rest ci-tiers rest-then-e2e test-e2e test-faults bench-render

setup:
	bash scripts/setup.sh

release: setup
	.venv/bin/pdops release --overlay overlays/local

# Rules, strictness and why: [tool.ruff], [tool.mypy] and [tool.importlinter] (layers that go one way,
# no cycles, validation/ importing nothing of workflows/) in pyproject.toml. Lint rules only: no formatter.
lint: setup
	.venv/bin/ruff check
	.venv/bin/mypy
	.venv/bin/lint-imports

# The manual (docs/, mkdocs.yml). Seconds: CI runs it before the tests. --strict fails on a broken link,
# a missing anchor or a page left out of nav; gen_docs --check on a stale CLI or schema page.
# NO_MKDOCS_2_WARNING: Material 9.8 prints a banner about its successor on every build.
docs: setup
	.venv/bin/python scripts/gen_docs.py --check
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet

# The suite as two processes side by side, each tier's output printed when it ends (-O): the Argo tier
# (tests/argo) mostly waits on its step pods and emulated cluster (measured under load: 59 s of CPU in a
# 276 s Argo test), so on 2 cores it overlaps the CPU-bound unit and integration tiers.
test: setup
	$(MAKE) --no-print-directory -j2 -O test-argo test-rest

test-argo: setup
	.venv/bin/python -m pytest -q tests/argo

test-rest: setup
	.venv/bin/python -m pytest -q tests/unit tests/integration

# CI's order (.ci/run): the Argo tier beside unit + integration and then the e2e release tests (the
# Argo tier is the longest single tier; the rest plus e2e is about as long, see docs/measurements.md).
# Rebalanced by estimate after the step image's venv was kept (issue 23): about 1280 s against 1310 s,
# closer than either estimate's error, so no test file moves from one process to the other.
ci-tiers: setup
	$(MAKE) --no-print-directory -j2 -O test-argo rest-then-e2e

rest-then-e2e: test-rest
	$(MAKE) --no-print-directory test-e2e

# The real local P/D stack end to end: a release that promotes, one that rolls back (CI runs it).
test-e2e: setup
	.venv/bin/python -m pytest -q -m e2e tests/e2e/test_release_local.py

# Faults injected into the real stack (engines killed, never ready, pipeline killed, races).
test-faults: setup
	.venv/bin/python -m pytest -q -rP -m e2e tests/e2e/test_faults_local.py

bench-render: setup
	.venv/bin/python -m workflows.render.bench_render
