"""Stage prune: the iterative pruning curve (Figures 3/4): one-shot importance, re-estimated
importance and a random order averaged over seeds, each on dev and test. Beyond the paper: heads and
FFN neurons pruned under a FLOP or latency budget with no retraining (Kwon et al., 2022), against the
paper's order at equal cost (prune.budgeted).

Translation (Figures 5/6), on test only (decoding is the cost): also each attention kind pruned alone,
and the curve of every saved training checkpoint pruned by its own importance.
"""

from __future__ import annotations

import time

import pandas as pd
import torch
from scipy.stats import spearmanr

from pipeline.core.importance import head_importance, normalize_per_layer, random_order, rank_heads, select_heads
from pipeline.core.sites import attention_sites
from pipeline.files.atomic import write_csv, write_json
from pipeline.methods.bench import random_inputs
from pipeline.methods.budgeted import flop_costs, gate_gradients, latency_costs, latency_table
from pipeline.methods.pruning import (
    CurveEvaluator,
    budgeted_curves,
    heads_for,
    mean_over_seeds,
    plans_from_order,
    prunable_fraction,
    pruned_copy,
    pruning_levels,
    reestimated_plans,
)
from pipeline.run.experiment import Experiment, log
from pipeline.tasks.evaluation import ClassificationEval


def importance_by_site(model, table: pd.DataFrame) -> list[torch.Tensor]:
    scores = []
    for site in attention_sites(model):
        rows = table[(table.kind == site.kind) & (table.layer == site.layer)].sort_values("head")
        if len(rows) != site.num_heads:
            raise ValueError(f"importance.csv has {len(rows)} heads for {site.name}, the model {site.num_heads}")
        scores.append(torch.tensor(rows.importance.to_numpy()))
    return scores


def main() -> None:
    exp = Experiment.from_cli()
    p, pp = exp.params, exp.params.prune
    model = exp.load(exp.finetuned_dir)
    if exp.is_translation:
        evals = {"test": exp.translation_eval("test", pp.max_examples)}
        probe = {k: v[:8] for k, v in exp.score_batches()[0].items()}
    else:
        sets = exp.eval_sets(max_examples=pp.max_examples)
        evals = {s: ClassificationEval(es, exp.task()["metric"]) for s, es in sets.items()}
        probe = {k: v[:8] for k, v in sets["dev"].batches[0].items()}
    sites = attention_sites(model)
    num_heads = [site.num_heads for site in sites]
    total = sum(num_heads)
    levels = pruning_levels(pp.step, pp.max_fraction)
    counts = [heads_for(level, total) for level in levels]
    evaluator = CurveEvaluator(model, evals, probe)

    importance = importance_by_site(model, pd.read_csv(exp.reports / "importance.csv"))
    order = rank_heads(importance)
    curves = [evaluator.curve("importance", plans_from_order(order, num_heads, counts, pp.min_heads_per_layer))]
    for fraction in pp.save_fractions:  # for the recover and benchmark stages
        plan = select_heads(order, num_heads, heads_for(fraction, total), pp.min_heads_per_layer)
        exp.save(pruned_copy(model, plan), exp.pruned_dir(fraction))
    if pp.reestimate:
        plans = reestimated_plans(model, exp.score_batches(), counts, p.score.normalize_p, pp.min_heads_per_layer)
        curves.append(evaluator.curve("reestimated", plans))
    randoms = [evaluator.curve("random", plans_from_order(random_order(num_heads, seed), num_heads, counts,
                                                           pp.min_heads_per_layer))
               for seed in pp.random_seeds]
    curves.append(mean_over_seeds(randoms, "random"))
    summary: dict = {}
    if exp.is_translation and pp.by_kind:
        for kind in dict.fromkeys(site.kind for site in sites):
            in_kind = [head for head in order if sites[head[0]].kind == kind]
            kind_counts = [heads_for(level, len(in_kind)) for level in levels]
            plans = plans_from_order(in_kind, num_heads, kind_counts, pp.min_heads_per_layer)
            curves.append(evaluator.curve(f"importance-{kind}", plans, of_heads=len(in_kind)))
    if exp.is_translation and pp.checkpoints:
        curves_by_step, summary["importance_rank_correlation_with_final"] = checkpoint_curves(
            exp, evaluator, counts, torch.cat(importance))
        curves += curves_by_step

    table = pd.concat(curves, ignore_index=True)
    write_csv(exp.reports / "pruning_curve.csv", table)
    # DVC plots draw one line per column, so each split also gets a wide table.
    for split in evals:
        wide = table[table.split == split].pivot_table(index="fraction_pruned", columns="method", values="metric")
        write_csv(exp.reports / "plots" / f"pruning_{split}.csv", wide.reset_index())
    for split in evals:
        fraction, metric, base = prunable_fraction(table, "importance", split)
        summary[split] = {"prunable_fraction_within_1pt": fraction, "metric_at_prunable": metric, "unpruned": base}
    budgeted_table = pd.DataFrame(columns=["method", "split", "budget_removed", "fraction_flops_removed",
                                           "heads_pruned", "neurons_pruned", "metric", "examples", "seconds"])
    if pp.budgeted.methods:
        budgeted_table, summary["budgeted"] = budgeted(exp, model, order, probe, evals)
    write_csv(exp.reports / "budgeted_curve.csv", budgeted_table)
    for split in evals:
        wide = budgeted_table[budgeted_table.split == split].pivot_table(
            index="budget_removed", columns="method", values="metric")
        write_csv(exp.reports / "plots" / f"budgeted_{split}.csv", wide.reset_index())
    write_json(exp.reports / "prune.json", summary)
    log.info("prune: within 1 point of unpruned, %s of heads can go (importance order)",
             ", ".join(f"{100 * summary[s]['prunable_fraction_within_1pt']:.0f}% on {s}" for s in evals))


def budgeted(exp: Experiment, model, order, probe, sweep_evals: dict) -> tuple[pd.DataFrame, dict]:
    """Kwon et al.'s budgeted methods and the paper's order at equal cost; saves the budgeted-tuned models."""
    b = exp.params.prune.budgeted
    start = time.perf_counter()
    sample = exp.sample_batches(b.fisher_examples)
    gradients = gate_gradients(model, sample)
    if b.budget == "flops":
        costs = flop_costs(model, probe)
    else:
        inputs = random_inputs(model, b.latency.batch_size, b.latency.seq_len)
        table = latency_table(model, inputs, b.latency.repeats)
        write_csv(exp.reports / "plots" / "latency_table.csv", pd.DataFrame(table))
        costs = latency_costs(model, table)
    setup_seconds = time.perf_counter() - start
    if b.max_examples == exp.params.prune.max_examples:
        evals = sweep_evals
    elif exp.is_translation:
        evals = {"test": exp.translation_eval("test", b.max_examples)}
    else:
        sets = exp.eval_sets(max_examples=b.max_examples)
        evals = {s: ClassificationEval(es, exp.task()["metric"]) for s, es in sets.items()}
    tune_batches = exp.sample_batches(b.tune_examples) if "budgeted-tuned" in b.methods else []
    table, seconds, kept = budgeted_curves(
        model, CurveEvaluator(model, evals, probe), gradients, costs, order, b.levels, b.methods, tune_batches,
        first_token_last_layer=not exp.is_translation, keep_models_at=b.save_levels)
    for level, pruned in kept.items():
        exp.save(pruned, exp.budgeted_dir(level))
    for level in sorted(set(b.save_levels) - set(kept)):
        log.warning("prune: budgeted-tuned cannot remove %.0f%% of the %s: no model saved at that level",
                    100 * level, b.budget)
    summary: dict = {"budget": b.budget, "seconds": {"fisher_and_costs": round(setup_seconds, 2), **seconds}}
    for level in kept:
        # Kwon's headline cost: one whole budgeted prune, from the Fisher pass to the tuned model.
        whole = round(setup_seconds + seconds[f"budgeted-tuned@{level:g}"], 2)
        summary["seconds"][f"whole_prune@{level:g}"] = whole
        log.info("prune: budgeted-tuned with %.0f%% of the %s removed took %.0f s in all", 100 * level,
                 b.budget, whole)
    for split in evals:
        rows = table[table.split == split]
        summary[split] = {f"{r.method}@{r.budget_removed:g}": round(r.metric, 4) for r in rows.itertuples()}
    return table, summary


def checkpoint_curves(exp: Experiment, final_evaluator: CurveEvaluator, counts: list[int], final: torch.Tensor
                      ) -> tuple[list[pd.DataFrame], dict[str, float]]:
    """The paper's Section 6: prune each training checkpoint by its own importance. Also the Spearman
    correlation of each checkpoint's importance with the final model's: does importance form early?"""
    p = exp.params
    batches = exp.score_batches()
    curves, correlation = [], {}
    checkpoints = exp.checkpoint_dirs()
    last = max(checkpoints)
    for step, path in checkpoints.items():
        model = exp.load(path)
        importance = normalize_per_layer(head_importance(model, batches, progress=False), p.score.normalize_p)
        num_heads = [len(t) for t in importance]
        plans = plans_from_order(rank_heads(importance), num_heads, counts, p.prune.min_heads_per_layer)
        # The last checkpoint is the final model: its evaluator already holds most of these plans.
        evaluator = final_evaluator if step == last else CurveEvaluator(model, final_evaluator.evals,
                                                                        final_evaluator.probe)
        curves.append(evaluator.curve(f"checkpoint-{step}", plans))
        correlation[str(step)] = round(float(spearmanr(torch.cat(importance), final).statistic), 4)
        log.info("prune: checkpoint %d, importance rank correlation with the final model %.2f", step,
                 correlation[str(step)])
    return curves, correlation


if __name__ == "__main__":
    main()
