# Quickstart: `make demo` then `make test`. Both create .venv and install what they need.
# On a CUDA machine, set TORCH_SPEC (e.g. `make test TORCH_SPEC=torch`) to get a CUDA build of torch;
# the default pins the CPU build that these CPU machines carry locally.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tigon-installed
SPEC_FILE := $(VENV)/.torch-spec
# pytest-xdist workers for `make test`: one per core, at most 8 (each holds torch and a model zoo in memory).
TEST_WORKERS ?= $(shell $(PYTHON) -c 'import os; print(min(os.cpu_count() or 1, 8))')

.PHONY: demo test install clean FORCE

# Reinstall when TORCH_SPEC changes (e.g. a CUDA build after a CPU one): the spec file is rewritten only then.
$(SPEC_FILE): FORCE
	@mkdir -p $(VENV); [ "$$(cat $@ 2>/dev/null)" = "$(TORCH_SPEC)" ] || echo "$(TORCH_SPEC)" > $@

$(STAMP): pyproject.toml $(SPEC_FILE)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[hf,test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tigon compare --json tigon-compare.json --plot tigon-compare.png

test: $(STAMP)
	TIGON_CUDA_COMPILE=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

clean:
	rm -rf $(VENV) tigon-compare.json tigon-compare.png

# ---- GPU benchmarks (benchmarks/README.md). Run on the CUDA machine from the repository root, with that machine's
# python3 and torch (GPU_PYTHON), not the .venv above. Files go to $(OUT) as <kind>_<model>_<gpu>_<date>.json.
#   make bench-h200                      tests, tigon compare and tigon bench of every op (one device call)
#   make bench-sweep-h200                tigon bench --sweep tokens per op, --sweep hidden for the norms (CUDA graphs);
#                                        SWEEP_OPS="rms_norm rope" to split the sweeps over several device calls
GPU_PYTHON ?= python3
OUT ?= out
GPU ?= h200
MODEL ?= llama3-8b
DATE ?= $(shell date +%Y%m%d)
SWEEP_OPS ?= rms_norm layer_norm rope swiglu geglu cross_entropy
HIDDEN_OPS ?= rms_norm,layer_norm
CUDA_GRAPH ?= --cuda-graph
GPU_ENV = PYTHONPATH=src PYTHONUNBUFFERED=1
TIGON_GPU = $(GPU_ENV) $(GPU_PYTHON) -m tigon.cli

.PHONY: bench-h200 bench-sweep-h200

bench-h200:
	mkdir -p $(OUT)
	-$(GPU_ENV) $(GPU_PYTHON) -m pytest -q -x -p no:cacheprovider tests > $(OUT)/pytest_$(GPU)_$(DATE).log 2>&1; \
		tail -3 $(OUT)/pytest_$(GPU)_$(DATE).log
	-$(TIGON_GPU) compare --preset $(MODEL) --layers 2 --dtype bfloat16 --quiet \
		--json $(OUT)/compare_$(MODEL)-2l-bf16_$(GPU)_$(DATE).json --plot $(OUT)/compare_$(MODEL)-2l-bf16_$(GPU)_$(DATE).png
	$(TIGON_GPU) bench --op all --model $(MODEL) --json $(OUT)/bench_$(MODEL)_$(GPU)_$(DATE).json

bench-sweep-h200:
	mkdir -p $(OUT)/sweep-tokens $(OUT)/sweep-hidden
	for op in $(SWEEP_OPS); do \
		$(TIGON_GPU) bench --op $$op --model $(MODEL) --sweep tokens $(CUDA_GRAPH) --quiet \
			--json $(OUT)/sweep-tokens-$${op}_$(MODEL)_$(GPU)_$(DATE).json --plot-dir $(OUT)/sweep-tokens || exit 1; \
	done
	$(TIGON_GPU) bench --op $(HIDDEN_OPS) --model $(MODEL) --sweep hidden $(CUDA_GRAPH) --quiet \
		--json $(OUT)/sweep-hidden_$(MODEL)_$(GPU)_$(DATE).json --plot-dir $(OUT)/sweep-hidden
