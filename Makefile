# Two commands from a fresh clone:  `make quickstart`  and  `make test`  (`make test-fast` skips the slow tests).
# Both create .venv and install the project into it. With the local data folder ../shared/data beside the clone
# they run offline on it; without it the quickstart downloads its data from the Hub into the Hugging Face cache
# (docs/data.md) and the tests run offline on their own fixtures.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The PyTorch build to install first; a range would pull the newest CUDA wheels. Override for your machine.
TORCH_SPEC ?= torch==2.13.0
LOCAL_DATA ?= $(abspath ../shared/data)
ifneq ($(wildcard $(LOCAL_DATA)/senteval/STS),)
HF_SENTCL_DATA ?= $(LOCAL_DATA)/senteval
export HF_SENTCL_DATA
export HF_HUB_OFFLINE ?= 1
endif
# The quickstart trains on the local Wikipedia subset when there is one (the recipe names SimCSE's corpus on the Hub).
QUICKSTART_ARGS ?= $(if $(wildcard $(LOCAL_DATA)/wiki1m_subset.txt),--train_file $(LOCAL_DATA)/wiki1m_subset.txt)
# CLEAR's synonym substitution reads the WordNet 3.0 database; Debian/Ubuntu's wordnet-base package puts it here.
WORDNET_DIR ?= /usr/share/wordnet
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: install quickstart test test-fast clean wordnet gpu-bundle

# pip byte-compiles the ~18,000 modules it installs one at a time (80 s of the install on a 2-core EPYC); compileall
# does it on every core. Its status is ignored, as pip ignores it: some packages ship files for other Pythons.
SITE_PACKAGES = $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
BYTE_COMPILE = $(BIN)/python -m compileall -qq -j 0

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --no-compile "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet --no-compile -e ".[dev]"
	$(BYTE_COMPILE) "$(SITE_PACKAGES)" || true
	touch $@

# DeepSpeed for the ZeRO-2/3 tests on CPU processes (not a dependency of the package): a source distribution that
# builds without compiling any op (DS_BUILD_OPS=0) against the torch installed above, hence no build isolation.
DEEPSPEED_SPEC ?= deepspeed==0.19.8
$(BIN)/.deepspeed: $(BIN)/.installed
	DS_BUILD_OPS=0 $(BIN)/python -m pip install --quiet --no-compile --no-build-isolation "$(DEEPSPEED_SPEC)"
	$(BYTE_COMPILE) "$(SITE_PACKAGES)" || true
	touch $@

# The wheels benchmarks/gpu_check.py needs on a bare GPU machine (which has torch with CUDA), for its Python
# (`make gpu-bundle GPU_PYTHON=3.11`): hf_sentcl's runtime dependencies and their whole closure on manylinux x86_64
# at the versions installed in $(VENV), less torch and what only torch needs (NVIDIA CUDA packages, triton), and
# deepspeed built as a wheel without ops with its dependencies, into $(GPU_WHEELS) (git ignores .whl/). Copy the
# repository with that folder to the GPU machine and run `python benchmarks/gpu_check.py` there.
GPU_PYTHON ?= 3.12
GPU_WHEELS ?= .whl
# the oldest glibc of the GPU machines (manylinux_2_N wheels up to this N)
GPU_GLIBC ?= 2.28
# e.g. --no-pin: the newest versions rather than those installed in $(VENV); --leave-out numpy,scipy,...: what the
# GPU image already has (a bundle small enough to carry; docs/scaling.md lists the names for the H200 image)
GPU_BUNDLE_ARGS ?=
gpu-bundle: $(BIN)/.installed
	$(BIN)/python benchmarks/gpu_bundle.py --wheels $(GPU_WHEELS) --python-version $(GPU_PYTHON) --glibc $(GPU_GLIBC) \
		--deepspeed "$(DEEPSPEED_SPEC)" $(GPU_BUNDLE_ARGS)

wordnet:
	@if [ -f "$(WORDNET_DIR)/index.noun" ]; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
		$(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wordnet-base; \
	else echo "warning: no WordNet database in $(WORDNET_DIR) and no apt-get to install wordnet-base; CLEAR's" \
		"'subs' augmentation and tests/augment/test_wordnet.py need WordNet 3.0 files there (or set WORDNET_DIR)." >&2; fi

install: $(BIN)/.installed wordnet

quickstart: install
	$(BIN)/python -m hf_sentcl.run recipes/quickstart.yaml $(QUICKSTART_ARGS)

# Two pytest workers (pytest-xdist): most of the suite's time is the multi-process tests' interpreter starts (about
# 10 s of imports per process on a 2-core AVX2 EPYC), which one worker leaves a core idle through. Every test sets
# one intra-op thread (tests/conftest.py) and every launch its own free port, so the workers do not collide; the
# longest tests come first (tests/conftest.py), so that the run does not end on one worker alone.
# PYTEST_WORKERS=0 runs in one process; `auto` takes one worker per core.
PYTEST_WORKERS ?= 2
test: install $(BIN)/.deepspeed
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal

# The tests not marked slow (no training runs, no process groups): a check in under a minute while editing.
test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

clean:
	rm -rf $(VENV) outputs .pytest_cache
