"""The report's sections, each headed by the paper's artefact it reproduces (or "Beyond the paper").

A section adds its heading, text, tables and figures to the document, or nothing when its inputs are missing.
`SECTIONS` is the report's order.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from pipeline.files.schema import (
    ALPHA,
    BUDGETED,
    BUDGETED_HEADS,
    BUDGETED_METHODS,
    BUDGETED_TUNED,
    EVAL_SPLITS,
    IMPORTANCE,
    KIND_LABELS,
    MULTIPLE,
    PAPER,
    PRECISION_METRIC,
    TASK_DATA,
    TASK_DATA_ATTRIBUTION,
    TASK_MODEL,
    UNROUNDED,
    WIDTHS,
    improvement,
    name_and_level,
)
from pipeline.report import figures
from pipeline.report.document import SPREAD_HEADER, SPREAD_IN_BRACKETS, Doc, num, pct, signed, with_spread
from pipeline.report.inputs import (
    KIND_METHODS,
    TEST,
    Inputs,
    budgeted_at,
    checkpoint_of,
    collapsed_at,
    kinds_in,
    measured_on,
    precisions_in,
    sorted_by_precision,
    splits_in,
)
from pipeline.report.paper import budgeted_sentences, compared_with_paper, llm_anchor_sentences, side_by_side, table4


def _compared_with_paper(doc: Doc, inp: Inputs) -> None:
    sentences = compared_with_paper(inp)
    if sentences:
        doc.h(1, "Compared with the paper")
        doc.ul(sentences)


def _setup(doc: Doc, inp: Inputs) -> None:
    ft = inp.finetune
    if not ft:
        return
    doc.h(1, "Setup")
    items = [f"Model: {ft[TASK_MODEL]}" if TASK_MODEL in ft else "",
             f"Data: {ft[TASK_DATA]}" if TASK_DATA in ft else ""]
    for split in EVAL_SPLITS:
        if split in ft:
            items.append(f"Unpruned {split} {inp.metric_name}: {num(float(ft[split]))}")
    if PRECISION_METRIC in ft:  # as the machine resolved runtime.precision (auto: by its hardware)
        items.append(f"Precision: {ft[PRECISION_METRIC]} (autocast of the matrix products; weights fp32)"
                     if ft[PRECISION_METRIC] != "fp32" else "Precision: fp32")
    doc.ul([i for i in items if i])
    if ft.get(TASK_DATA_ATTRIBUTION):
        doc.p(f"Data attribution: {ft[TASK_DATA_ATTRIBUTION]}")


def _curve_groups(curve: pd.DataFrame) -> list[tuple[str | None, str, str, list[str]]]:
    """The pruning-curve figures as (heading, file stem, title, methods), empty ones left out.

    The importance order against its baselines is Figures 3/4 (under the section's own heading: None); one
    attention kind pruned at a time is Figure 5 (MT), and training checkpoints pruned by their own importance
    are Figure 6 (MT).
    """
    methods = list(dict.fromkeys(curve["method"]))
    per_kind = [m for m in methods if m in KIND_METHODS]
    dynamics = sorted((m for m in methods if checkpoint_of(m) is not None), key=checkpoint_of)
    main = [m for m in methods if m not in per_kind and m not in dynamics]
    groups = [(None, "pruning_curve", "Pruning heads in order of importance vs. baselines", main)]
    if per_kind:
        by_kind = per_kind + ([IMPORTANCE] if IMPORTANCE in methods else [])
        groups.append(("Figure 5: pruning by attention kind", "pruning_by_kind",
                       "Pruning one attention kind at a time", by_kind))
    if dynamics:
        groups.append(("Figure 6: importance during training", "pruning_during_training",
                       "Pruning at different training checkpoints", dynamics))
    return [g for g in groups if g[3]]


def _pruning_curves(doc: Doc, inp: Inputs) -> None:
    curve = inp.curve
    if curve is None:
        return
    doc.h(1, "Figures 3/4: iterative pruning")
    if "examples" in curve:
        sizes = curve.groupby("split", sort=False)["examples"].first()
        doc.p("Every level is evaluated on " + " and ".join(f"{int(n)} {s}" for s, n in sizes.items())
              + " examples.")
    groups = _curve_groups(curve)
    for heading, name, title, methods in groups:
        if heading is not None:
            doc.h(1, heading)
        png = figures.curves(inp, curve, methods, "fraction_pruned", "heads pruned (% of all heads)", title)
        doc.figure(f"{name}.png", png, f"{title}: {inp.metric_name} vs. share of heads pruned.")
    if "fraction_flops_removed" in curve and curve["fraction_flops_removed"].notna().any():
        doc.h(1, "Beyond the paper: pruning curves against FLOPs removed")
        png = figures.curves(inp, curve, groups[0][3], "fraction_flops_removed", "inference FLOPs removed (%)",
                             "Accuracy vs. compute removed")
        doc.figure("pruning_curve_flops.png", png, f"{inp.metric_name} vs. share of inference FLOPs removed.")


def _same_units(layers: pd.DataFrame, a: str, b: str) -> bool:
    """Whether methods `a` and `b` keep the same number of units in every layer at every level."""
    columns = ["budget_removed", "unit", "kind", "layer", "kept"]
    rows = [layers[layers["method"] == m][columns].sort_values(columns[:4]).reset_index(drop=True) for m in (a, b)]
    return rows[0].equals(rows[1])


def _budgeted(doc: Doc, inp: Inputs) -> None:
    curve = inp.budgeted
    if curve is None:
        return
    methods = [m for m in (PAPER, *BUDGETED_METHODS) if m in set(curve["method"])]
    splits = splits_in(curve)
    cost = inp.budget_name
    doc.h(1, f"Beyond the paper: heads and FFN neurons under a {cost} budget")
    doc.p("The paper prunes heads only, ranks them by |gradient| and never retrains. Kwon et al. (2022) prune "
          "heads and FFN neurons jointly under a FLOP or latency budget, also without retraining: choose by "
          "Fisher importance, rearrange within each layer, then tune the kept units' scales by least squares. "
          f"Here each method removes the same share of the model's {cost}; `{PAPER}` removes heads in the paper's "
          f"importance order until the model fits. `{BUDGETED_HEADS}` is Fisher on heads only, `{BUDGETED}` adds "
          f"FFN neurons, `{BUDGETED_TUNED}` adds the tuning.")
    doc.figure("budgeted.png", figures.budgeted(inp, curve, methods),
               f"{inp.metric_name} of each method at the same share of {cost} removed.")

    split = TEST if TEST in splits else splits[-1]
    levels = sorted(set(curve["budget_removed"]) - {0.0})
    table = {f"{cost} removed": [pct(lv) for lv in levels]}
    collapsed = collapsed_at(curve, split)
    for method in methods:
        table[method] = [(num(v) + (" ⚠" if (method, lv) in collapsed else "")
                          if (v := budgeted_at(curve, split, method, lv)) is not None else "out of reach")
                         for lv in levels]
    if {PAPER, BUDGETED_TUNED} <= set(methods):
        margins = []
        for lv in levels:
            ours, theirs = budgeted_at(curve, split, BUDGETED_TUNED, lv), budgeted_at(curve, split, PAPER, lv)
            margins.append(signed(ours - theirs) if ours is not None and theirs is not None else "")
        table[f"{BUDGETED_TUNED} - {PAPER}"] = margins
    examples = int(curve[curve["split"] == split]["examples"].iloc[0]) if "examples" in curve else None
    doc.h(2, f"{inp.metric_name} on {split}" + (f" ({examples} examples)" if examples else ""))
    doc.table(pd.DataFrame(table))
    if collapsed:
        # By level, then in the table's column order: `collapsed` is a set, whose order varies from run to run.
        in_order = sorted(collapsed, key=lambda c: (c[1], methods.index(c[0])))
        doc.p("Collapsed (⚠): " + "; ".join(f"`{m}` at {pct(lv)}" for m, lv in in_order)
              + ". Each lost more than `prune.budgeted.collapse` against the level before or against "
              "unpruned: do not ship a model from such a level without checking it.")
    doc.ul(budgeted_sentences(inp, split))
    layers = inp.budgeted_layers
    if layers is not None:
        shown = [m for m in methods if m in set(layers["method"])]
        same = BUDGETED in shown and BUDGETED_TUNED in shown and _same_units(layers, BUDGETED, BUDGETED_TUNED)
        if same:  # tuning rescales the kept units, it does not choose them: one panel says it
            shown.remove(BUDGETED_TUNED)
        doc.figure("budgeted_layers.png", figures.kept_per_layer(layers, shown, cost),
                   "Heads and FFN neurons each method keeps, per layer and level (the count in each cell)"
                   + (f"; `{BUDGETED_TUNED}` keeps what `{BUDGETED}` keeps." if same else "."))

    _budgeted_speed_table(doc, inp)
    doc.h(2, "Side by side: the paper, Kwon et al.'s reported numbers, and this run")
    doc.table(side_by_side(inp, split))


_AMDAHL_SENTENCE = (
    "A floor model (the unpruned model cut to one head and one FFN neuron a layer), timed in the same rounds, "
    "takes the floor's share of the unpruned model's time: embeddings, LayerNorms, the task head and each call's "
    "fixed work, which pruning does not shrink. The Amdahl estimate is the speedup if that share stayed and the "
    "rest shrank exactly with the FLOPs. It is an estimate, not a bound: where the work a model removes took more "
    "than its FLOPs' share of the rest, the model beats it.")


def _has_floor(bench: pd.DataFrame) -> bool:
    """Whether the benchmark timed a floor model beside these rows (encoders; not translation's decoding)."""
    return "amdahl_speedup" in bench and bench["amdahl_speedup"].notna().all()


def _against_ideal(rows: pd.DataFrame, floor: bool) -> dict[str, pd.Series]:
    """Each row's FLOP ideal and its measured speedup as a fraction of it; with a floor, also the floor's share, the
    row's Amdahl estimate and its speedup as a fraction of that."""
    # Three digits for the fraction of the ideal: two would print a median of 0.898 as 0.90, on a 0.9 target.
    columns = {"ideal (FLOPs)": rows["ideal_speedup"].map(lambda v: num(v, 2)),
               "of ideal": (rows["speedup"] / rows["ideal_speedup"]).map(lambda v: num(v, 3))}
    if floor:
        columns |= {"floor's share": rows["floor_share"].map(pct),
                    "Amdahl estimate": rows["amdahl_speedup"].map(lambda v: num(v, 2)),
                    "of estimate": (rows["speedup"] / rows["amdahl_speedup"]).map(lambda v: num(v, 2))}
    return columns


def _budgeted_speed_table(doc: Doc, inp: Inputs) -> None:
    """The saved budgeted-tuned models' throughput against unpruned, at every batch size (benchmark_budgeted.csv),
    and where widths were rounded to the measured multiple, what rounding cost in the metric (prune.json)."""
    bench = inp.benchmark_budgeted
    if bench is None or not (bench["budget_removed"] > 0).any():
        return
    rows = sorted_by_precision(bench[bench["budget_removed"] > 0],
                               ["precision", "attn_implementation", "budget_removed", "widths", "batch_size"])
    several = len(precisions_in(bench)) > 1
    doc.h(2, f"Speed of the saved `{BUDGETED_TUNED}` models")
    floor = _has_floor(rows)
    doc.p(f"Measured on {measured_on(bench)}, the models taking turns within each round: the median of the rounds' "
          f"throughput ratios to unpruned, with {SPREAD_IN_BRACKETS}, beside the ideal from FLOPs"
          + (f". {_AMDAHL_SENTENCE}" if floor else "."))
    doc.table(pd.DataFrame({
        **({"precision": rows["precision"]} if several else {}),
        "attention": rows["attn_implementation"], "removed": rows["budget_removed"].map(pct),
        "FFN widths": rows["widths"], "batch": rows["batch_size"], SPREAD_HEADER: with_spread(rows),
        **_against_ideal(rows, floor)}))
    doc.figure("budgeted_speed.png", figures.budgeted_speed(rows),
               "Measured speedup of the saved models against batch size, with the rounds' range, beside the ideal "
               "from FLOPs" + (" and the Amdahl estimate from the floor's share." if floor else "."))
    widths = inp.budgeted_summary.get(WIDTHS) or {}
    if widths.get(UNROUNDED):
        costs = []
        for key, unrounded in widths[UNROUNDED].items():
            split, level = name_and_level(key)
            rounded = budgeted_at(inp.budgeted, split, BUDGETED_TUNED, level)
            if rounded is not None:
                costs.append(f"{split} at {pct(level)} removed: {num(rounded)} rounded, {num(unrounded)} as "
                             f"searched ({signed(rounded - unrounded)})")
        doc.p(f"FFN widths rounded to multiples of {widths[MULTIPLE]} neurons (`prune.budgeted.width_multiple`, "
              f"measured on this device: the smallest multiple within 3% of the best FLOP-ideal speed). What it costs "
              f"in {inp.metric_name}: " + "; ".join(costs) + ".")


def _importance(doc: Doc, inp: Inputs) -> None:
    df = inp.importance
    if df is None:
        return
    doc.h(1, "Head importance: the order of Figures 3/4")
    frames = {k: df[df["kind"] == k] for k in kinds_in(df)}
    png = figures.heatmaps(
        frames, "importance", "importance (normalised per layer)", "Head importance scores", diverging=False
    )
    doc.figure("importance.png", png, "Head importance (proxy score, normalised within each layer), layer x head.")


def _single_head_ablation(doc: Doc, inp: Inputs) -> None:
    df = inp.ablation
    if df is None:
        return
    doc.h(1, "Table 1: single-head ablation")
    sig = df[df["p_value"] < ALPHA]
    frames = {k: df[df["kind"] == k] for k in kinds_in(df)}
    marks = {k: sig[sig["kind"] == k] for k in frames}
    png = figures.heatmaps(
        frames,
        "delta",
        f"{inp.delta_label()} when the head is removed",
        "Effect of removing one head",
        diverging=True,
        marks=marks,
    )
    what = inp.delta_label(unit=False)
    doc.figure(
        "ablation.png",
        png,
        f"{what[:1].upper()}{what[1:]} when a single head is masked (red: worse, blue: better); "
        f"boxed * = significant at p < {ALPHA}.",
    )
    improving = int((sig["delta"] > 0).sum())
    on = f" on {int(df['examples'].iloc[0])} examples" if "examples" in df else ""
    doc.p(
        f"Evaluated{on}: {len(sig)} of {len(df)} single-head removals change {inp.metric_name} significantly "
        f"(p < {ALPHA}, uncorrected), {improving} of them for the better. With {len(df)} tests about "
        f"{ALPHA * len(df):.0f} would be expected at this level by chance alone."
    )

    def fmt(rows: pd.DataFrame) -> pd.DataFrame:
        out = pd.DataFrame(
            {
                "kind": rows["kind"],
                "layer": rows["layer"],
                "head": rows["head"],
                inp.metric_name: rows["metric"].map(num),
                f"delta ({inp.points})": rows["delta"].map(signed),
                "p-value": rows["p_value"].map(lambda p: f"{p:.3g}"),
            }
        )
        return out if len(kinds_in(df)) > 1 else out.drop(columns="kind")

    n = min(5, len(df))
    doc.h(2, "Most harmful removals")
    doc.table(fmt(df.nsmallest(n, "delta")))
    doc.h(2, "Most helpful removals")
    doc.table(fmt(df.nlargest(n, "delta")))


def _one_head_per_layer(doc: Doc, inp: Inputs) -> None:
    df = inp.one_head
    if df is None:
        return
    doc.h(1, "Tables 2/3: one head per layer")
    kinds = kinds_in(df)
    df = df.assign(_rank=df["kind"].map(kinds.index)).sort_values(["_rank", "layer"])
    worst = df.loc[df["delta"].idxmin()]
    where = f"{KIND_LABELS.get(worst['kind'], worst['kind'])} layer {worst['layer']}"
    doc.p(
        f"The worst layer to reduce to its best single head is {where} ({signed(worst['delta'])} "
        f"{inp.points}); the median change over layers is {signed(df['delta'].median())} {inp.points}."
    )
    table = pd.DataFrame(
        {
            "kind": df["kind"],
            "layer": df["layer"],
            "best head": df["best_head"],
            inp.metric_name: df["metric"].map(num),
            f"delta ({inp.points})": df["delta"].map(signed),
        }
    )
    doc.table(table if df["kind"].nunique() > 1 else table.drop(columns="kind"))


def _one_group_per_layer(doc: Doc, inp: Inputs) -> None:
    df = inp.one_group
    if df is None:
        return
    doc.h(1, "Tables 2/3 under grouped-query attention: one key/value group per layer")
    df = df.sort_values("layer")
    worst = df.loc[df["delta"].idxmin()]
    doc.p(f"Each layer keeps one key/value head and the {int(df['heads'].iloc[0])} query heads it serves, the others "
          f"masked; the worst layer to reduce so is layer {worst['layer']} ({signed(worst['delta'])} {inp.points}).")
    doc.table(pd.DataFrame({"layer": df["layer"], "best group": df["best_group"],
                            inp.metric_name: df["metric"].map(num), f"delta ({inp.points})": df["delta"].map(signed)}))


def _recovery(doc: Doc, inp: Inputs) -> None:
    rec = inp.recovery
    if rec is None:
        return
    doc.h(1, "Beyond the paper: fine-tuning after pruning")
    rec = rec.sort_values("fraction_pruned", kind="stable")
    if (rec["fraction_pruned"] == 0).any():
        doc.p("The row with no heads pruned is the control: the unpruned model fine-tuned the same way. What it "
              "gains is adaptation to the fine-tuning data, which the pruned models gain too; their recovery is "
              "what they win beyond it.")
    doc.figure("recovery.png", figures.recovery(inp, rec),
               f"{inp.metric_name} of pruned models before and after fine-tuning.")
    doc.table(
        pd.DataFrame(
            {
                **({"model": rec["model"]} if "model" in rec else {}),
                **({"method": rec["method"]} if "method" in rec else {}),
                "heads pruned": rec["fraction_pruned"].map(pct),
                "before": rec["metric_before"].map(num),
                "after": rec["metric_after"].map(num),
                f"recovered ({inp.points})": improvement(inp.metric, rec["metric_after"], rec["metric_before"]
                                                          ).map(signed),
            }
        )
    )


def _speed(doc: Doc, inp: Inputs) -> None:
    bench = inp.benchmark
    if bench is None:
        return
    doc.h(1, "Table 4: inference speed")
    several = len(precisions_in(bench)) > 1
    doc.p(f"Measured on {measured_on(bench)} (device, precision). A speedup compares a pruned model with the "
          f"unpruned one at the same precision, batch size and attention implementation: the models take turns "
          f"each round, each called until its calls have lasted `benchmark.turn_seconds` and the round keeping "
          f"their median, and the speedup is the median of the rounds' ratios, with {SPREAD_IN_BRACKETS} and as "
          f"the error bars. The ideal speedup is the ratio of their forward-pass FLOPs.")
    doc.figure("speedup.png", figures.speedup(bench),
               "Throughput speedup of the physically pruned model; dashed: ideal speedup.")
    if _has_floor(bench):
        rows = sorted_by_precision(bench[bench["fraction_pruned"] > 0],
                                   ["precision", "attn_implementation", "fraction_pruned", "batch_size"])
        doc.h(2, "Against the work no pruning removes")
        doc.p(_AMDAHL_SENTENCE)
        doc.table(pd.DataFrame({
            **({"precision": rows["precision"]} if several else {}),
            "attention": rows["attn_implementation"], "heads pruned": rows["fraction_pruned"].map(pct),
            "batch": rows["batch_size"], SPREAD_HEADER: with_spread(rows), **_against_ideal(rows, floor=True)}))

    if "tokens_per_s" in bench:
        # Decoding speed: the paper's Table 4 measured BERT classification, so it is not set beside it.
        rows = sorted_by_precision(bench, ["precision", "attn_implementation", "batch_size", "fraction_pruned"])
        doc.h(2, "Decoding speed (every model generates the same number of tokens)")
        doc.table(pd.DataFrame({
            **({"precision": rows["precision"]} if several else {}),
            "attention": rows["attn_implementation"], "batch": rows["batch_size"],
            "heads pruned": rows["fraction_pruned"].map(pct), "sentences/s": rows["examples_per_s"].map(num),
            "tokens/s": rows["tokens_per_s"].map(lambda v: num(v, 0)),
            SPREAD_HEADER: with_spread(rows),
            "ideal (FLOPs)": rows["ideal_speedup"].map(lambda v: num(v, 2))}))
    table = None if "tokens_per_s" in bench else table4(bench)
    if table is not None:
        frac, df = table
        doc.h(2, f"Compared with the paper's Table 4 ({pct(frac)} of heads pruned)")
        doc.table(df)
    if "peak_memory_mb" in bench and bench["peak_memory_mb"].notna().any():
        keys = ["precision", "attn_implementation", "fraction_pruned"]
        mem = bench.dropna(subset=["peak_memory_mb"]).drop_duplicates(keys)
        columns = [c for c in ("weights_mb", "activations_mb", "peak_memory_mb") if c in mem]
        mem = sorted_by_precision(mem, keys)
        mem = mem[[*(["precision"] if several else []), "attn_implementation", "batch_size", "fraction_pruned",
                   *columns]]
        mem["fraction_pruned"] = mem["fraction_pruned"].map(pct)
        mem = mem.rename(columns={"attn_implementation": "attention", "batch_size": "batch",
                                  "fraction_pruned": "heads pruned", "weights_mb": "weights (MiB)",
                                  "activations_mb": "peak activations (MiB)", "peak_memory_mb": "peak total (MiB)"})
        doc.h(2, "Peak memory of one forward pass")
        on_gpu = (bench["device"].astype(str) != "cpu").any()
        source = ("CUDA's allocator (`torch.cuda.max_memory_allocated` during the pass, less what was allocated "
                  "before it)" if on_gpu else "torch's CPU allocator (exact, not the process's resident set)")
        doc.p(f"Weights plus the peak of live activations, from {source}. Heads hold a small share of the weights, "
              f"and under sdpa the feed-forward activations, not attention scores, set the peak.")
        doc.table(mem.astype(object).map(lambda v: num(v, 1) if isinstance(v, float) else v))


def _serving(doc: Doc, inp: Inputs) -> None:
    """Beyond the paper: a pruned decoder-only LLM served with its KV cache (llm_benchmark.csv)."""
    bench = inp.llm_benchmark
    if bench is None:
        return
    doc.h(1, "Beyond the paper: serving a pruned LLM (KV cache and decoding speed)")
    sentences = llm_anchor_sentences(inp)
    if sentences:
        doc.h(2, "Beside the tools people prune LLMs with")
        doc.ul(sentences)
    first = bench.drop_duplicates("model")
    doc.h(2, "KV-cache bytes per token, measured from the cache tensors")
    doc.p("What decoding reads from memory besides the weights, and what bounds the batch a GPU holds: it falls "
          "only when key/value heads go, that is when a whole key/value group goes.")
    doc.table(pd.DataFrame({
        "model": first["model"], "KV bytes/token": first["kv_bytes_per_token"].map(lambda v: num(v, 0)),
        "saving": (1 - 1 / first["ideal_speedup_kv"]).map(pct), "parameters": first["params"].map(lambda v: f"{v:,}")}))
    doc.p(f"Measured on {measured_on(bench)}. Speedups compare each model with the unpruned one in the same run "
          f"(the median of the rounds' ratios, the models taking turns within each round, with "
          f"{SPREAD_IN_BRACKETS}); the ideals are the ratio of FLOPs (of the prefill, or "
          f"of one decode step at the mean context) and of KV bytes per token.")
    doc.table(pd.DataFrame({
        "model": bench["model"], "phase": bench["phase"], "batch": bench["batch_size"],
        "tokens/s": bench["tokens_per_s"].map(lambda v: num(v, 0)),
        SPREAD_HEADER: with_spread(bench),
        "ideal (FLOPs)": bench["ideal_speedup_flops"].map(lambda v: num(v, 2)),
        "of ideal (FLOPs)": (bench["speedup"] / bench["ideal_speedup_flops"]).map(lambda v: num(v, 2)),
        "ideal (KV bytes)": bench["ideal_speedup_kv"].map(lambda v: num(v, 2)),
        "peak memory (MiB)": bench["peak_memory_mb"].map(lambda v: num(v, 1))}))


# The summary comes first: it is what a reader wants; the sections below back it up.
SECTIONS: tuple[Callable[[Doc, Inputs], None], ...] = (
    _compared_with_paper,
    _setup,
    _pruning_curves,
    _budgeted,
    _importance,
    _single_head_ablation,
    _one_head_per_layer,
    _one_group_per_layer,
    _recovery,
    _speed,
    _serving,
)
