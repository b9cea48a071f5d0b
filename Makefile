# Two entry points for a fresh clone: `make demo` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean nat-tools

# The NAT system tests (tests/system/test_nat*.py) need these commands (Debian packages).
NAT_TOOLS := iptables:iptables turnserver:coturn conntrack:conntrack

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/swarm demo

# Installs the NAT test tools as root; otherwise says what is missing (those tests then skip,
# or fail under CI=true).
nat-tools:
	@missing=""; for t in $(NAT_TOOLS); do command -v $${t%%:*} >/dev/null || missing="$$missing $${t#*:}"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing for the NAT tests:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq$$missing >/dev/null; \
	else echo "NAT tests need:$$missing (as root: apt-get install -y$$missing)"; fi

test: $(STAMP) nat-tools
	$(PY) -m ruff check .
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check .

bench: $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test,bench]'
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
