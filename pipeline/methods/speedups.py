"""Table 4's headline for `dvc metrics` (benchmark.json): the most pruned saved model's median speedup at the largest
batch beside its FLOP ideal, and the same for the most pruned saved budgeted-tuned model, from the benchmark stage's
throughput tables (classification and translation). The tables hold every model, batch and spread."""

from __future__ import annotations

import logging

import pandas as pd

from pipeline.files.schema import (
    BATCH_SIZE,
    BUDGET_REMOVED,
    BUDGETED_SUMMARY,
    FRACTION_PRUNED,
    IDEAL_SPEEDUP,
    ROUNDED_WIDTHS,
    SEARCHED_WIDTHS,
    SPEEDUP,
)


def _headline(rows: pd.DataFrame, column: str) -> dict:
    """{column: the largest level, speedup, ideal_speedup} of its row in `rows`; {} when `rows` has no pruned one."""
    rows = rows[rows[column] > 0]
    if rows.empty:
        return {}
    row = rows[rows[column] == rows[column].max()].iloc[0]
    return {column: round(float(row[column]), 4), SPEEDUP: round(float(row[SPEEDUP]), 4),
            IDEAL_SPEEDUP: round(float(row[IDEAL_SPEEDUP]), 4)}


def headline_speedups(table: pd.DataFrame, budgeted: pd.DataFrame, batch_size: int, attn_implementation: str,
                      precision: str) -> dict:
    """benchmark.json: at `batch_size` (the largest), `attn_implementation` (the first timed) and `precision` (the
    runtime's), the most pruned model of benchmark.csv and, under "budgeted", the most pruned of
    benchmark_budgeted.csv as saved (its widths rounded to the measured multiple where they were, not its twin as
    searched). Numbers only; a part with no pruned model is left out."""
    def at(frame: pd.DataFrame) -> pd.DataFrame:
        return frame[(frame.batch_size == batch_size) & (frame.attn_implementation == attn_implementation)
                     & (frame.precision == precision)]

    summary = _headline(at(table), FRACTION_PRUNED)
    if summary:
        summary = {FRACTION_PRUNED: summary[FRACTION_PRUNED], BATCH_SIZE: batch_size,
                   SPEEDUP: summary[SPEEDUP], IDEAL_SPEEDUP: summary[IDEAL_SPEEDUP]}
    rows = at(budgeted)
    if not rows.empty:
        rounded = set(rows.loc[rows.widths == ROUNDED_WIDTHS, BUDGET_REMOVED])
        saved = rows[(rows.widths == ROUNDED_WIDTHS)
                     | ((rows.widths == SEARCHED_WIDTHS) & ~rows[BUDGET_REMOVED].isin(rounded))]
        if found := _headline(saved, BUDGET_REMOVED):
            summary[BUDGETED_SUMMARY] = found
    return summary


def log_speedups(table: pd.DataFrame, batch_size: int) -> None:
    """One line per model of a throughput table at `batch_size`: examples/s, speedup and its ideal."""
    for r in table[table.batch_size == batch_size].itertuples():
        logging.getLogger("pipeline").info(
            "benchmark: %.0f%% pruned, batch %d, %s, %s %s: %.1f examples/s, speedup %.3f (ideal %.3f)",
            100 * r.fraction_pruned, r.batch_size, r.attn_implementation, r.device, r.precision, r.examples_per_s,
            r.speedup, r.ideal_speedup)
