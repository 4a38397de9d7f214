"""A stage's run: the Task protocol (task.py), the experiment it drives (experiment.py) and the checks before
anything is written (preflight.py)."""
