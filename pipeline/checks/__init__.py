"""Commands that check before a run: `python -m pipeline.checks` (an experiment's params, model and data; `make repro`
runs it first), `python -m pipeline.checks.gpu` (that a GPU runs the pipeline: `make gpu-check`) and
`python -m pipeline.checks.dvc_deps` (each stage's code deps, generated from its imports: `make dvc-deps`). Not a
stage dependency, so editing a check reruns no stage."""
