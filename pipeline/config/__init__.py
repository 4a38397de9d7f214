"""The params: parsed and validated in one pass (params.py), the task registry (tasks.py) and the record of which
params a stage reads (trace.py)."""
