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

# The browser test drives Debian's Chromium (never a browser download); a CJK font makes its screenshots legible.
install: $(VENV)/.installed
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
				chromium chromium-driver fonts-wqy-zenhei; \
		else \
			echo "note: no /usr/bin/chromium and not root: the browser test will skip"; \
		fi; \
	fi

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
	$(VENV)/bin/brain --home $(DEMO_HOME) serve --port 7860

bench: install
	$(PY) bench/sync_bench.py

clean:
	rm -rf $(VENV) $(DEMO_HOME) .pytest_cache
