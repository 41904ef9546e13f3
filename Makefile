# Every target installs what it needs through the project's own files.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install browser test test-fast demo bench lint clean gpu-wheels gpu-install gpu-test

# The suite's extras: dev, report (scoring and the report's tests) and bench (torch==2.13.0, the
# CPU wheel on Linux x86_64, for the PyTorch peer's tests and `make bench`).
$(STAMP): pyproject.toml setup.py $(wildcard csrc/*.c)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,report,bench]'
	touch $(STAMP)

install: $(STAMP)

# The report's test opens it in headless Chromium: Debian's, installed where it is missing and
# make runs as root with apt-get (CI); elsewhere that test is skipped and says why.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -q -q && apt-get install -y -q -q --no-install-recommends chromium; \
	else \
		echo "note: no Chromium, and no apt-get as root to install it: the report's browser test is skipped"; \
	fi

test: $(STAMP) browser
	$(PY) -m pytest -q

test-fast: $(STAMP) browser
	$(PY) -m pytest -q -m "not slow"

# The demo needs the package and the report extra (its report of the run), not the dev extra
# (pytest, ruff, and 142 MB of NVIDIA's NVRTC for the CUDA tests): a stamp of its own.
BASE_STAMP := $(VENV)/.installed-base

$(BASE_STAMP): pyproject.toml setup.py $(wildcard csrc/*.c)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[report]'
	touch $(BASE_STAMP)

demo: $(BASE_STAMP)
	$(PY) -m fixtures.demo

# The PyTorch peer comes with the `bench` extra ($(STAMP)); BENCH_ARGS passes options, e.g.
# make bench BENCH_ARGS="--quick" or BENCH_ARGS="--profile"; the reports go to docs/bench
# (`speechlens bench` alone writes to a folder of the user's own).
bench: $(STAMP)
	$(VENV)/bin/speechlens bench --out docs/bench $(BENCH_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check speechlens_cli tests fixtures tools

# The whole suite on an offline Linux NVIDIA host (Python 3.12, CUDA 13, gcc and g++), from wheels
# (tools/gpu_suite.py says how). gpu-wheels, where a package index is: the host's wheels into
# $(WHEELS)/part1, part2, ... (60 MB each at most). gpu-test, on the host: joins them, makes
# $(GPU_VENV) and installs from them (no index; once), then runs PART of the suite (1 to 4, each
# meant to fit in the host's 10 minutes a command; all), writing JUnit XML and logs to
# $(GPU_RESULTS); PYTEST_ARGS passes more pytest options (-k, -x).
WHEELS      ?= .wheels
GPU_VENV    ?= .gpu-venv
GPU_RESULTS ?= .gpu-results
PART        ?= all
PYTEST_ARGS ?=

gpu-wheels:
	$(PYTHON) tools/gpu_suite.py wheels --dest $(WHEELS)

gpu-install:
	$(PYTHON) tools/gpu_suite.py install --wheels $(WHEELS) --venv $(GPU_VENV)

gpu-test: gpu-install
	$(PYTHON) tools/gpu_suite.py test --venv $(GPU_VENV) --results $(GPU_RESULTS) $(PART) -- $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info fixtures/generated demo
