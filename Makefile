# Two entry points for a fresh clone: `make demo` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@# the distribution was called `swarm` before; its files would shadow swarm-compute's
	$(PY) -m pip uninstall --quiet --disable-pip-version-check -y swarm 2>/dev/null || true
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/swarm demo

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check .

# Ray, for bench/runtime.py's side-by-side rows only: its own venv, never a test dependency.
RAY_VENV ?= .venv-ray
RAY_STAMP := $(RAY_VENV)/.installed

$(RAY_STAMP):
	$(PYTHON) -m venv $(RAY_VENV)
	$(RAY_VENV)/bin/python -m pip install --quiet --disable-pip-version-check 'ray>=2.9' numpy
	touch $(RAY_STAMP)

bench: $(STAMP) $(RAY_STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test,bench]'
	SWARM_BENCH_RAY_PYTHON=$(RAY_VENV)/bin/python $(PY) bench/run_all.py

clean:
	rm -rf $(VENV) $(RAY_VENV) build *.egg-info .pytest_cache .ruff_cache
