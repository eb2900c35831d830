# Two entry points for a fresh clone:  make demo   and   make test.
# Both create .venv at the repo root if it is missing, install torch==2.13.0 first (constraints.txt
# pins the version; the build is whatever wheel pip's indexes offer), then fxplan with its dev,
# hf, data and export extras.
# fxplan itself runs on torch 2.11 – 2.13 (fxplan.core.torch_support): `pip install -e .` keeps a
# CUDA or ROCm torch already installed. `make test-fast` runs everything but the tests that
# start several real processes or chromium or take a minute or more (markers:
# tests/conftest.py). `make test-oldest` runs the suite's fast part on the oldest release of
# that range in .venv-oldest; `make gpu-check` proves fxplan on this machine's GPUs
# (benchmarks/gpu_check.py; its CPU form where there is none).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.fxplan-installed

.PHONY: demo test test-fast test-oldest gpu-check venv clean benchmarks browser

#: the oldest torch of the supported range (fxplan.core.torch_support.OLDEST) and where it lives
OLDEST_TORCH := 2.11.0
VENV_OLDEST  := .venv-oldest
#: what runs on it: everything but the multi-process launch tests, whose paths the newest
#: release's suite covers (tests that need a newer torch skip themselves, saying which); the
#: gloo pool's tests (marker rank_pool, also multirank) run
OLDEST_TESTS := -m "not multirank or rank_pool" tests/core tests/sharding tests/passes tests/intra_op \
                tests/cost_model tests/cluster_specs tests/inter_op tests/examples \
                tests/runtime/test_checkpoint.py tests/runtime/test_numerics.py \
                tests/calibration tests/test_api.py

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c constraints.txt torch==2.13.0
	DS_BUILD_OPS=0 $(PIP) install -q -c constraints.txt -e '.[dev,hf,data,export]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fxplan demo

#: the suite in two parts, both always run (the recipe fails if either does): the single-process
#: tests on two pytest-xdist workers (a file's tests stay on one worker, so module fixtures are
#: made once), then the tests that start several processes or chromium one at a time (they use
#: both cores themselves, and their hang guards assume no second launch beside them)
test: $(STAMP) browser
	@status=0; \
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=25 -m "not multirank and not browser" \
	  tests || status=$$?; \
	$(PY) -m pytest -q --durations=25 -m "multirank or browser" tests || status=$$?; \
	exit $$status

#: the quick loop: no gloo pool, no torchrun, no chromium (an unmarked test that starts them
#: fails under this selection, naming the marker it lacks), and none of the searches of a
#: thousand GPUs and more that take a minute or more each (slow)
FAST := -m "not multirank and not browser and not slow"
test-fast: $(STAMP)
	$(PY) -m pytest -q $(FAST) tests

# torch from the package registry: on Linux x86_64 that is a CUDA build, which runs on CPU too.
test-oldest:
	test -x $(VENV_OLDEST)/bin/python || $(PYTHON) -m venv $(VENV_OLDEST)
	$(VENV_OLDEST)/bin/python -m pip install -q torch==$(OLDEST_TORCH)
	$(VENV_OLDEST)/bin/python -m pip install -q -e '.[dev,hf]'
	$(VENV_OLDEST)/bin/python -m pytest -q $(OLDEST_TESTS)

# The machine's python3 where it imports a CUDA torch and fxplan (a GPU node, possibly offline:
# see benchmarks/gpu_check.py), else this project's venv (the check's CPU form).
gpu-check:
	@if python3 -c "import torch, fxplan; raise SystemExit(0 if torch.cuda.is_available() else 1)" \
	    2>/dev/null; then python3 benchmarks/gpu_check.py; \
	else $(MAKE) --no-print-directory $(STAMP) && $(PY) benchmarks/gpu_check.py; fi

# Debian's chromium for the HTML report's browser test (tests/test_report_html.py). A no-op when
# it is there; where apt-get is missing or fails the build goes on and that test skips, saying
# why (under CI=1 it fails instead).
browser:
	@command -v chromium >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
	  { apt-get install -y -q chromium >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }; }; } || \
	  echo "note: could not install chromium with apt-get: the browser test will skip"

benchmarks: $(STAMP)
	$(PY) benchmarks/megatron_table.py --write
	$(PY) benchmarks/search_time.py --write

clean:
	rm -rf $(VENV) build *.egg-info
