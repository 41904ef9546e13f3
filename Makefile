# Every target installs what it needs through the project's own files.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install test test-fast demo bench lint clean

$(STAMP): pyproject.toml
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

bench: $(STAMP)
	$(VENV)/bin/speechlens bench

lint: $(STAMP)
	$(VENV)/bin/ruff check speechlens_cli tests fixtures

clean:
	rm -rf $(VENV) build *.egg-info fixtures/generated demo
