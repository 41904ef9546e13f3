# Every target installs what it needs through the project's own files.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install test test-fast demo bench lint clean

$(STAMP): pyproject.toml setup.py $(wildcard csrc/*.c)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

demo: $(STAMP)
	$(PY) -m fixtures.demo

# The PyTorch peer comes with the `bench` extra (torch==2.13.0 on Linux x86_64); BENCH_ARGS passes
# options, e.g. make bench BENCH_ARGS="--quick" or BENCH_ARGS="--profile"; the reports go to
# docs/bench (`speechlens bench` alone writes to a folder of the user's own).
bench: $(STAMP)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q -e '.[bench]'
	$(VENV)/bin/speechlens bench --out docs/bench $(BENCH_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check speechlens_cli tests fixtures

clean:
	rm -rf $(VENV) build *.egg-info fixtures/generated demo
