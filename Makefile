# Two entry points for a fresh clone:  make demo   and   make test.
# Both create .venv at the repo root if it is missing, install torch==2.13.0 first
# (the CPU build these machines carry, pinned by constraints.txt), then fxplan with its dev, hf and data extras.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.fxplan-installed

.PHONY: demo test venv clean benchmarks browser

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -e '.[dev,hf,data]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fxplan demo

test: $(STAMP) browser
	$(PY) -m pytest -q tests

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
