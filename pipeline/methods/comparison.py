"""Beyond the paper, at equal cost: the paper's order (heads removed by importance until the model fits the
budget) against Kwon et al.'s budgeted methods (`pipeline.methods.budgeted`), level by level, on every split.
The prune stage's budgeted comparison (`budgeted_curve.csv`, `prune.json`'s "budgeted") is `budgeted_comparison`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from pipeline.core.importance import PAPER_CHOICE, Head, HeadChoice
from pipeline.core.sites import attention_sites, ffn_sites
from pipeline.files.schema import (
    BUDGET,
    BUDGETED_HEADS,
    BUDGETED_TABLE,
    BUDGETED_TUNED,
    HEADS_FROM,
    LAYERS_TABLE,
    MULTIPLE,
    PAPER,
    SECONDS,
    TABLE_COLUMNS,
    TUNING_KEPT,
    UNROUNDED,
    WHOLE_PRUNE,
    WIDTHS,
    at_level,
    loss_against,
)
from pipeline.methods.bench import random_inputs
from pipeline.methods.budgeted import budgeted_prune
from pipeline.methods.budgeted_costs import UnitCosts, flop_costs
from pipeline.methods.budgeted_latency import latency_costs, latency_table
from pipeline.methods.budgeted_search import Batches, BudgetError, UnitGradients, gate_gradients
from pipeline.methods.pruning import CurveEvaluator, Plan, pruned_copy
from pipeline.methods.widths import probe_width_multiple


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


def kept_per_layer(model: nn.Module, method: str, level: float) -> list[dict]:
    """What `model` keeps, site by site: one row per attention site (heads) and per FFN site (neurons)."""
    rows = [dict(method=method, budget_removed=level, unit="heads", kind=site.kind, layer=site.layer,
                 kept=site.num_heads, of=site.original_num_heads) for site in attention_sites(model)]
    rows += [dict(method=method, budget_removed=level, unit="neurons", kind=site.kind, layer=site.layer,
                  kept=site.num_neurons, of=site.original_num_neurons) for site in ffn_sites(model)]
    return rows


@dataclass
class BudgetedCurves:
    """What `budgeted_curves` measured."""

    table: pd.DataFrame  # one row per method, level and split
    layers: pd.DataFrame  # what each pruned model keeps, layer by layer (`kept_per_layer`)
    seconds: dict[str, float]  # what each budgeted prune took, by "method@level"
    tuning_kept: dict[str, bool]  # budgeted-tuned, by level: whether it kept its tuning
    heads_from: dict[str, str]  # budgeted-heads, by level: the candidate its heads came from
    models: dict[float, nn.Module]  # the budgeted-tuned models at `keep_models_at`
    # With a neuron multiple above 1, budgeted-tuned at `keep_models_at` as searched without it: the models, and
    # their metric by "split@level", the accuracy rounding costs.
    unrounded: dict[float, nn.Module] = field(default_factory=dict)
    unrounded_metrics: dict[str, float] = field(default_factory=dict)


def budgeted_curves(
    model: nn.Module, evaluator: CurveEvaluator, gradients: UnitGradients, costs: UnitCosts,
    paper_order: Sequence[Head], levels: Sequence[float], methods: Sequence[str], tune_batches: Batches,
    first_token_last_layer: bool, keep_models_at: Sequence[float] = (), choice: HeadChoice = PAPER_CHOICE,
    calibration: Batches = (), head_importance: Sequence[torch.Tensor] | None = None, neuron_multiple: int = 1,
) -> BudgetedCurves:
    """The paper's order and each budgeted method at every level (the fraction of the cost removed). Levels a
    method cannot reach are left out: pruning heads alone cannot remove the FFNs' share. The joint methods keep
    neurons in blocks of `neuron_multiple`; above 1, budgeted-tuned at `keep_models_at` is also pruned without it,
    to measure what rounding costs."""
    rows: list[dict] = []
    layers: list[dict] = []
    seconds: dict[str, float] = {}
    tuning_kept: dict[str, bool] = {}
    heads_from: dict[str, str] = {}
    models: dict[float, nn.Module] = {}
    unrounded: dict[float, nn.Module] = {}
    unrounded_metrics: dict[str, float] = {}
    unpruned = evaluator.evaluate(model)

    def add(method: str, level: float, pruned: nn.Module, took: float | None = None) -> None:
        result = unpruned if pruned is model else evaluator.evaluate(pruned)
        layers.extend(kept_per_layer(pruned, method, level))
        for split in evaluator.evals:
            rows.append(dict(method=method, split=split, budget_removed=level,
                             fraction_flops_removed=result["fraction_flops_removed"],
                             heads_pruned=result["heads_pruned"], neurons_pruned=result["neurons_pruned"],
                             metric=result[split], examples=len(evaluator.evals[split]), seconds=took))

    all_methods = [PAPER, *methods]
    for method in all_methods:
        add(method, 0.0, model)
    for level, method in tqdm([(lv, m) for lv in levels for m in all_methods], desc="prune (budgeted)",
                              leave=False):
        if method == PAPER:
            plan = paper_plan_at_cost(model, paper_order, costs, 1 - level, choice)
            if plan is not None:
                add(method, level, pruned_copy(model, plan))
            continue
        prune = functools.partial(budgeted_prune, model, gradients, costs, 1 - level, method, tune_batches,
                                  first_token_last_layer, choice=choice, calibration=calibration,
                                  head_importance=head_importance)
        try:
            result = prune(neuron_multiple=neuron_multiple)
        except BudgetError:
            continue
        took = sum(result.seconds.values())
        seconds[at_level(method, level)] = round(took, 2)
        if method == BUDGETED_TUNED:
            tuning_kept[f"{level:g}"] = result.tuned
            if level in keep_models_at:
                models[level] = result.model
                if neuron_multiple > 1:
                    unrounded[level] = prune(neuron_multiple=1).model
                    measured = evaluator.evaluate(unrounded[level])
                    unrounded_metrics |= {at_level(split, level): round(measured[split], 4)
                                          for split in evaluator.evals}
        if method == BUDGETED_HEADS and calibration:
            heads_from[f"{level:g}"] = result.heads_from
        add(method, level, result.model, took)
    return BudgetedCurves(pd.DataFrame(rows), pd.DataFrame(layers, columns=TABLE_COLUMNS[LAYERS_TABLE]), seconds,
                          tuning_kept, heads_from, models, unrounded, unrounded_metrics)


def flag_collapses(table: pd.DataFrame, metric: str, collapse: float) -> pd.DataFrame:
    """`table` (budgeted_curve.csv's rows) with its `collapsed` column: a level collapsed when its metric is
    more than `collapse` worse (`loss_against`) than the same method's level before, or than unpruned."""
    flagged = table.copy()
    flagged["collapsed"] = False
    for _, rows in flagged.groupby(["method", "split"], sort=False):
        rows = rows.sort_values("budget_removed")
        base, before = rows["metric"].iloc[0], rows["metric"].shift(1)
        for index, value, previous in zip(rows.index[1:], rows["metric"].iloc[1:], before.iloc[1:], strict=True):
            worst = max(loss_against(metric, value, previous), loss_against(metric, value, base))
            flagged.loc[index, "collapsed"] = bool(worst > collapse)
    return flagged


def collapse_lines(table: pd.DataFrame, cost: str) -> list[str]:
    """One line per collapsed row of a flagged budgeted_curve.csv, for the prune stage's log."""
    lines = []
    for row in table[table["collapsed"].astype(bool)].itertuples():
        rows = table[(table.method == row.method) & (table.split == row.split)].sort_values("budget_removed")
        earlier = rows[rows.budget_removed < row.budget_removed]
        lines.append(f"{row.method} collapsed at {100 * row.budget_removed:.0f}% of the {cost} removed on "
                     f"{row.split}: {row.metric:.4g}, after {earlier.metric.iloc[-1]:.4g} at "
                     f"{100 * earlier.budget_removed.iloc[-1]:.0f}% and {earlier.metric.iloc[0]:.4g} unpruned")
    return lines


@dataclass(frozen=True)
class LatencyShape:
    """The input a latency budget is measured at (`prune.budgeted.latency`)."""

    batch_size: int
    seq_len: int
    repeats: int


@dataclass
class BudgetedComparison:
    table: pd.DataFrame  # budgeted_curve.csv
    layers: pd.DataFrame  # budgeted_layers.csv: what every pruned model keeps, layer by layer
    summary: dict  # prune.json's "budgeted"
    models: dict[float, nn.Module] = field(default_factory=dict)  # budgeted-tuned models by level removed
    latency_table: list[dict] | None = None  # with a latency budget: the per-layer timings measured
    unrounded: dict[float, nn.Module] = field(default_factory=dict)  # the same, as searched without a multiple


def empty_budgeted_tables() -> tuple[pd.DataFrame, pd.DataFrame]:
    """budgeted_curve.csv and budgeted_layers.csv of an experiment with no budgeted methods."""
    return pd.DataFrame(columns=TABLE_COLUMNS[BUDGETED_TABLE]), pd.DataFrame(columns=TABLE_COLUMNS[LAYERS_TABLE])


def budgeted_comparison(
    model: nn.Module, order: Sequence[Head], probe: Mapping[str, torch.Tensor], evaluator: CurveEvaluator,
    fisher_batches: Batches, tune_batches: Batches, methods: Sequence[str], levels: Sequence[float],
    budget: str = "flops", latency: LatencyShape | None = None, first_token_last_layer: bool = True,
    keep_models_at: Sequence[float] = (), choice: HeadChoice = PAPER_CHOICE, calibration: Batches = (),
    metric: str = "accuracy", collapse: float = 10.0, head_importance: Sequence[torch.Tensor] | None = None,
    width_multiple: int | str = 1, width_probe_tokens: Sequence[int] = (),
) -> BudgetedComparison:
    """Fisher gradients on `fisher_batches`, unit costs (FLOPs on `probe`, or a latency table measured at
    `latency`), then `budgeted_curves` (budgeted-heads ranking by `head_importance`; given `calibration`,
    budgeted-heads choosing on it and budgeted-tuned checking its tuning on it), the rows that collapsed flagged
    (`flag_collapses`). The summary records where the tuning was kept, which candidate budgeted-heads' heads came
    from, the seconds each part took, Kwon's headline cost (one whole budgeted-tuned prune, from the Fisher pass
    to the tuned model) and every metric. `width_multiple` "auto" measures the neuron multiple on this device at
    `width_probe_tokens` tokens (`probe_width_multiple`); the summary's WIDTHS holds it, the probe's
    efficiencies and the metrics budgeted-tuned has without it."""
    start = time.perf_counter()
    widths: dict = {}
    probe_seconds = {}
    if width_multiple == "auto":
        parameter = next(model.parameters())
        probe_result = probe_width_multiple(model.config.hidden_size, ffn_sites(model)[0].num_neurons,
                                            width_probe_tokens, parameter.device, parameter.dtype)
        width_multiple = probe_result.multiple
        widths = {"probe_efficiency": {str(m): e for m, e in probe_result.efficiency.items()}}
        probe_seconds = {"width_probe": round(time.perf_counter() - start, 2)}
    widths = {MULTIPLE: width_multiple, **widths}
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
    curves = budgeted_curves(model, evaluator, gradients, costs, order, levels, methods, tune_batches,
                             first_token_last_layer, keep_models_at, choice, calibration, head_importance,
                             width_multiple)
    table = flag_collapses(curves.table, metric, collapse)
    summary: dict = {BUDGET: budget,
                     SECONDS: {**probe_seconds, "fisher_and_costs": round(setup_seconds, 2), **curves.seconds},
                     WIDTHS: widths | ({UNROUNDED: curves.unrounded_metrics} if curves.unrounded_metrics else {})}
    if curves.tuning_kept:
        summary[TUNING_KEPT] = curves.tuning_kept
    if curves.heads_from:
        summary[HEADS_FROM] = curves.heads_from
    for level in curves.models:
        summary[SECONDS][at_level(WHOLE_PRUNE, level)] = round(
            setup_seconds + curves.seconds[at_level(BUDGETED_TUNED, level)], 2)
    for split in evaluator.evals:
        rows = table[table.split == split]
        summary[split] = {at_level(r.method, r.budget_removed): round(r.metric, 4) for r in rows.itertuples()}
    return BudgetedComparison(table, curves.layers, summary, curves.models, timings, curves.unrounded)
