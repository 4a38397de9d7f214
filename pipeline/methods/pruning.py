"""Iterative pruning curves (the paper's Figures 3/4): cumulative removal of the globally least
important heads, evaluated at each level on every split. Beyond the paper: the budgeted methods of
`pipeline.methods.budgeted` against the paper's order at equal cost (`budgeted_curves`).

Every level is evaluated on a physically pruned copy (outputs equal the masked model's; tested in
the core), which is also faster. Results are memoised by the set of removed heads, so levels that
several methods share (0% at least) are evaluated once.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from pipeline.core.flops import forward_flops
from pipeline.core.importance import Head, head_importance, normalize_per_layer, rank_heads, select_heads
from pipeline.core.sites import attention_sites, ffn_sites
from pipeline.core.surgery import prune_heads
from pipeline.files.schema import TOLERANCE
from pipeline.methods.budgeted import Batches, BudgetError, UnitCosts, UnitGradients, budgeted_prune
from pipeline.tasks.evaluation import TaskEval

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
        self.total_neurons = sum(s.num_neurons for s in ffn_sites(model))
        self.base_flops = forward_flops(model, flops_probe)
        self._cache: dict[frozenset, dict] = {}

    def __call__(self, plan: Mapping[int, Sequence[int]]) -> dict:
        key = frozenset((s, h) for s, heads in plan.items() for h in heads)
        if key not in self._cache:
            self._cache[key] = self.evaluate(pruned_copy(self.model, plan))
        return self._cache[key]

    def evaluate(self, model: nn.Module) -> dict:
        """The metric of `model` (a pruned copy of the evaluator's) on every split, with how much it prunes."""
        result = {split: task_eval(model)[0] for split, task_eval in self.evals.items()}
        result["heads_pruned"] = self.total_heads - sum(s.num_heads for s in attention_sites(model))
        result["neurons_pruned"] = self.total_neurons - sum(s.num_neurons for s in ffn_sites(model))
        result["fraction_flops_removed"] = 1 - forward_flops(model, self.probe) / self.base_flops
        return result

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


def paper_plan_at_cost(order: Sequence[Head], costs: UnitCosts, keep: float) -> Plan | None:
    """The paper's method under a cost budget: heads go in importance order (least important first) until
    the model costs at most `keep` of the unpruned one. None when even removing every head is not enough."""
    budget, cost, plan = keep * costs.total * (1 + 1e-9), costs.total, {}
    for site, head in order:
        if cost <= budget:
            break
        plan.setdefault(site, []).append(head)
        cost -= costs.head[site]
    return {site: sorted(heads) for site, heads in plan.items()} if cost <= budget else None


def budgeted_curves(
    model: nn.Module, evaluator: CurveEvaluator, gradients: UnitGradients, costs: UnitCosts,
    paper_order: Sequence[Head], levels: Sequence[float], methods: Sequence[str], tune_batches: Batches,
    first_token_last_layer: bool, keep_models_at: Sequence[float] = (),
) -> tuple[pd.DataFrame, dict[str, float], dict[float, nn.Module]]:
    """The paper's order and each budgeted method at every level (the fraction of the cost removed).

    Returns one row per method, level and split (levels a method cannot reach are left out: pruning heads
    alone cannot remove the FFNs' share), the seconds each budgeted prune took, and the budgeted-tuned
    models at `keep_models_at`.
    """
    rows: list[dict] = []
    seconds: dict[str, float] = {}
    kept_models: dict[float, nn.Module] = {}
    unpruned = evaluator.evaluate(model)

    def add(method: str, level: float, result: dict, took: float | None = None) -> None:
        for split in evaluator.evals:
            rows.append(dict(method=method, split=split, budget_removed=level,
                             fraction_flops_removed=result["fraction_flops_removed"],
                             heads_pruned=result["heads_pruned"], neurons_pruned=result["neurons_pruned"],
                             metric=result[split], examples=len(evaluator.evals[split]), seconds=took))

    all_methods = ["paper", *methods]
    for method in all_methods:
        add(method, 0.0, unpruned)
    for level, method in tqdm([(lv, m) for lv in levels for m in all_methods], desc="prune (budgeted)",
                              leave=False):
        if method == "paper":
            plan = paper_plan_at_cost(paper_order, costs, 1 - level)
            if plan is not None:
                add(method, level, evaluator.evaluate(pruned_copy(model, plan)))
            continue
        try:
            result = budgeted_prune(model, gradients, costs, 1 - level, method, tune_batches,
                                    first_token_last_layer)
        except BudgetError:
            continue
        took = sum(result.seconds.values())
        seconds[f"{method}@{level:g}"] = round(took, 2)
        add(method, level, evaluator.evaluate(result.model), took)
        if method == "budgeted-tuned" and level in keep_models_at:
            kept_models[level] = result.model
    return pd.DataFrame(rows), seconds, kept_models


def prunable_fraction(
    curve: pd.DataFrame, method: str, split: str, tolerance: float = TOLERANCE
) -> tuple[float, float, float] | None:
    """Largest share of heads pruned with every level up to it within `tolerance` of the unpruned metric.

    Returns (fraction, metric at that fraction, unpruned metric), or None without a fraction-0 row.
    Levels are walked in order and the walk stops at the first one that loses more than the tolerance,
    so a noisy recovery at a higher level does not count.
    """
    rows = curve[(curve["method"] == method) & (curve["split"] == split)].sort_values("fraction_pruned")
    unpruned = rows[np.isclose(rows["fraction_pruned"].astype(float), 0.0, atol=1e-6)]  # fractions from CSV
    if unpruned.empty:
        return None
    base = float(unpruned["metric"].mean())  # all methods agree at 0% pruned
    best = (0.0, base, base)
    for r in rows.itertuples():
        if r.metric < base - tolerance - 1e-9:
            break
        best = (float(r.fraction_pruned), float(r.metric), base)
    return best
