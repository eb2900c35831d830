# Two entry points for a fresh clone:  make demo   and   make test.
# Both create .venv at the repo root if it is missing, install torch==2.13.0 first
# (the CPU build these machines carry, pinned by constraints.txt), then fxplan with its dev and hf extras.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.fxplan-installed

.PHONY: demo test venv clean benchmarks

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -e '.[dev,hf]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fxplan demo

test: $(STAMP)
	$(PY) -m pytest -q tests

benchmarks: $(STAMP)
	$(PY) benchmarks/megatron_table.py --write
	$(PY) benchmarks/search_time.py --write

clean:
	rm -rf $(VENV) build *.egg-info
