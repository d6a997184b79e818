# Evoke Desk: `make run` starts the app, `make test` runs every test but the hour-long soak runs. Both install first.
# `make test-hostile` runs the hostile suite against `serve` (bad inputs, kill -9, a full disk, concurrent clients).
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export QT_QPA_PLATFORM ?= offscreen

.PHONY: install run chat test test-fast test-loaded test-soak test-hostile lint bench gpu cpu native-variants bundle bundle-cuda clean

$(STAMP): pyproject.toml packaging/install.sh native/build.sh native/rope_reanchor.c native/attention_capture.cpp native/kv_direct.cpp native/kvquant.c \
          native/build_cpu.sh native/llama_wheel.sh native/build_rpc_server.sh native/rpc_server/CMakeLists.txt
	bash packaging/install.sh
	bash native/build.sh
	touch $(STAMP)

install: $(STAMP)

run: install
	@if [ -f app/__main__.py ]; then unset QT_QPA_PLATFORM; $(PY) -m app; else $(PY) -m evoke_engine chat; fi

chat: install
	$(PY) -m evoke_engine chat

test: install
	$(VENV)/bin/ruff check evoke_engine app benchmarks tests
	$(PY) -m pytest -q -m "not soak"

test-fast: install
	$(PY) -m pytest -q tests/unit

# the window suite 5 times with every core kept busy (run before resolving anything that touches the window or the
# engine thread); WINDOW_TESTS=... and REPEAT=... narrow or widen it
WINDOW_TESTS ?= tests/integration/test_app_*.py
REPEAT ?= 5
test-loaded: install
	$(PY) tests/helpers/under_load.py --repeat $(REPEAT) -- $(PY) -m pytest -q $(WINDOW_TESTS)

test-soak: install
	$(PY) -m pytest -q -m soak

test-hostile: install
	$(PY) tests/helpers/hostile_suite.py

bench: install
	$(PY) -m benchmarks restore --json
	$(PY) -m benchmarks recall --json --seeds 10 --budget 512

gpu: install
	bash native/build_cuda.sh

cpu: install
	bash native/build_cpu.sh

# the bundle's portable native libraries (-march=x86-64, x86-64-v3, x86-64-v4 in native/build/<variant>/, ~20 s)
native-variants: install
	bash native/build_variants.sh

# the one-folder CPU bundle dist/evoke-desk/ (packaging/build_bundle.sh): a portable llama.cpp wheel, a build venv
# without torch in build/bundle/, the native variants against it, the exported ONNX embedder, PyInstaller
# (~25 min on 2 cores the first time, mostly the wheel; then ~5 min). .venv exports the embedder (it has torch).
bundle: install
	bash packaging/build_bundle.sh

# the one-folder CUDA bundle dist/cuda/evoke-desk/ (BUNDLE_KIND=cuda): native/build_cuda.sh's wheel (RTX architectures
# 75, 86, 89, 120 + PTX; hours on 2 cores, ~5 min on 16; shared with `make gpu`), PyPI's CUDA runtime and cuBLAS in
# build/bundle-cuda/venv, then the same steps; needs nvcc (or installs PyPI's). BUNDLE_DRY_RUN=1 prints the plan.
bundle-cuda: install
	BUNDLE_KIND=cuda bash packaging/build_bundle.sh

clean:
	rm -rf $(VENV) native/build
