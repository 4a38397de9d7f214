# `make setup` is idempotent: it makes .venv once, installs the CPU torch only when no torch is
# there (an unpinned torch pulls a multi-GB CUDA build), then installs this package with uv:
# pip took 4 minutes to resolve and install DVC's dependency tree, uv takes about 10 s. uv keeps the
# torch already installed (it satisfies the range in pyproject.toml).
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_CPU ?= torch==2.13.0
# fairseq 0.12.2 does not import on Python 3.11; this maintained fork does (pipeline/tasks/translation/fairseq.py).
FAIRSEQ ?= fairseq-fixed==0.12.3.1

.PHONY: setup test test-fast repro repro-tasks repro-mt repro-llm lint dvc-deps gpu-check

setup: $(VENV)/.installed

# The last line installs fairseq itself, after its runtime deps (the `fairseq` extra). --no-deps: its
# metadata requires torchaudio, which would replace the torch above with a CUDA build.
# --no-build-isolation: its C++/Cython extension compiles against that torch and the extra's Cython
# (about 3 minutes; uv caches the wheel). uv skips it when that version is already installed.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_CPU)"
	$(PY) -m pip install -q "uv>=0.5"
	$(VENV)/bin/uv pip install -q --python $(PY) -e ".[dev,fairseq]"
	MAX_JOBS=2 $(VENV)/bin/uv pip install -q --python $(PY) --no-deps --no-build-isolation "$(FAIRSEQ)"
	touch $@

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
repro-llm: setup
	$(PY) -m pipeline.checks --params llm/params.yaml
	PATH="$(abspath $(VENV))/bin:$$PATH" dvc repro llm/dvc.yaml

# On one CUDA GPU, offline, in at most ~8 minutes: a tiny `dvc repro` with runtime.device cuda and
# runtime.precision bf16, then Table 4 at BERT-base shape (random weights) at fp32 and bf16, as one table.
# Without a GPU it says so in one line and fails (pipeline/checks/gpu.py).
gpu-check: setup
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m pipeline.checks.gpu
