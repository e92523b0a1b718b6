# Everything a fresh machine with Python >= 3.10, gcc and make needs:
#   make report   create .venv, install tblock into it, run `tblock report` (writes tblock-report/)
#   make test     the same with the test extra, then the whole test suite, then the kernel
#                 and block tests on every other vector path the CPU can run
#   make test-fast  the default path's correctness in the inner loop (under 2 minutes on 2
#                 cores): every test but those marked slow or subprocess (pyproject's markers)
#   make test-interop  tblock's models against transformers and llama.cpp's converter (installs
#                 transformers and CPU torch; fetches llama.cpp's sources into ~/.cache)
#   make test-browser  the demo page (tblock demo) in headless chromium; writes docs/demo.png
#   make test-ray  tblock.ray on a local Ray and a two-node cluster (installs the ray extra)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: report test test-fast test-isa install install-test clean

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

# the kernel and block tests (marked isa), run once more under each other vector path this
# machine can execute (TBLOCK_ISA: avx2 and generic on an AVX-512 machine, generic on an AVX2 one),
# less those whose work is the same on every path (any_path)
OTHER_PATHS = $$($(BIN)/python tests/procs/other_paths.py)

# $(BIN)/pytest, not `python -m pytest`: that puts the checkout first on sys.path, where
# the kernels/ folder hides the `kernels` package transformers imports
test: install-test
	$(BIN)/pytest
	$(MAKE) --no-print-directory test-isa

# no process started, no package built: the tests a change is checked with before `make test`
test-fast: install-test
	$(BIN)/pytest -q -x -p no:cacheprovider -m "not slow and not subprocess"

test-isa: install-test
	@for isa in $(OTHER_PATHS); do \
	  echo "== kernel and block tests on the $$isa path (TBLOCK_ISA=$$isa)"; \
	  TBLOCK_ISA=$$isa $(BIN)/pytest -q -m "isa and not any_path" || exit 1; \
	done

# tblock's models against transformers' (tests/interop, which plain pytest skips): GPT-2, Llama,
# Qwen2, Mistral, and GGUF files written by llama.cpp's own converter; the interop extra brings
# transformers, the CPU torch and what the converter imports; `make test` itself needs no torch
.PHONY: test-interop test-gguf llama-cpp-tree
test-interop: install-test llama-cpp-tree
	$(BIN)/python -m pip install --quiet -e ".[interop]"
	TBLOCK_LLAMA_CPP="$(LLAMA_TREE)" TBLOCK_ENGINES_CACHE="$(ENGINES)" $(BIN)/pytest -q tests/interop

# the GGUF part alone (tests/interop/test_gguf_convert.py, ~2 minutes); its llama-quantize tests
# run where bench/bench_engines.py has built llama.cpp (else they skip, saying so)
test-gguf: install-test llama-cpp-tree
	$(BIN)/python -m pip install --quiet -e ".[interop]"
	TBLOCK_LLAMA_CPP="$(LLAMA_TREE)" TBLOCK_ENGINES_CACHE="$(ENGINES)" $(BIN)/pytest -q tests/interop/test_gguf_convert.py

# llama.cpp's sources (its converter convert_hf_to_gguf.py) from the llama-cpp-python source
# package, unpacked once into the engines cache, never the repository; where it cannot be
# fetched the GGUF tests skip and say so
LLAMA_CPP_PYTHON ?= 0.3.36
ENGINES ?= $(or $(TBLOCK_ENGINES_CACHE),$(HOME)/.cache/tblock-engines)
LLAMA_TREE = $(ENGINES)/src/llama_cpp_python-$(LLAMA_CPP_PYTHON)/vendor/llama.cpp
LLAMA_SDIST = $(ENGINES)/dl/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz
UNTAR = import sys, tarfile; kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}; \
	tarfile.open(sys.argv[1]).extractall(sys.argv[2], **kw)
llama-cpp-tree: $(BIN)/python
	@if [ ! -f "$(LLAMA_TREE)/convert_hf_to_gguf.py" ]; then \
	  { [ -f "$(LLAMA_SDIST)" ] || $(BIN)/python -m pip download --quiet --no-binary :all: --no-deps \
	      "llama-cpp-python==$(LLAMA_CPP_PYTHON)" -d "$(ENGINES)/dl"; } && \
	  echo "== unpacking $(LLAMA_SDIST)" && \
	  $(BIN)/python -c '$(UNTAR)' "$(LLAMA_SDIST)" "$(ENGINES)/src" || \
	  echo "== llama.cpp's sources could not be fetched: the GGUF converter tests will skip"; \
	fi

# tblock.ray (Ray Data actors running the batch job) on a local Ray of 2 CPUs and a two-node
# cluster of ray.cluster_utils (tests/ray, which plain pytest ignores; about 2 minutes); the ray
# extra brings Ray Data, which `make test` itself never needs
.PHONY: test-ray
test-ray: install-test
	$(BIN)/python -m pip install --quiet -e ".[ray]"
	$(BIN)/pytest -q tests/ray

# the demo page (tblock demo) in headless chromium (tests/browser, which plain pytest ignores):
# the browser extra brings selenium; Debian's chromium and chromium-driver come from apt-get
# when missing, never a downloaded browser; the run writes the README's screenshot docs/demo.png
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
.PHONY: test-browser
test-browser: install-test
	$(BIN)/python -m pip install --quiet -e ".[browser]"
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
	  echo "== installing chromium and chromium-driver with apt-get"; \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; \
	fi
	TBLOCK_SCREENSHOT=docs/demo.png $(BIN)/pytest -q -o addopts=-ra tests/browser

clean:
	rm -rf $(VENV) build *.egg-info tblock/*.so .pytest_cache

# the pytest-benchmark suite (minutes; not part of `make test`): every component of every
# backend over the T sweep, saved as JSON under .benchmarks/ (compare two runs with
# `pytest-benchmark compare`); BENCH_ARGS adds options, e.g. BENCH_ARGS=--full
.PHONY: bench
bench: install-test
	$(BIN)/pytest bench --benchmark-autosave --benchmark-storage=file://.benchmarks $(BENCH_ARGS)

# tblock against PyTorch (eager and torch.compile), ONNX Runtime and OpenVINO on issue #12's
# sizes (tens of minutes; not part of `make test`); PEERS_ARGS adds options, e.g.
# PEERS_ARGS="--quick --points 768:12:1024" or PEERS_ARGS="--json peers.json"
.PHONY: bench-peers
bench-peers: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[peers]"
	$(BIN)/python bench/compare_peers.py $(PEERS_ARGS)

# a GPT-2-small-shaped model (random weights): the logits of T = 128 and 1024 against
# transformers (torch, 2 threads), the vocabulary head included (minutes; not in `make test`)
.PHONY: bench-gpt2
bench-gpt2: install-test
	$(BIN)/python -m pip install --quiet -e ".[interop]"
	$(BIN)/python bench/bench_gpt2.py $(GPT2_ARGS)

# the first call from an empty Numba cache and from a filled one, and warmup(), each in fresh
# processes (minutes; not in `make test`); FIRST_CALL_ARGS adds options, e.g. "--runs 5"
.PHONY: bench-first-call
bench-first-call: install-test
	$(BIN)/python bench/first_call.py $(FIRST_CALL_ARGS)

# decoding with the KV cache, GPT-2-small shape: the step at contexts 128 and 1024 against
# transformers' cached step and the memory-bandwidth floor (measured in the same run), the
# prefill of 1024 tokens, the caches' memory (minutes; not in `make test`); DECODE_ARGS adds
# options, e.g. DECODE_ARGS="--json decode.json"
.PHONY: bench-decode
bench-decode: install-test
	$(BIN)/python -m pip install --quiet -e ".[interop]"
	$(BIN)/python bench/bench_decode.py $(DECODE_ARGS)

# many prompts (issue #34): tblock's generate_many at max_batch 8..64 against a loop of
# generate, transformers' padded batch generate and llama-batched-bench; 64 prompts of
# 16..256 tokens, 64 new each, GPT-2-small shape, 2 threads (minutes; not in `make test`).
# BATCH_ARGS adds options, e.g. BATCH_ARGS="--weights int8 --json batch.json"
.PHONY: bench-batch
bench-batch: install-test
	$(BIN)/python -m pip install --quiet -e ".[interop]"
	$(BIN)/python bench/bench_batch.py $(BATCH_ARGS)

# tblock at every weight format (fp32, bf16, int8, int4) against llama.cpp (built from the
# llama-cpp-python source package), CTranslate2, OpenVINO and transformers: decode after a
# 128-token prompt and prefill of 512 tokens, GPT-2-small shape, 2 threads (tens of minutes;
# not in `make test`).  The first run builds llama.cpp, pip-installs ctranslate2, makes
# optimum-intel's venv and converts the model, all under ~/.cache/tblock-engines (never in
# the repository); later runs reuse them.  ENGINES_ARGS adds options, e.g.
# ENGINES_ARGS="--quick" or ENGINES_ARGS="--json engines.json"
.PHONY: bench-engines
bench-engines: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[interop,peers]"
	$(BIN)/python bench/bench_engines.py $(ENGINES_ARGS)
