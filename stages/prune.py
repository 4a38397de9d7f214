"""Stage prune: the iterative pruning curve (Figures 3/4): one-shot importance, re-estimated
importance and a random order averaged over seeds, each on dev and test."""

from __future__ import annotations

import pandas as pd
import torch

from pipeline.atomic import write_csv, write_json
from pipeline.checkpoint import save_model
from pipeline.experiment import Experiment, log
from pipeline.importance import random_order, rank_heads, select_heads
from pipeline.pruning import (
    CurveEvaluator,
    heads_for,
    mean_over_seeds,
    plans_from_order,
    pruned_copy,
    pruning_levels,
    reestimated_plans,
)
from pipeline.report import prunable_fraction
from pipeline.sites import attention_sites


def importance_by_site(model, table: pd.DataFrame) -> list[torch.Tensor]:
    scores = []
    for site in attention_sites(model):
        rows = table[(table.kind == site.kind) & (table.layer == site.layer)].sort_values("head")
        if len(rows) != site.num_heads:
            raise ValueError(f"importance.csv has {len(rows)} heads for {site.name}, the model {site.num_heads}")
        scores.append(torch.tensor(rows.importance.to_numpy()))
    return scores


def main() -> None:
    exp = Experiment.from_params_file()
    p, task = exp.params, exp.task()
    pp = p.prune
    model, tokenizer = exp.load(exp.finetuned_dir), exp.tokenizer()
    eval_sets = exp.eval_sets(max_examples=pp.max_examples)
    num_heads = [site.num_heads for site in attention_sites(model)]
    total = sum(num_heads)
    counts = [heads_for(level, total) for level in pruning_levels(pp.step, pp.max_fraction)]
    probe = {k: v[:8] for k, v in eval_sets["dev"].batches[0].items()}
    evaluator = CurveEvaluator(model, eval_sets, task["metric"], probe)

    order = rank_heads(importance_by_site(model, pd.read_csv(exp.reports / "importance.csv")))
    curves = [evaluator.curve("importance", plans_from_order(order, num_heads, counts, pp.min_heads_per_layer))]
    for fraction in pp.save_fractions:  # for the recover and benchmark stages
        plan = select_heads(order, num_heads, heads_for(fraction, total), pp.min_heads_per_layer)
        save_model(pruned_copy(model, plan), exp.pruned_dir(fraction), tokenizer)
    if pp.reestimate:
        plans = reestimated_plans(model, exp.score_batches(), counts, p.score.normalize_p, pp.min_heads_per_layer)
        curves.append(evaluator.curve("reestimated", plans))
    randoms = [evaluator.curve("random", plans_from_order(random_order(num_heads, seed), num_heads, counts,
                                                           pp.min_heads_per_layer))
               for seed in pp.random_seeds]
    curves.append(mean_over_seeds(randoms, "random"))
    table = pd.concat(curves, ignore_index=True)
    write_csv(exp.reports / "pruning_curve.csv", table)

    # DVC plots draw one line per column, so each split also gets a wide table.
    for split in eval_sets:
        wide = table[table.split == split].pivot_table(index="fraction_pruned", columns="method", values="metric")
        write_csv(exp.reports / "plots" / f"pruning_{split}.csv", wide.reset_index())
    summary = {}
    for split in eval_sets:
        fraction, metric, base = prunable_fraction(table, "importance", split)
        summary[split] = {"prunable_fraction_within_1pt": fraction, "metric_at_prunable": metric, "unpruned": base}
    write_json(exp.reports / "prune.json", summary)
    log.info("prune: within 1 point of unpruned, %.0f%% of heads can go on dev and %.0f%% on test (importance)",
             *(100 * summary[s]["prunable_fraction_within_1pt"] for s in ("dev", "test")))


if __name__ == "__main__":
    main()
