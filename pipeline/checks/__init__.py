"""Commands that check a machine runs the pipeline: `python -m pipeline.checks.gpu` (`make gpu-check`). Not a
stage dependency, so editing a check reruns no stage."""
