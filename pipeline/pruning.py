"""Iterative pruning curves (the paper's Figures 3/4): cumulative removal of the globally least
important heads, evaluated at each level on every split.

Every level is evaluated on a physically pruned copy (outputs equal the masked model's; tested in
the core), which is also faster. Results are memoised by the set of removed heads, so levels that
several methods share (0% at least) are evaluated once.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Mapping, Sequence

import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from pipeline.evaluation import TaskEval
from pipeline.flops import forward_flops
from pipeline.importance import Head, head_importance, normalize_per_layer, rank_heads, select_heads
from pipeline.sites import attention_sites
from pipeline.surgery import prune_heads

Plan = dict[int, list[int]]


def pruning_levels(step: float, max_fraction: float) -> list[float]:
    """0, step, 2*step, ... up to max_fraction (inclusive, up to float noise)."""
    n = int(max_fraction / step + 1e-9)
    return [round(i * step, 10) for i in range(n + 1)]


def heads_for(fraction: float, total: int) -> int:
    return int(round(fraction * total))


def pruned_copy(model: nn.Module, plan: Mapping[int, Sequence[int]]) -> nn.Module:
    return prune_heads(copy.deepcopy(model), plan)


def plans_from_order(order: Sequence[Head], num_heads: Sequence[int], counts: Sequence[int],
                     min_heads_per_site: int = 0) -> Iterator[Plan]:
    for count in counts:
        yield select_heads(order, num_heads, count, min_heads_per_site)


def reestimated_plans(
    model: nn.Module, score_batches: Sequence[Mapping[str, torch.Tensor]], counts: Sequence[int],
    normalize_p: float | None, min_heads_per_site: int = 0,
) -> Iterator[Plan]:
    """The paper's `--exact_pruning`: before each step, re-score the heads of the model pruned so far
    and remove the next least important ones."""
    removed: Plan = {}
    for count in counts:
        need = count - sum(len(h) for h in removed.values())
        if need > 0:
            current = pruned_copy(model, removed)
            sites = attention_sites(current)
            scores = normalize_per_layer(head_importance(current, score_batches, progress=False), normalize_p)
            # Scores index the heads still present; kept_heads maps those positions to original indices.
            step = select_heads(rank_heads(scores), [site.num_heads for site in sites], need, min_heads_per_site)
            for s, positions in step.items():
                removed[s] = sorted(removed.get(s, []) + [sites[s].kept_heads[p] for p in positions])
        yield {s: list(h) for s, h in removed.items()}


class CurveEvaluator:
    """Evaluates plans on every split, once per distinct plan, and reports FLOPs removed.

    `evals` maps a split name to its `ClassificationEval` or `TranslationEval`.
    """

    def __init__(self, model: nn.Module, evals: Mapping[str, TaskEval], flops_probe: Mapping[str, torch.Tensor]):
        self.model, self.evals, self.probe = model, evals, flops_probe
        self.total_heads = sum(s.num_heads for s in attention_sites(model))
        self.base_flops = forward_flops(model, flops_probe)
        self._cache: dict[frozenset, dict] = {}

    def __call__(self, plan: Mapping[int, Sequence[int]]) -> dict:
        key = frozenset((s, h) for s, heads in plan.items() for h in heads)
        if key not in self._cache:
            model = pruned_copy(self.model, plan)
            result = {split: task_eval(model)[0] for split, task_eval in self.evals.items()}
            result["heads_pruned"] = len(key)
            result["fraction_flops_removed"] = 1 - forward_flops(model, self.probe) / self.base_flops
            self._cache[key] = result
        return self._cache[key]

    def curve(self, method: str, plans: Iterable[Plan], of_heads: int | None = None,
              progress: bool = True) -> pd.DataFrame:
        """One row per plan and split; fraction_pruned is relative to `of_heads` (default: all heads),
        e.g. the heads of one attention kind when only that kind is pruned."""
        rows = []
        for plan in tqdm(plans, desc=f"prune ({method})", disable=not progress, leave=False):
            result = self(plan)
            for split in self.evals:
                rows.append(dict(method=method, split=split,
                                 fraction_pruned=result["heads_pruned"] / (of_heads or self.total_heads),
                                 heads_pruned=result["heads_pruned"], metric=result[split],
                                 fraction_flops_removed=result["fraction_flops_removed"],
                                 examples=len(self.evals[split])))
        return pd.DataFrame(rows)


def mean_over_seeds(curves: Sequence[pd.DataFrame], method: str) -> pd.DataFrame:
    """Average several seeds' curves level by level, with the standard deviation as metric_std."""
    keys = ["split", "fraction_pruned", "heads_pruned", "examples"]
    stacked = pd.concat(curves)
    out = stacked.groupby(keys, sort=False).agg(
        metric=("metric", "mean"), metric_std=("metric", "std"),
        fraction_flops_removed=("fraction_flops_removed", "mean")).reset_index()
    out.insert(0, "method", method)
    return out
