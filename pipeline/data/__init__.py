"""Data: where examples come from (sources, catalog, offline assets), how they are read and tokenised, and the
metrics an evaluation computes."""
