"""Iterative pruning curves: cumulative removal of the globally least important heads, evaluated at each
level on every split. The paper's Figures 3/4 (`paper_curves`: one-shot importance, re-estimated importance,
random orders), Figure 5 (`kind_curves`: one attention kind pruned alone) and Figure 6 (`checkpoint_curves`:
each training checkpoint pruned by its own importance), and the prunable fraction they summarise.

Every level is evaluated on a physically pruned copy (outputs equal the masked model's; tested in
the core), which is also faster. Results are memoised by the set of removed heads, so levels that
several methods share (0% at least) are evaluated once.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy.stats import spearmanr
from torch import nn
from tqdm.auto import tqdm

from pipeline.core.flops import forward_flops
from pipeline.core.importance import PAPER_CHOICE, Head, HeadChoice, head_importance, normalize_per_layer
from pipeline.core.levels import LevelError
from pipeline.core.sites import AttentionSite, attention_sites, ffn_sites
from pipeline.core.surgery import prune_heads
from pipeline.data.evaluation import TaskEval
from pipeline.files.artifacts import DamagedArtifact, read_table
from pipeline.files.schema import (
    IMPORTANCE,
    RANDOM,
    REESTIMATED,
    checkpoint_method,
    kind_method,
    within_tolerance,
)
from pipeline.methods.criteria import head_scores

Plan = dict[int, list[int]]


def pruning_levels(step: float, max_fraction: float) -> list[float]:
    """0, step, 2*step, ... up to max_fraction (inclusive, up to float noise)."""
    n = int(max_fraction / step + 1e-9)
    return [round(i * step, 10) for i in range(n + 1)]


def heads_for(fraction: float, total: int) -> int:
    return int(round(fraction * total))


def pruned_copy(model: nn.Module, plan: Mapping[int, Sequence[int]]) -> nn.Module:
    return prune_heads(copy.deepcopy(model), plan)


def saved_plans(order: Sequence[Head], sites: Sequence[AttentionSite], fractions: Sequence[float],
                choice: HeadChoice, key: str) -> dict[float, Plan]:
    """The plan of the model saved at each of `fractions` (`key` names the param), all made before any is saved so
    that a bad level stops the stage with nothing written: each at a level the shape takes and removing some heads
    (`HeadChoice.saved_count`), else LevelError."""
    plans = {}
    for fraction in fractions:
        plan = choice.select(order, sites, choice.saved_count(fraction, sites, key))
        if not plan:  # prune.min_heads_per_layer can keep every head a non-uniform plan would take
            raise LevelError(f"{key}: {fraction:g} removes no head while every layer keeps "
                             f"{choice.min_heads_per_site} (prune.min_heads_per_layer), so the saved model would be "
                             f"the unpruned one")
        plans[fraction] = plan
    return plans


def plans_from_order(order: Sequence[Head], sites: Sequence[AttentionSite], counts: Sequence[int],
                     choice: HeadChoice = PAPER_CHOICE) -> Iterator[Plan]:
    for count in counts:
        yield choice.select(order, sites, count)


def reestimated_plans(
    model: nn.Module, score_batches: Sequence[Mapping[str, torch.Tensor]], counts: Sequence[int],
    normalize_p: float | None, choice: HeadChoice = PAPER_CHOICE,
) -> Iterator[Plan]:
    """The paper's `--exact_pruning`: before each step, re-score the heads of the model pruned so far
    and remove the next least important ones (in whole `unit`s under grouped-query attention)."""
    removed: Plan = {}
    for count in counts:
        need = count - sum(len(h) for h in removed.values())
        if need > 0:
            current = pruned_copy(model, removed)
            sites = attention_sites(current)
            scores = normalize_per_layer(head_importance(current, score_batches, progress=False), normalize_p)
            # Scores index the heads still present; kept_heads maps those positions to original indices.
            step = choice.select(choice.rank(scores, sites), sites, need)
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
            # Frozen: under a half-precision autocast that spans the stage, torch caches the cast of every weight
            # that requires grad until the outermost autocast exits, so each copy's weights would stay in memory.
            self._cache[key] = self.evaluate(pruned_copy(self.model, plan).requires_grad_(False))
        return self._cache[key]

    def evaluate(self, model: nn.Module) -> dict:
        """The metric of `model` (a pruned copy of the evaluator's) on every split, with how much it prunes."""
        result = {split: task_eval(model)[0] for split, task_eval in self.evals.items()}
        result["heads_pruned"] = self.total_heads - sum(s.num_heads for s in attention_sites(model))
        result["neurons_pruned"] = self.total_neurons - sum(s.num_neurons for s in ffn_sites(model))
        result["fraction_flops_removed"] = 1 - forward_flops(model, self.probe) / self.base_flops
        return result

    def curve(self, method: str, plans: Iterable[Plan], of_heads: int | None = None,
              progress: bool = True, compensate: Callable[[nn.Module], nn.Module] | None = None) -> pd.DataFrame:
        """One row per plan and split; fraction_pruned is relative to `of_heads` (default: all heads),
        e.g. the heads of one attention kind when only that kind is pruned. `compensate` changes each pruned copy
        before it is evaluated (language models: the least-squares refit), so its results are not cached."""
        rows = []
        for plan in tqdm(plans, desc=f"prune ({method})", disable=not progress, leave=False):
            result = self(plan) if compensate is None else self.evaluate(
                compensate(pruned_copy(self.model, plan).requires_grad_(False)))
            for split in self.evals:
                rows.append(dict(method=method, split=split,
                                 fraction_pruned=result["heads_pruned"] / (of_heads or self.total_heads),
                                 heads_pruned=result["heads_pruned"], metric=result[split],
                                 fraction_flops_removed=result["fraction_flops_removed"],
                                 examples=len(self.evals[split])))
        return pd.DataFrame(rows)


def importance_by_site(model: nn.Module, path: Path) -> list[torch.Tensor]:
    """The per-site importance tensors of `model` from the score stage's table at `path` (kind, layer, head,
    importance). A table that lacks heads of the model (truncated, or from another model) is damaged."""
    table = read_table(path)
    scores = []
    for site in attention_sites(model):
        rows = table[(table.kind == site.kind) & (table.layer == site.layer)].sort_values("head")
        if len(rows) != site.num_heads:
            raise DamagedArtifact(path, f"{len(rows)} heads for {site.name}, the model has {site.num_heads}")
        scores.append(torch.tensor(rows.importance.to_numpy()))
    return scores


def paper_curves(
    evaluator: CurveEvaluator, order: Sequence[Head], counts: Sequence[int], random_seeds: Sequence[int],
    choice: HeadChoice = PAPER_CHOICE, reestimate_batches: Sequence[Mapping[str, torch.Tensor]] | None = None,
    normalize_p: float | None = 2.0,
) -> list[pd.DataFrame]:
    """Figures 3/4: heads removed in importance order (one-shot), re-estimated before every step (when
    `reestimate_batches` are given), and in random orders (the mean over `random_seeds`)."""
    sites = attention_sites(evaluator.model)
    curves = [evaluator.curve(IMPORTANCE, plans_from_order(order, sites, counts, choice))]
    if reestimate_batches is not None:
        plans = reestimated_plans(evaluator.model, reestimate_batches, counts, normalize_p, choice)
        curves.append(evaluator.curve(REESTIMATED, plans))
    randoms = [evaluator.curve(RANDOM, plans_from_order(choice.random(sites, seed), sites, counts, choice))
               for seed in random_seeds]
    curves.append(mean_over_seeds(randoms, RANDOM))
    return curves


def criterion_scores(model: nn.Module, criteria: Sequence[str], batches: Sequence[Mapping[str, torch.Tensor]]
                     ) -> dict[str, list[torch.Tensor]]:
    """Each of `criteria` (`HEAD_CRITERIA`: Torch-Pruning's magnitude, Minitron's activation norm and the paper's
    importance on `batches`), normalised per layer by L2, whatever score.normalize_p says for the importance order.
    A weight or activation norm is on its layer's scale, not the loss's, and both tools choose heads layer by layer:
    ranked raw across layers, the activation norm empties SmolLM2's first layer (mean head norm 0.18, against 0.9
    to 6.0 in the others), all nine heads in the first 27, and its test perplexity goes from 62 to 487 at 10% of
    the heads. The paper's importance is normalised as the paper does."""
    return {criterion: normalize_per_layer(head_scores(criterion, model, batches), 2.0) for criterion in criteria}


def criterion_curves(evaluator: CurveEvaluator, scores: Mapping[str, Sequence[torch.Tensor]], counts: Sequence[int],
                     choice: HeadChoice = PAPER_CHOICE) -> list[pd.DataFrame]:
    """One curve per criterion of `scores` (`criterion_scores`), ranked and chosen exactly as the importance order
    is, so that only the scores differ."""
    sites = attention_sites(evaluator.model)
    return [evaluator.curve(criterion, plans_from_order(choice.rank(list(by_site), sites), sites, counts, choice))
            for criterion, by_site in scores.items()]


def kind_curves(evaluator: CurveEvaluator, order: Sequence[Head], levels: Sequence[float],
                choice: HeadChoice = PAPER_CHOICE) -> list[pd.DataFrame]:
    """Figure 5: each attention kind (encoder, decoder, cross) pruned alone, in the global importance order;
    fraction_pruned is the share of that kind's heads."""
    sites = attention_sites(evaluator.model)
    curves = []
    for kind in dict.fromkeys(site.kind for site in sites):
        in_kind = [head for head in order if sites[head[0]].kind == kind]
        counts = [heads_for(level, len(in_kind)) for level in levels]
        plans = plans_from_order(in_kind, sites, counts, choice)
        curves.append(evaluator.curve(kind_method(kind), plans, of_heads=len(in_kind)))
    return curves


def checkpoint_curves(
    checkpoints: Mapping[int, Callable[[], nn.Module]], final_evaluator: CurveEvaluator,
    batches: Sequence[Mapping[str, torch.Tensor]], counts: Sequence[int], final_importance: Sequence[torch.Tensor],
    normalize_p: float | None = 2.0, choice: HeadChoice = PAPER_CHOICE, log: Callable[[str], None] | None = None,
) -> tuple[list[pd.DataFrame], dict[str, float]]:
    """Figure 6 (the paper's Section 6): prune each training checkpoint (step -> loader, the last being the
    final model) by its own importance. Also the Spearman correlation of each checkpoint's importance with
    the final model's (`final_importance`, per site): does importance form early?"""
    curves, correlation = [], {}
    final = torch.cat(list(final_importance))
    last = max(checkpoints)
    for step, load in checkpoints.items():
        model = load()
        importance = normalize_per_layer(head_importance(model, batches, progress=False), normalize_p)
        sites = attention_sites(model)
        plans = plans_from_order(choice.rank(importance, sites), sites, counts, choice)
        # The last checkpoint is the final model: its evaluator already holds most of these plans.
        evaluator = final_evaluator if step == last else CurveEvaluator(model, final_evaluator.evals,
                                                                        final_evaluator.probe)
        curves.append(evaluator.curve(checkpoint_method(step), plans))
        correlation[str(step)] = round(float(spearmanr(torch.cat(importance), final).statistic), 4)
        if log is not None:
            log(f"checkpoint {step}, importance rank correlation with the final model {correlation[str(step)]:.2f}")
    return curves, correlation


def mean_over_seeds(curves: Sequence[pd.DataFrame], method: str) -> pd.DataFrame:
    """Average several seeds' curves level by level, with the standard deviation as metric_std."""
    keys = ["split", "fraction_pruned", "heads_pruned", "examples"]
    stacked = pd.concat(curves)
    out = stacked.groupby(keys, sort=False).agg(
        metric=("metric", "mean"), metric_std=("metric", "std"),
        fraction_flops_removed=("fraction_flops_removed", "mean")).reset_index()
    out.insert(0, "method", method)
    return out


def prunable_fraction(curve: pd.DataFrame, method: str, split: str, metric: str) -> tuple[float, float, float] | None:
    """Largest share of heads pruned with every level up to it within the tolerance of the unpruned `metric`
    (`schema.within_tolerance`: 1 point, or a 5% rise in perplexity).

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
        if not within_tolerance(metric, r.metric, base):
            break
        best = (float(r.fraction_pruned), float(r.metric), base)
    return best
