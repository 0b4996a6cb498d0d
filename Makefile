VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
DEMO_HOME ?= .brain-demo
export GRADIO_ANALYTICS_ENABLED = False
export ANONYMIZED_TELEMETRY = False

.PHONY: install test test-slow lint demo bench clean

$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -c constraints.txt -e '.[dev]'
	touch $@

install: $(VENV)/.installed

lint: install
	$(VENV)/bin/ruff check .

test: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q

# Ingests the real vaults in ../shared (skips when absent).
test-slow: install
	$(VENV)/bin/pytest -q -m slow -s

demo: install
	$(VENV)/bin/brain --home $(DEMO_HOME) sync --vault sample_vault
	$(VENV)/bin/brain --home $(DEMO_HOME) status

bench: install
	$(PY) bench/sync_bench.py

clean:
	rm -rf $(VENV) $(DEMO_HOME) .pytest_cache
