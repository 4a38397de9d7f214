"""Stage prune: the iterative pruning curves of Figures 3/4 (one-shot importance, re-estimated importance
and random orders), on dev and test, and the pruned models the recover and benchmark stages measure.
Beyond the paper: heads and FFN neurons pruned under a FLOP or latency budget with no retraining (Kwon et
al., 2022), against the paper's order at equal cost (prune.budgeted).

The evaluations are the family's (`Task.evaluations`: translation on test only, decoding is the cost), and so are
any further curves (`Task.extra_curves`: translation's attention kinds pruned alone, Figure 5, and its training
checkpoints pruned by their own importance, Figure 6) and tables (`Task.extra_tables`: a language model's curves in
the other unit). Perplexity's tolerance is relative: at most 5% above the unpruned model's.

prune.json, a DVC metric, holds the headline only: per split the prunable fraction, the metric there and unpruned.
Beside it: prune_seconds.csv (where the time went), budgeted.json (how the budgeted comparison ran; its metrics are
budgeted_curve.csv's), kv_groups.csv (grouped-query attention: the serving-shape models) and the family's tables
(translation: rank_correlation.csv).
"""

from __future__ import annotations

from pipeline.run.preflight import preflight

if __name__ == "__main__":  # the params in a second or two, before the imports below load torch
    preflight("prune")

import time

import pandas as pd

from pipeline.core.checkpoint import stock_config
from pipeline.core.importance import HeadChoice
from pipeline.core.levels import LevelError
from pipeline.core.sites import attention_sites
from pipeline.files.atomic import write_csv, write_json
from pipeline.files.schema import (
    BUDGETED_FILE,
    BUDGETED_HEADS,
    BUDGETED_TABLE,
    BUDGETED_TUNED,
    CURVE_TABLE,
    HEADS_FROM,
    IMPORTANCE,
    IMPORTANCE_TABLE,
    KV_GROUPS_TABLE,
    LATENCY_TABLE,
    LAYERS_TABLE,
    METRIC_AT_PRUNABLE,
    NOT_STOCK_BECAUSE,
    PRUNABLE_FRACTION,
    PRUNE_SECONDS_TABLE,
    PRUNE_SUMMARY,
    SECONDS,
    STOCK,
    TABLE_COLUMNS,
    TUNING_KEPT,
    UNPRUNED_METRIC,
    WHOLE_PRUNE,
    name_and_level,
    tolerance_text,
)
from pipeline.methods.comparison import LatencyShape, budgeted_comparison, collapse_lines, empty_budgeted_tables
from pipeline.methods.pruning import (
    CurveEvaluator,
    criterion_curves,
    criterion_scores,
    heads_for,
    importance_by_site,
    paper_curves,
    prunable_fraction,
    pruned_copy,
    pruning_levels,
    saved_plans,
)
from pipeline.run.experiment import Experiment, log


def main(argv: list[str] | None = None) -> None:
    exp = Experiment.from_cli(argv)
    with exp.runtime.autocast():  # every evaluation, importance and tuning pass at the runtime's precision
        prune(exp)


class Laps:
    """Where the stage's minutes go: `lap(name)` records the seconds since the last lap under `name`
    (prune_seconds.csv; the stage logs each)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(now - self._last, 1)
        self._last = now


def seconds_table(laps: dict[str, float], budgeted: dict[str, float]) -> pd.DataFrame:
    """prune_seconds.csv: the stage's laps, then the budgeted comparison's parts ("method@level", a level each, or
    one serving every level: "fisher_and_costs")."""
    rows = [{"part": name, "level": None, "seconds": seconds} for name, seconds in laps.items()]
    rows += [dict(zip(("part", "level"), name_and_level(key), strict=True), seconds=seconds)
             for key, seconds in budgeted.items()]
    return pd.DataFrame(rows, columns=TABLE_COLUMNS[PRUNE_SECONDS_TABLE])


def prune(exp: Experiment) -> None:
    p, pp = exp.params, exp.params.prune
    lap = Laps()
    model = exp.load(exp.finetuned_dir)
    task = exp.task
    evals = task.evaluations(pp.max_examples)
    probe = task.probe_batch(evals)  # a short batch to count FLOPs on
    sites = attention_sites(model)
    total = sum(site.num_heads for site in sites)
    choice = HeadChoice(pp.unit, pp.uniform, pp.min_heads_per_layer)
    levels = pruning_levels(pp.step, pp.max_fraction)
    counts = [heads_for(level, total) for level in levels]
    evaluator = CurveEvaluator(model, evals, probe)
    importance = importance_by_site(model, exp.reports / IMPORTANCE_TABLE)
    order = choice.rank(importance, sites)
    lap("load the model and data")

    serving = HeadChoice("group", uniform=True)
    try:  # every saved level one the shape takes, checked before anything is written (pipeline/core/levels.py)
        saved = saved_plans(order, sites, pp.save_fractions, choice, "prune.save_fractions")
        kv_groups = saved_plans(serving.rank(importance, sites), sites, pp.kv_group_fractions, serving,
                                "prune.kv_group_fractions")
    except LevelError as error:
        raise SystemExit(f"error: {error}") from None
    for fraction, plan in saved.items():  # for the recover and benchmark stages
        exp.save(pruned_copy(model, plan), exp.pruned_dir(fraction))
        removed = sum(map(len, plan.values()))
        log.info("prune: %s holds the model with %d of %d heads removed (%.1f%%)", exp.pruned_dir(fraction), removed,
                 total, 100 * removed / total)
    summary: dict = {}
    shapes = []  # kv_groups.csv
    for fraction, plan in kv_groups.items():  # the serving shape, for the benchmark stage
        pruned = pruned_copy(model, plan)
        exp.save(pruned, exp.kv_groups_dir(fraction))
        stock, why_not = stock_config(pruned)
        shapes += [{"fraction_removed": fraction, "layer": layer, "kv_heads": site.num_kv_heads,
                    STOCK: stock is not None, NOT_STOCK_BECAUSE: "" if stock is not None else why_not}
                   for layer, site in enumerate(attention_sites(pruned))]
    if shapes or task.one_group_table:  # grouped-query attention: the table even when no such model is saved
        write_csv(exp.reports / KV_GROUPS_TABLE, pd.DataFrame(shapes, columns=TABLE_COLUMNS[KV_GROUPS_TABLE]))
    lap("save the pruned models")
    curves = paper_curves(evaluator, order, counts, pp.random_seeds, choice,
                          task.score_batches() if pp.reestimate else None, p.score.normalize_p)
    lap("paper's curves (importance, re-estimated, random)")
    criteria = criterion_scores(model, pp.criteria, task.score_batches()) if pp.criteria else {}
    if criteria:
        curves += criterion_curves(evaluator, criteria, counts, choice)
        lap("criteria curves")
    extra, found = task.extra_curves(evaluator, order, levels, counts, importance, choice, lap)
    curves += extra
    table = pd.concat(curves, ignore_index=True)
    write_csv(exp.reports / CURVE_TABLE, table)
    for name, extra_table in found.items():
        write_csv(exp.reports / name, extra_table)
    for name, extra_table in task.extra_tables(evaluator, importance, criteria, counts, choice, lap).items():
        write_csv(exp.reports / name, extra_table)
    for split in evals:
        fraction, metric, base = prunable_fraction(table, IMPORTANCE, split, exp.metric)
        summary[split] = {PRUNABLE_FRACTION: fraction, METRIC_AT_PRUNABLE: metric, UNPRUNED_METRIC: base}

    b = pp.budgeted
    budgeted_table, budgeted_layers = empty_budgeted_tables()
    budgeted: dict = {}  # budgeted.json: how the comparison ran
    budgeted_seconds: dict[str, float] = {}
    if b.methods:
        budget_evals = evals if b.max_examples == pp.max_examples else task.evaluations(b.max_examples)
        tune_batches = task.sample_batches(b.tune_examples) if BUDGETED_TUNED in b.methods else []
        calibrates = b.calibration_examples and {BUDGETED_HEADS, BUDGETED_TUNED} & set(b.methods)
        calibration = task.sample_batches(b.calibration_examples, skip=b.fisher_examples) if calibrates else []
        if calibrates and not calibration:
            log.warning("prune: %s has no examples left after the Fisher sample's %d: %s ranks heads by the raw "
                        "Fisher information and %s keeps its tuning unchecked", p.score.split, b.fisher_examples,
                        BUDGETED_HEADS, BUDGETED_TUNED)
        result = budgeted_comparison(
            model, order, probe, CurveEvaluator(model, budget_evals, probe), task.sample_batches(b.fisher_examples),
            tune_batches, b.methods, b.levels, b.budget, LatencyShape(**b.latency.model_dump()),
            first_token_last_layer=task.first_token_last_layer, keep_models_at=b.save_levels, choice=choice,
            calibration=calibration, metric=exp.metric, collapse=b.collapse, head_importance=importance,
            width_multiple=b.width_multiple, width_probe_tokens=b.width_probe_tokens)
        for line in collapse_lines(result.table, b.budget):
            log.warning("prune: %s", line)
        for level, pruned in result.models.items():
            exp.save(pruned, exp.budgeted_dir(level))
        for level, pruned in result.unrounded.items():
            exp.save(pruned, exp.budgeted_dir(level, unrounded=True))
        widths = result.summary["widths"]
        log.info("prune: the joint budgeted methods keep FFN neurons in blocks of %d%s", widths["multiple"],
                 f" (measured, of the FLOP-ideal speed per multiple: {widths['probe_efficiency']})"
                 if "probe_efficiency" in widths else "")
        for level in sorted(set(b.save_levels) - set(result.models)):
            log.warning("prune: %s cannot remove %.0f%% of the %s: no model saved at that level", BUDGETED_TUNED,
                        100 * level, b.budget)
        for level, kept in result.summary.get(TUNING_KEPT, {}).items():
            if not kept:
                log.info("prune: %s at %.0f%% of the %s removed: tuning raised the held-out loss, so the model is "
                         "left untuned", BUDGETED_TUNED, 100 * float(level), b.budget)
        for level, source in result.summary.get(HEADS_FROM, {}).items():
            log.info("prune: %s at %.0f%% of the %s removed: heads from %s", BUDGETED_HEADS, 100 * float(level),
                     b.budget, source)
        for key, seconds in result.summary[SECONDS].items():
            part, level = name_and_level(key)
            if part == WHOLE_PRUNE:
                log.info("prune: %s with %.0f%% of the %s removed took %.0f s in all", BUDGETED_TUNED, 100 * level,
                         b.budget, seconds)
        budgeted_table, budgeted_layers = result.table, result.layers
        # Its metrics are budgeted_curve.csv's and its seconds go to prune_seconds.csv: the rest describes the run.
        budgeted = {key: value for key, value in result.summary.items() if key not in (SECONDS, *evals)}
        budgeted_seconds = result.summary[SECONDS]
        if result.latency_table is not None:
            budgeted[LATENCY_TABLE] = result.latency_table
        lap("budgeted comparison")
    for name, seconds in lap.seconds.items():
        log.info("prune: %s took %.0f s", name, seconds)
    write_csv(exp.reports / BUDGETED_TABLE, budgeted_table)
    write_csv(exp.reports / LAYERS_TABLE, budgeted_layers)
    write_json(exp.reports / BUDGETED_FILE, budgeted)
    write_csv(exp.reports / PRUNE_SECONDS_TABLE, seconds_table(lap.seconds, budgeted_seconds))
    write_json(exp.reports / PRUNE_SUMMARY, exp.metrics(summary))
    prunable = ", ".join(f"{100 * summary[s][PRUNABLE_FRACTION]:.0f}% on {s}" for s in evals)
    log.info("prune: within %s of unpruned, %s of heads can go (importance order)",
             tolerance_text(exp.metric), prunable)


if __name__ == "__main__":
    main()
