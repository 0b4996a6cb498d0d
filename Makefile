VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
DEMO_HOME ?= .brain-demo
PORT ?= 7860
export GRADIO_ANALYTICS_ENABLED = False
export ANONYMIZED_TELEMETRY = False

.PHONY: install test test-slow lint demo bench clean screenshots

$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -c constraints.txt -e '.[dev]'
	touch $@

# The browser test drives Debian's Chromium (never a browser download); a CJK font makes its screenshots legible.
# The team-deployment tests start a PostgreSQL server of their own: Debian's `postgresql`, whatever major version.
install: $(VENV)/.installed
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
				chromium chromium-driver fonts-wqy-zenhei; \
		else \
			echo "note: no /usr/bin/chromium and not root: the browser test will skip"; \
		fi; \
	fi
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql; \
		else \
			echo "note: no PostgreSQL server (/usr/lib/postgresql/*/bin) and not root: the PostgreSQL tests will skip"; \
		fi; \
	fi

lint: install
	$(VENV)/bin/ruff check .

test: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q

# Ingests the real vaults in ../shared (skips when absent) and installs the wheel into a fresh venv.
test-slow: install
	$(VENV)/bin/pytest -q -m slow -s

# The demo's notes live in $(DEMO_HOME): the commands it prints name that home, so they find them.
# `make demo PORT=7861` serves the page on another port.
demo: install
	$(VENV)/bin/brain --home $(DEMO_HOME) sync --vault sample_vault
	$(VENV)/bin/brain --home $(DEMO_HOME) status
	@echo
	@echo "The demo's notes are in $(DEMO_HOME). Try, in another terminal:"
	@echo "  $(VENV)/bin/brain --home $(DEMO_HOME) search \"观影\""
	@echo "  $(VENV)/bin/brain --home $(DEMO_HOME) ask \"我想看哪些电影？\" --session 电影"
	@echo "  $(VENV)/bin/brain --home $(DEMO_HOME) ask \"第二部是谁导演的？\" --session 电影"
	@echo "  $(VENV)/bin/brain --home $(DEMO_HOME) sessions"
	@echo "(or export BRAIN_HOME=$(abspath $(DEMO_HOME)) and drop --home)"
	@echo
	@echo "The chat page: http://127.0.0.1:$(PORT)"
	$(VENV)/bin/brain --home $(DEMO_HOME) serve --port $(PORT)

# The browser tests again, writing their screenshots over the committed ones in docs/screenshots (the README shows them).
screenshots: install
	BRAIN_SCREENSHOTS=$(CURDIR)/docs/screenshots $(VENV)/bin/pytest -q tests/test_app_browser.py

bench: install
	$(PY) bench/sync_bench.py

clean:
	rm -rf $(VENV) $(DEMO_HOME) .pytest_cache
