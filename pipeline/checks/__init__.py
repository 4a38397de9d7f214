"""Commands that check before a run: `python -m pipeline.checks` (an experiment's params, model and data; `make repro`
runs it first) and `python -m pipeline.checks.gpu` (that a GPU runs the pipeline: `make gpu-check`). Not a
stage dependency, so editing a check reruns no stage."""
