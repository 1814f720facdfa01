# Quickstart: `make demo` then `make test`. Both create .venv and install what they need.
# On a CUDA machine, set TORCH_SPEC (e.g. `make test TORCH_SPEC=torch`) to get a CUDA build of torch;
# the default pins the CPU build that these CPU machines carry locally.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tigon-installed
SPEC_FILE := $(VENV)/.torch-spec

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
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) tigon-compare.json tigon-compare.png
