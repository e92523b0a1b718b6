# Everything a fresh machine with Python >= 3.10, gcc and make needs:
#   make report   create .venv, install tblock into it, run `tblock report` (writes tblock-report/)
#   make test     the same with the test extra, then the whole test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: report test install install-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# editable install: the compiled C reference and the sources stay in this checkout;
# the report extra brings the figures (matplotlib) and BLAS thread pinning (threadpoolctl)
install: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[report]"

install-test: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test,plot]"

report: install
	$(BIN)/tblock report

test: install-test
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) build *.egg-info tblock/*.so .pytest_cache

# the pytest-benchmark suite (minutes; not part of `make test`): every component of every
# backend over the T sweep, saved as JSON under .benchmarks/ (compare two runs with
# `pytest-benchmark compare`); BENCH_ARGS adds options, e.g. BENCH_ARGS=--full
.PHONY: bench
bench: install-test
	$(BIN)/python -m pytest bench --benchmark-autosave --benchmark-storage=file://.benchmarks $(BENCH_ARGS)
