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
# CLEAR's synonym substitution reads the WordNet 3.0 database; Debian/Ubuntu's wordnet-base package puts it here.
WORDNET_DIR ?= /usr/share/wordnet
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: install quickstart test clean wordnet

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@

wordnet:
	@if [ -f "$(WORDNET_DIR)/index.noun" ]; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
		$(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wordnet-base; \
	else echo "warning: no WordNet database in $(WORDNET_DIR) and no apt-get to install wordnet-base; CLEAR's" \
		"'subs' augmentation and tests/test_wordnet.py need WordNet 3.0 files there (or set WORDNET_DIR)." >&2; fi

install: $(BIN)/.installed wordnet

quickstart: install
	$(BIN)/python -m hf_sentcl.run recipes/quickstart.yaml

test: install
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) outputs .pytest_cache
