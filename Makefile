# One entry point for humans and CI. `make test` does all set-up on a fresh machine.
PYTHON ?= python3
UV_VERSION := 0.13.9
TOOLS := .tools
UV := $(TOOLS)/bin/uv
VENV := .venv

.PHONY: test lint typecheck unit install chromium dev clean bench dist

$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet uv==$(UV_VERSION)

# The lock file is the contract: --frozen installs exactly what it pins, never re-resolves.
$(VENV)/.installed: $(UV) uv.lock pyproject.toml
	UV_PROJECT_ENVIRONMENT=$(VENV) $(UV) sync --frozen --all-extras
	touch $@

install: $(VENV)/.installed

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

typecheck: install
	$(VENV)/bin/mypy

unit: install
	$(VENV)/bin/pytest tests/unit

# The page's browser tests drive Debian's headless Chromium. When it is missing it is
# installed: as root or with sudo from Debian's package; without root, the package and the
# libraries this machine lacks are unpacked under .tools/chromium (scripts/chromium-local.sh).
# When neither can be done, make says so and goes on: the browser tests then fail, saying
# how to install it, and every other test runs.
chromium:
	@command -v chromium >/dev/null 2>&1 || [ -x $(TOOLS)/chromium/usr/lib/chromium/chromium ] || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q chromium; \
	  elif sudo -n true 2>/dev/null; then sudo apt-get update -q && sudo apt-get install -y -q chromium; \
	  else sh scripts/chromium-local.sh $(TOOLS)/chromium || \
	    echo "make: no Chromium (no root, no sudo, and apt could not download it): the page's browser tests will fail; install Debian's chromium package and run make test again." >&2; \
	  fi; }

# The suite waits on Postgres and real daemons far more than it computes: four workers
# (pytest-xdist), each with its own databases (and its own embedded server when no URL is set).
TEST_WORKERS ?= 4

test: lint typecheck chromium
	$(VENV)/bin/pytest -n $(TEST_WORKERS)

# Embedded PostgreSQL (data in .pg/, reused) unless WORKFLOW_RUNTIME_POSTGRES is set,
# a worker with the demo app, and the demo runs. DEV_ARGS=--exit-after-demo to stop after them.
dev: install
	$(VENV)/bin/lane-worker dev $(DEV_ARGS)

# Every speed target in one run against absurd-sdk and the raw loop (about 10 minutes; the
# SDK goes in a throwaway venv under /tmp). BENCH_ARGS=--url ... for another server.
bench: install
	$(VENV)/bin/python bench/all.py $(BENCH_ARGS)

# The wheel and the sdist a user installs (README "Install"), in $(DIST_DIR) (ignored by git).
# uv builds the sdist, then the wheel from the sdist: a file the sdist lacks fails the build.
DIST_DIR ?= dist

dist: $(UV)
	rm -f $(DIST_DIR)/lane_worker-*.whl $(DIST_DIR)/lane_worker-*.tar.gz
	$(UV) build --out-dir $(DIST_DIR) .

clean:
	rm -rf $(VENV) $(TOOLS) dist .mypy_cache .ruff_cache .pytest_cache .hypothesis
	rm -rf clients/typescript/node_modules clients/typescript/dist clients/typescript/build
