"""Table 4's headline for `dvc metrics`: each pruned model's median speedup at the largest batch, with its spread and
its FLOP ideal, from the benchmark stage's throughput tables (classification and translation)."""

from __future__ import annotations

import pandas as pd

from pipeline.core.timer import SPEEDUP_SPREAD
from pipeline.files.schema import ROUNDED_WIDTHS, SEARCHED_WIDTHS


def headline_speedups(table: pd.DataFrame, budgeted: pd.DataFrame, batch_size: int) -> dict:
    """Table 4's numbers at the largest batch, for `dvc metrics`: each model's median speedup, its interquartile
    range and range, and its ideal (FLOPs). A budgeted level with rounded widths names its twin as searched
    "-unrounded"."""
    summary: dict = {}
    twins = set(budgeted.loc[budgeted.widths == ROUNDED_WIDTHS, "budget_removed"])
    for name, frame, column in (("pruned", table, "fraction_pruned"), ("budgeted", budgeted, "budget_removed")):
        for r in frame[(frame.batch_size == batch_size) & (frame[column] > 0)].itertuples():
            # fp32 keeps the key it had before precisions were timed; another precision names itself.
            impl = r.attn_implementation if r.precision == "fp32" else f"{r.attn_implementation}-{r.precision}"
            level = getattr(r, column)
            twin = name == "budgeted" and r.widths == SEARCHED_WIDTHS and level in twins
            model = f"{name}@{level:g}" + ("-unrounded" if twin else "")
            summary.setdefault(f"{impl}@batch{batch_size}", {})[model] = {
                **{key: round(float(getattr(r, key)), 4) for key in SPEEDUP_SPREAD},
                "ideal_speedup": round(float(r.ideal_speedup), 4)}
    return summary
