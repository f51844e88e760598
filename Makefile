# Two commands from a fresh clone:  `make quickstart`  and  `make test`.
# Both create .venv, install the project into it, and run offline.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The PyTorch build to install first; a range would pull the newest CUDA wheels. Override for your machine.
TORCH_SPEC ?= torch==2.13.0
HF_SENTCL_DATA ?= $(abspath ../shared/data/senteval)
export HF_SENTCL_DATA
export HF_HUB_OFFLINE ?= 1

.PHONY: install quickstart test clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@

install: $(BIN)/.installed

quickstart: install
	$(BIN)/python -m hf_sentcl.run recipes/quickstart.yaml

test: install
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) outputs .pytest_cache
