"""Every width method at every level, with and without each compensation, side by side on the same calibration and
evaluation data: the width stage's table (width_curve.csv), one row per model and evaluation corpus.

The statistics are gathered once from the unpruned model (`CalibrationStatistics`), so a method costs its
selection, its compensations and its evaluations. Each level removes at
least its share of the budget; the row records what the pruned model really lost (`params_removed`, counted on
it).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd
from torch import nn
from tqdm.auto import tqdm

from pipeline.core.flops import non_embedding_parameters
from pipeline.core.sites import attention_sites
from pipeline.methods.budgeted import pruned_model
from pipeline.methods.budgeted_costs import UnitCosts
from pipeline.methods.budgeted_search import Selection
from pipeline.methods.width.allocation import allocate
from pipeline.methods.width.compensation import BIAS, NONE, REFIT, Batch, add_bias_compensation, refit
from pipeline.methods.width.methods import WIDTH_METHODS, own_compensation
from pipeline.methods.width.statistics import CalibrationStatistics

Evaluate = Callable[[nn.Module], float]


def kv_bytes_per_token(model: nn.Module, bytes_per_value: int = 2) -> int:
    """What the KV cache holds for one token: a key and a value of `head_dim` per key/value head per layer."""
    return sum(2 * s.num_kv_heads * s.head_dim * bytes_per_value for s in attention_sites(model))


def compensated(pruned: nn.Module, compensation: str, dense: nn.Module, stats: CalibrationStatistics,
                calibration: Batch, ridge: float) -> nn.Module:
    """A copy of `pruned` with `compensation` applied (none: `pruned` itself)."""
    if compensation == NONE:
        return pruned
    model = copy.deepcopy(pruned)
    if compensation == BIAS:
        add_bias_compensation(model, dense, stats)
    elif compensation == REFIT:
        refit(model, dense, calibration, ridge)
    else:
        raise ValueError(f"unknown compensation {compensation!r}")
    return model.eval()


@dataclass
class WidthSweep:
    """What the sweep needs besides the methods: the unpruned model, its statistics, the calibration windows as one
    batch (the refit's), the costs the budget is in, and the evaluations by corpus name."""

    dense: nn.Module
    stats: CalibrationStatistics
    calibration: Batch
    costs: UnitCosts
    evaluations: Mapping[str, Evaluate]
    unit: str
    ridge: float = 1e-3
    dense_metrics: dict[str, float] = field(default_factory=dict)

    def select(self, method: str, level: float, allocation: str | None = None) -> Selection:
        """What `method` keeps at `level`, by its own allocation or by `allocation`."""
        m = WIDTH_METHODS[method]
        return allocate(self.dense, m.criterion(self.dense, self.stats), self.costs, level, self.unit,
                        allocation or m.allocation, m.layers(len(self.stats.attention), method))

    def model(self, method: str, level: float, compensation: str, allocation: str | None = None) -> nn.Module:
        """`method`'s pruned model at `level`, compensated."""
        pruned = pruned_model(self.dense, self.select(method, level, allocation))
        return compensated(pruned, compensation, self.dense, self.stats, self.calibration, self.ridge)

    def _rows(self, model: nn.Module, **fields: object) -> list[dict]:
        dense_params = non_embedding_parameters(self.dense)
        shape = {"params_removed": 1 - non_embedding_parameters(model) / dense_params,
                 "kv_bytes_per_token": kv_bytes_per_token(model)}
        return [{**fields, "corpus": corpus, "perplexity": evaluate(model), **shape}
                for corpus, evaluate in self.evaluations.items()]

    def rows_of(self, model: nn.Module, variant: tuple[str, str, str], level: float) -> pd.DataFrame:
        """The rows of one model built outside `run` (a saved one), as `run` writes them."""
        method, compensation, allocation = variant
        rows = pd.DataFrame(self._rows(model, method=method, compensation=compensation,
                                       own=compensation == own_compensation(method), allocation=allocation,
                                       level=level, seconds=float("nan")))
        return rows.assign(vs_unpruned=rows["perplexity"] / rows["corpus"].map(self.dense_metrics))

    def run(self, variants: Sequence[tuple[str, str, str | None]], levels: Sequence[float], progress: bool = True
            ) -> pd.DataFrame:
        """One row per corpus for the unpruned model, then for every (method, compensation, allocation or None for
        the method's own) variant at every level."""
        rows = self._rows(self.dense, method="unpruned", compensation=NONE, own=True, allocation="", level=0.0,
                          seconds=0.0)
        self.dense_metrics = {row["corpus"]: row["perplexity"] for row in rows}
        jobs = [(level, method, allocation) for level in levels
                for method, allocation in dict.fromkeys((m, a) for m, _, a in variants)]
        for level, method, allocation in tqdm(jobs, desc="width methods", disable=not progress, leave=False):
            start = time.perf_counter()
            pruned = pruned_model(self.dense, self.select(method, level, allocation))
            chosen = time.perf_counter() - start
            for compensation in (c for m, c, a in variants if (m, a) == (method, allocation)):
                start = time.perf_counter()
                model = compensated(pruned, compensation, self.dense, self.stats, self.calibration, self.ridge)
                took = round(chosen + time.perf_counter() - start, 1)
                rows += self._rows(model, method=method, compensation=compensation,
                                   own=compensation == own_compensation(method),
                                   allocation=allocation or WIDTH_METHODS[method].allocation, level=level,
                                   seconds=took)
        table = pd.DataFrame(rows)
        return table.assign(vs_unpruned=table["perplexity"] / table["corpus"].map(self.dense_metrics))
