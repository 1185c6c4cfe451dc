PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_DIR ?= outputs/demo

.PHONY: install test lint demo bench clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

# ruff's rules are in pyproject.toml ([tool.ruff]); lint reports, it never rewrites files
lint: $(STAMP)
	$(PY) -m ruff check .

demo: $(STAMP)
	$(PY) tools/demo.py --out $(DEMO_DIR)

bench: $(STAMP)
	$(PY) benchmarks/run_all.py --quick

clean:
	rm -rf $(VENV) outputs lightning_logs .pytest_cache
