"""Prefect flows over the DVC stages: a run, a sweep over params on Dask, and where a sweep member is placed."""
