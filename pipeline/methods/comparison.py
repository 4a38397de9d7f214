"""Beyond the paper, at equal cost: the paper's order (heads removed by importance until the model fits the
budget) against Kwon et al.'s budgeted methods (`pipeline.methods.budgeted`), level by level, on every split.
The prune stage's budgeted comparison (`budgeted_curve.csv`, `prune.json`'s "budgeted") is `budgeted_comparison`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from pipeline.core.importance import PAPER_CHOICE, Head, HeadChoice
from pipeline.core.sites import attention_sites
from pipeline.files.schema import BUDGETED_TUNED, PAPER, TABLE_COLUMNS
from pipeline.methods.bench import random_inputs
from pipeline.methods.budgeted import (
    Batches,
    BudgetError,
    UnitCosts,
    UnitGradients,
    budgeted_prune,
    flop_costs,
    gate_gradients,
    latency_costs,
    latency_table,
)
from pipeline.methods.pruning import CurveEvaluator, Plan, pruned_copy


def paper_plan_at_cost(model: nn.Module, order: Sequence[Head], costs: UnitCosts, keep: float,
                       choice: HeadChoice = PAPER_CHOICE) -> Plan | None:
    """The paper's method under a cost budget: heads go in importance order (least important first, in the
    whole units of `choice`) until the model costs at most `keep` of the unpruned one. None when even removing
    every head is not enough."""
    sites = attention_sites(model)
    budget = keep * costs.total * (1 + 1e-9)
    # A linear scan, not a bisection: in whole units (KV groups, equal groups, a floor per site) the plan at
    # count + 1 need not contain the plan at count, so the cost need not fall monotonically. Each step is one
    # select(), so the scan is quadratic in the heads: 0.1 s at 144 heads, 11 s at 1024 (Llama-3-8B), measured here.
    for count in range(sum(site.num_heads for site in sites) + 1):
        plan = choice.select(order, sites, count)
        if costs.total - sum(costs.head[site] * len(heads) for site, heads in plan.items()) <= budget:
            return plan
    return None


def budgeted_curves(
    model: nn.Module, evaluator: CurveEvaluator, gradients: UnitGradients, costs: UnitCosts,
    paper_order: Sequence[Head], levels: Sequence[float], methods: Sequence[str], tune_batches: Batches,
    first_token_last_layer: bool, keep_models_at: Sequence[float] = (), choice: HeadChoice = PAPER_CHOICE,
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

    all_methods = [PAPER, *methods]
    for method in all_methods:
        add(method, 0.0, unpruned)
    for level, method in tqdm([(lv, m) for lv in levels for m in all_methods], desc="prune (budgeted)",
                              leave=False):
        if method == PAPER:
            plan = paper_plan_at_cost(model, paper_order, costs, 1 - level, choice)
            if plan is not None:
                add(method, level, evaluator.evaluate(pruned_copy(model, plan)))
            continue
        try:
            result = budgeted_prune(model, gradients, costs, 1 - level, method, tune_batches,
                                    first_token_last_layer, choice=choice)
        except BudgetError:
            continue
        took = sum(result.seconds.values())
        seconds[f"{method}@{level:g}"] = round(took, 2)
        add(method, level, evaluator.evaluate(result.model), took)
        if method == BUDGETED_TUNED and level in keep_models_at:
            kept_models[level] = result.model
    return pd.DataFrame(rows), seconds, kept_models


@dataclass(frozen=True)
class LatencyShape:
    """The input a latency budget is measured at (`prune.budgeted.latency`)."""

    batch_size: int
    seq_len: int
    repeats: int


@dataclass
class BudgetedComparison:
    table: pd.DataFrame  # budgeted_curve.csv
    summary: dict  # prune.json's "budgeted"
    models: dict[float, nn.Module] = field(default_factory=dict)  # budgeted-tuned models by level removed
    latency_table: list[dict] | None = None  # with a latency budget: the per-layer timings measured


def empty_budgeted_table() -> pd.DataFrame:
    return pd.DataFrame(columns=TABLE_COLUMNS["budgeted_curve.csv"])


def budgeted_comparison(
    model: nn.Module, order: Sequence[Head], probe: Mapping[str, torch.Tensor], evaluator: CurveEvaluator,
    fisher_batches: Batches, tune_batches: Batches, methods: Sequence[str], levels: Sequence[float],
    budget: str = "flops", latency: LatencyShape | None = None, first_token_last_layer: bool = True,
    keep_models_at: Sequence[float] = (), choice: HeadChoice = PAPER_CHOICE,
) -> BudgetedComparison:
    """Fisher gradients on `fisher_batches`, unit costs (FLOPs on `probe`, or a latency table measured at
    `latency`), then `budgeted_curves`; the summary records the seconds each part took, Kwon's headline cost
    (one whole budgeted-tuned prune, from the Fisher pass to the tuned model) and every metric."""
    start = time.perf_counter()
    gradients = gate_gradients(model, fisher_batches)
    timings = None
    if budget == "flops":
        costs = flop_costs(model, probe)
    else:
        inputs = random_inputs(model, latency.batch_size, latency.seq_len)
        timings = latency_table(model, inputs, latency.repeats)
        costs = latency_costs(model, timings)
    setup_seconds = time.perf_counter() - start
    table, seconds, kept = budgeted_curves(model, evaluator, gradients, costs, order, levels, methods, tune_batches,
                                           first_token_last_layer, keep_models_at, choice)
    summary: dict = {"budget": budget, "seconds": {"fisher_and_costs": round(setup_seconds, 2), **seconds}}
    for level in kept:
        summary["seconds"][f"whole_prune@{level:g}"] = round(setup_seconds + seconds[f"{BUDGETED_TUNED}@{level:g}"], 2)
    for split in evaluator.evals:
        rows = table[table.split == split]
        summary[split] = {f"{r.method}@{r.budget_removed:g}": round(r.metric, 4) for r in rows.itertuples()}
    return BudgetedComparison(table, summary, kept, timings)
