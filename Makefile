PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_DIR ?= outputs/demo
# a wheel index for torch/torchvision installed before everything else, e.g. the CPU-only builds:
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cpu
# (empty: torch comes from the default index, as before; applies when .venv is created)
TORCH_INDEX ?=

.PHONY: install browser test test-fast lint demo bench clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
ifneq ($(strip $(TORCH_INDEX)),)
	$(PY) -m pip install -q torch torchvision --index-url $(TORCH_INDEX)
endif
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# the web app's browser tests drive Debian's chromium: installed with apt when missing and root (else they skip, saying how)
browser:
	@scripts/install_test_browser.sh

# two pytest worker processes (pytest-xdist), one torch thread each: tests/conftest.py says why; a file's tests
# stay on one worker (--dist loadfile), so its module fixtures (trained checkpoints) are built once; files go out
# in the suite's order, the long ones first (--no-loadscope-reorder: tests/conftest.py says why)
WORKERS ?= 2
XDIST := -n $(WORKERS) --dist loadfile --no-loadscope-reorder

test: $(STAMP) browser
	$(PY) -m pytest -q $(XDIST) --durations=30 $(PYTEST_ARGS)

# the inner loop: the unit tiers only (CI runs everything through `make test`); tests/README.md lists the tiers
test-fast: $(STAMP)
	$(PY) -m pytest -q $(XDIST) -m "not slow and not integration" $(PYTEST_ARGS)

# ruff's rules and the import-linter layer contracts are in pyproject.toml; lint reports, it never rewrites files
lint: $(STAMP)
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports

demo: $(STAMP)
	$(PY) tools/demo.py --out $(DEMO_DIR)

bench: $(STAMP)
	$(PY) benchmarks/run_all.py --quick

clean:
	rm -rf $(VENV) outputs lightning_logs .pytest_cache
