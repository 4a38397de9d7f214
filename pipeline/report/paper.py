"""The papers' numbers and claims, and one computed sentence per claim that sets this run beside them.

Michel, Levy & Neubig (2019), "Are Sixteen Heads Really Better than One?", is the paper reproduced; Kwon et al.
(2022) is the budgeted method that goes beyond it. Kept in one place so the classification and the MT
experiments share them. A sentence function returns None when its inputs are missing.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.files.schema import (
    ALPHA,
    BUDGETED_TUNED,
    IMPORTANCE,
    KIND_LABELS,
    KINDS,
    METRIC_AT_PRUNABLE,
    NOT_STOCK_BECAUSE,
    PAPER,
    PRUNABLE_FRACTION,
    RANDOM,
    STOCK,
    TASK_DATA,
    TASK_MODEL,
    UNPRUNED_METRIC,
    checkpoint_method,
    improvement,
    kind_method,
    kv_groups_label,
    tolerance_text,
    within_tolerance,
)
from pipeline.report.document import SPREAD_HEADER, num, pct, plural, signed
from pipeline.report.inputs import (
    CROSS,
    DEV,
    TEST,
    Inputs,
    budgeted_at,
    kinds_in,
    measured_on,
    precisions_in,
    rows_at,
    sorted_by_precision,
    splits_in,
    unpruned,
)

MICHEL: dict = {
    # Figures 3-4: share of all heads prunable by importance before the metric drops noticeably.
    "prunable": {"MNLI": "about 40%", "SST-2": "50-60%", "WMT": "about 20%"},
    # Table 1, single-head ablation: heads whose removal changes the metric significantly (p < 0.05).
    "single_head": {
        "bert": {"significant": 0, "of": 144, "improving": 0, "where": "BERT on MNLI"},
        "mt": {"significant": 8, "of": 96, "improving": 4, "where": "the WMT encoder self-attention"},
    },
    # Figure 5: pruning encoder-decoder (cross) attention collapses BLEU beyond this share of heads.
    "cross_collapse_above": 0.6,
    # Table 4: BERT-base, MNLI, 50% of heads pruned, GTX 1080Ti; examples/s (unpruned, pruned, % gain).
    "speedup": {
        "fraction_pruned": 0.5,
        "table": {
            1: (17.0, 17.3, 1.9),
            4: (67.3, 69.1, 2.7),
            16: (114.0, 134.0, 17.5),
            64: (124.7, 146.6, 17.5),
        },
        "headline_batch": 64,
    },
}

# Kwon, Kim, Mahoney, Hassoun, Keutzer & Gholami (2022), "A Fast Post-Training Pruning Framework for
# Transformers": heads and FFN neurons under a FLOP or latency budget, no retraining (their abstract).
KWON: dict = {"flops_removed": 0.4, "loss": "under 1 point", "latency_speedup": 1.56, "minutes": 3,
              "where": "BERT-base on GLUE and SQuAD", "hardware": "one GPU"}


# --- "Compared with the paper": one computed sentence per claim ---------------------------------------


def _prunable(inp: Inputs) -> str | None:
    """Figures 3/4: the share of heads that goes within the tolerance of the unpruned model."""
    parts = []
    for split in (TEST, DEV):
        # What the prune stage found on its importance curve (`prunable_fraction`), as it wrote it to prune.json.
        found = (inp.prune or {}).get(split)
        if found is not None:
            frac, metric, base = found[PRUNABLE_FRACTION], found[METRIC_AT_PRUNABLE], found[UNPRUNED_METRIC]
            parts.append(f"{pct(frac)} of heads on {split} ({num(base)} -> {num(metric)})")
    if not parts:
        return None
    task = inp.task
    if task is not None:
        paper = f"{MICHEL['prunable'][task]} on {task}"
    else:
        paper = f"{MICHEL['prunable']['MNLI']} for BERT on MNLI and {MICHEL['prunable']['SST-2']} on SST-2"
    return (
        f"Pruning heads by importance stays within {tolerance_text(inp.metric, inp.point)} of the unpruned model "
        f"up to {' and '.join(parts)}; the paper reports {paper}."
    )


def _single_head(inp: Inputs) -> str | None:
    """Table 1: how many single-head removals change the metric significantly."""
    df = inp.ablation
    if df is None:
        return None
    ref = MICHEL["single_head"]["mt" if inp.is_mt else "bert"]
    paper = f"the paper finds {ref['significant']} of {ref['of']} in {ref['where']}" + (
        f", {ref['improving']} of them improving" if ref["significant"] else ""
    )
    pieces = []
    for kind in kinds_in(df):
        part = df[df["kind"] == kind]
        sig = part[part["p_value"] < ALPHA]
        label = f" {KIND_LABELS.get(kind, kind)}" if len(kinds_in(df)) > 1 else ""
        pieces.append(f"{len(sig)} of {len(part)}{label} heads ({int((sig['delta'] > 0).sum())} improving)")
    if (df["p_value"] < ALPHA).sum() == 0:
        ours = f"No single head's removal changes {inp.metric_name} significantly (p < {ALPHA}, "
    else:
        ours = f"Removing a single head changes {inp.metric_name} significantly (p < {ALPHA}) for "
    return f"{ours}{'; '.join(pieces)}{')' if ours.endswith(', ') else ''}; {paper}."


def _recovery(inp: Inputs) -> str | None:
    """Beyond the paper, which never retrains: what fine-tuning after pruning wins back."""
    if inp.recovery is None:
        return None
    rec, control = inp.recovery[inp.recovery["fraction_pruned"] > 0], inp.recovery[inp.recovery["fraction_pruned"] == 0]
    if rec.empty:
        return None
    gain = improvement(inp.metric, rec["metric_after"], rec["metric_before"])
    top = rec.loc[rec["fraction_pruned"].idxmax()]
    same = "" if control.empty else (
        f" The unpruned model fine-tuned the same way goes from {num(control['metric_before'].iloc[0])} to "
        f"{num(control['metric_after'].iloc[0])}: that much is adaptation to the data, not recovery.")
    return (
        f"Fine-tuning after pruning recovers {signed(gain.mean())} {inp.points} on average "
        f"(from {signed(gain.min())} to {signed(gain.max())} over {plural(len(rec), 'level')}); at "
        f"{pct(top['fraction_pruned'])} pruned it goes from {num(top['metric_before'])} to "
        f"{num(top['metric_after'])}.{same} The paper prunes without any retraining."
    )


def _speedup(inp: Inputs) -> str | None:
    """Table 4's headline: throughput at the paper's share of heads pruned and batch size."""
    bench = inp.benchmark
    if bench is None:
        return None
    ref = MICHEL["speedup"]
    frac, batch = ref["fraction_pruned"], ref["headline_batch"]
    rows = rows_at(bench, "fraction_pruned", frac)
    rows = rows[rows["batch_size"] == batch]
    if rows.empty:
        return None
    several = len(precisions_in(rows)) > 1
    measured = "; ".join(
        f"{signed(100 * (r.speedup - 1))}% with {r.attn_implementation} attention"
        f"{f' at {r.precision}' if several else ''} (ideal {signed(100 * (r.ideal_speedup - 1))}%)"
        for r in rows.itertuples()
    )
    return (
        f"With {pct(frac)} of heads pruned at batch size {batch}, throughput changes by {measured} "
        f"({measured_on(rows)}); the paper measured {signed(ref['table'][batch][2])}% (BERT-base, GTX 1080Ti)."
    )


def _vs_random(inp: Inputs, low: float = 0.2, high: float = 0.8) -> str | None:
    """Figures 3/4: is the importance order better than a random one over the middle of the curve?"""
    curve = inp.curve
    if curve is None or not {IMPORTANCE, RANDOM} <= set(curve["method"]):
        return None
    parts = []
    for split in splits_in(curve):
        part = curve[curve["split"] == split]
        imp = part[part["method"] == IMPORTANCE].groupby(part["fraction_pruned"].round(6))["metric"].mean()
        rnd = part[part["method"] == RANDOM].groupby(part["fraction_pruned"].round(6))["metric"].mean()
        levels = sorted(f for f in set(imp.index) & set(rnd.index) if low - 1e-9 <= f <= high + 1e-9)
        if not levels:
            continue
        losing = [f for f in levels if not improvement(inp.metric, imp[f], rnd[f]) > 0]
        if not losing:
            parts.append(f"at all {len(levels)} levels on {split}")
        else:
            parts.append(
                f"at {len(levels) - len(losing)} of {len(levels)} levels on {split} "
                f"(not at {', '.join(pct(f) for f in losing)})"
            )
    if not parts:
        return None
    every = all(p.startswith("at all") for p in parts)
    return (
        f"Importance-based pruning {'beats' if every else 'does not always beat'} random pruning between "
        f"{pct(low)} and {pct(high)} of heads pruned: better {'; '.join(parts)}."
    )


def _cross_collapse(inp: Inputs) -> str | None:
    """Figure 5: cross-attention cannot be pruned beyond ~60% while self-attention can."""
    curve = inp.curve
    if curve is None or kind_method(CROSS) not in set(curve["method"]):
        return None
    split = TEST if TEST in set(curve["split"]) else splits_in(curve)[0]
    part = curve[curve["split"] == split]
    threshold = MICHEL["cross_collapse_above"]
    losses = {}
    for kind in KINDS:
        rows = part[part["method"] == kind_method(kind)].sort_values("fraction_pruned")
        base = unpruned(rows)
        above = rows[rows["fraction_pruned"] > threshold + 1e-9]
        if base is not None and not above.empty:
            losses[kind] = (float(above["fraction_pruned"].max()),
                            -improvement(inp.metric, float(above["metric"].iloc[-1]), base))
    if CROSS not in losses:
        return None
    frac, cross_loss = losses[CROSS]
    others = [f"{num(loss)} for {KIND_LABELS[k]}" for k, (_, loss) in losses.items() if k != CROSS]
    sharper = all(cross_loss > loss for k, (_, loss) in losses.items() if k != CROSS)
    verdict = (
        "it collapses much more than self-attention, as in the paper"
        if sharper and others
        else "it does not collapse more than self-attention, unlike the paper"
        if others
        else "the paper reports a collapse beyond " + pct(threshold)
    )
    versus = f" (vs. {', '.join(others)})" if others else ""
    return (
        f"Pruning {pct(frac)} of cross-attention heads costs {num(cross_loss)} {inp.points} on {split}"
        f"{versus}; {verdict}."
    )


def _early_importance(inp: Inputs) -> str | None:
    """Figure 6 (Section 6): which heads matter is settled early in training, and robustness to pruning grows."""
    correlation = inp.rank_correlation
    curve = inp.curve
    if not correlation or curve is None:
        return None
    steps = sorted(correlation, key=float)
    split = TEST if TEST in set(curve["split"]) else splits_in(curve)[0]
    # BLEU kept at half the heads pruned, relative to each checkpoint's own unpruned BLEU (Figure 6 is relative:
    # an early checkpoint's BLEU is near 0, so "within 1 point" would say nothing).
    kept = {}
    for step in steps:
        rows = curve[(curve["method"] == checkpoint_method(int(step))) & (curve["split"] == split)]
        base, half = unpruned(rows), rows[np.isclose(rows["fraction_pruned"], 0.5)]
        if base and not half.empty:
            kept[step] = float(half["metric"].iloc[0]) / base
    ranks = ", ".join(f"{correlation[s]:.2f} at step {s}" for s in steps[:-1])
    final = float(steps[-1])
    formed = [s for s in steps[:-1] if correlation[s] >= 0.7]
    if formed and float(formed[0]) <= final / 3:
        verdict = (f"the ranking is largely in place (rho >= 0.7) by step {formed[0]} of {steps[-1]}, as the paper "
                   "found (important heads are determined early)")
    elif formed:
        verdict = (f"the ranking settles (rho >= 0.7) only at step {formed[0]} of {steps[-1]}, later than the "
                   "paper's finding that important heads are determined early")
    else:
        verdict = ("the ranking keeps changing until the end of training, unlike the paper's finding that "
                   "important heads are determined early")
    retained = ""
    if kept:
        retained = ("; with half the heads pruned, checkpoints keep "
                    + ", ".join(f"{100 * r:.0f}% (step {s})" for s, r in kept.items()) + " of their own BLEU")
    return f"Head importance at each checkpoint vs. the final model (Spearman): {ranks}; {verdict}{retained}."


def compared_with_paper(inp: Inputs) -> list[str]:
    """One sentence per claim of the paper that this run's inputs can test, in the report's order."""
    sentences = (_prunable(inp), _single_head(inp), _recovery(inp), _speedup(inp), _vs_random(inp),
                 _cross_collapse(inp), _early_importance(inp))
    return [s for s in sentences if s]


# --- Table 4 -------------------------------------------------------------------------------------------


def table4(bench: pd.DataFrame) -> tuple[float, pd.DataFrame] | None:
    """Our throughput at the pruned level closest to the paper's 50%, next to the paper's numbers."""
    ref = MICHEL["speedup"]
    pruned = bench[bench["fraction_pruned"] > 0]
    if pruned.empty:
        return None
    fracs = pruned["fraction_pruned"].unique()
    frac = float(fracs[np.argmin(np.abs(fracs - ref["fraction_pruned"]))])
    rows = []
    several = len(precisions_in(bench)) > 1
    at = rows_at(bench, "fraction_pruned", frac)
    for r in sorted_by_precision(at, ["precision", "attn_implementation", "batch_size"]).itertuples():
        full = bench[(bench["attn_implementation"] == r.attn_implementation) & (bench["batch_size"] == r.batch_size)
                     & (bench["precision"] == r.precision)]
        full = rows_at(full, "fraction_pruned", 0.0)
        paper = ref["table"].get(int(r.batch_size))
        rows.append(
            {
                **({"precision": r.precision} if several else {}),
                "attention": r.attn_implementation,
                "batch": int(r.batch_size),
                "unpruned ex/s": num(full["examples_per_s"].mean()) if not full.empty else "",
                "pruned ex/s": num(r.examples_per_s),
                SPREAD_HEADER: f"{signed(100 * (r.speedup - 1))}% "
                               f"[{signed(100 * (r.speedup_min - 1))}, {signed(100 * (r.speedup_max - 1))}]",
                "ideal": f"{signed(100 * (r.ideal_speedup - 1))}%",
                "paper ex/s": f"{paper[0]} -> {paper[1]}" if paper else "",
                "paper speedup": f"{signed(paper[2])}%" if paper else "",
            }
        )
    return frac, pd.DataFrame(rows)


# --- beyond the paper: budgeted pruning against Kwon et al.'s claims -------------------------------------


def _budgeted_within_tolerance(curve: pd.DataFrame, split: str, metric: str) -> float | None:
    """The largest level at which budgeted-tuned stays within the tolerance of unpruned (None if none does)."""
    base = budgeted_at(curve, split, BUDGETED_TUNED, 0.0)
    rows = curve[(curve["split"] == split) & (curve["method"] == BUDGETED_TUNED) & (curve["budget_removed"] > 0)]
    if base is None or rows.empty:
        return None
    ok = rows[[within_tolerance(metric, value, base) for value in rows["metric"]]]["budget_removed"]
    return float(ok.max()) if not ok.empty else None


def _budgeted_speed(inp: Inputs) -> str | None:
    """The measured speedup of the most pruned budgeted-tuned model at the largest batch."""
    bench = inp.benchmark_budgeted
    if bench is None:
        return None
    pruned = bench[bench["budget_removed"] > 0]
    if pruned.empty:
        return None
    pruned = pruned[pruned["precision"] == precisions_in(pruned)[0]]
    r = pruned.sort_values(["batch_size", "budget_removed"]).iloc[-1]
    amdahl = (f"; the Amdahl estimate from the floor's share of the time is {r.amdahl_speedup:.2f}x"
              if "amdahl_speedup" in pruned and pd.notna(r.amdahl_speedup) else "")
    return (f"{r.speedup:.2f}x throughput at {pct(r.budget_removed)} of FLOPs removed, batch {int(r.batch_size)} "
            f"({r.device}, {r.precision}; ideal {r.ideal_speedup:.2f}x, so {r.speedup / r.ideal_speedup:.2f} of "
            f"ideal{amdahl})")


def _budgeted_accuracy(inp: Inputs, split: str) -> str | None:
    curve = inp.budgeted
    if BUDGETED_TUNED not in set(curve["method"]):
        return None
    base = budgeted_at(curve, split, BUDGETED_TUNED, 0.0)
    kwon_level = KWON["flops_removed"]  # the level of Kwon et al.'s headline claim
    at = kwon_level if budgeted_at(curve, split, BUDGETED_TUNED, kwon_level) is not None else None
    parts = []
    if at is not None and base is not None:
        ours = budgeted_at(curve, split, BUDGETED_TUNED, at)
        parts.append(f"With {pct(at)} of {inp.budget_name} removed and no retraining, {BUDGETED_TUNED} scores "
                     f"{num(ours)} on "
                     f"{split} against {num(base)} unpruned ({signed(improvement(inp.metric, ours, base))} "
                     f"{inp.points}; Kwon et al. "
                     f"report {KWON['loss']} lost at {pct(KWON['flops_removed'])} on BERT-base).")
    margins = []
    for lv in sorted(set(curve["budget_removed"]) - {0.0}):
        ours, paper = budgeted_at(curve, split, BUDGETED_TUNED, lv), budgeted_at(curve, split, PAPER, lv)
        if ours is not None and paper is not None:
            margins.append((lv, improvement(inp.metric, ours, paper)))
    if margins:
        worst = min(m for _, m in margins)
        verdict = "at least as accurate as" if worst >= 0 else "not always as accurate as"
        parts.append(f"Against the paper's heads-only order at equal {inp.budget_name} it is {verdict} it at "
                     f"every level the "
                     f"paper's method reaches ({', '.join(f'{pct(lv)}: {signed(m)}' for lv, m in margins)}).")
        unreachable = [lv for lv in sorted(set(curve["budget_removed"]) - {0.0})
                       if budgeted_at(curve, split, PAPER, lv) is None]
        if unreachable:
            parts.append(f"Beyond {pct(margins[-1][0])} pruning every head is not enough: the FFNs hold the rest "
                         f"of the {inp.budget_name}.")
    return " ".join(parts) or None


def _budgeted_time(inp: Inputs) -> str | None:
    whole = inp.whole_prune_seconds
    if whole is None:
        return None
    return (f"One whole {BUDGETED_TUNED} prune (Fisher pass, search, rearrangement and tuning) took {whole:.0f} s on "
            f"this machine's CPU; Kwon et al. report under {KWON['minutes']} minutes on {KWON['hardware']}.")


def _budgeted_speed_sentence(inp: Inputs) -> str | None:
    speed = _budgeted_speed(inp)
    return f"Measured: {speed}; Kwon et al. report {KWON['latency_speedup']}x lower latency." if speed else None


def budgeted_sentences(inp: Inputs, split: str) -> list[str]:
    """This run's budgeted-tuned accuracy, pruning time and speedup, each against Kwon et al.'s claim."""
    sentences = (_budgeted_accuracy(inp, split), _budgeted_time(inp), _budgeted_speed_sentence(inp))
    return [s for s in sentences if s]


def side_by_side(inp: Inputs, split: str) -> pd.DataFrame:
    """The paper, Kwon et al.'s reported numbers and this run's budgeted-tuned model, one column each."""
    cost = inp.budget_name
    ours_level = _budgeted_within_tolerance(inp.budgeted, split, inp.metric)
    speed = _budgeted_speed(inp)
    whole = inp.whole_prune_seconds
    ref = MICHEL["speedup"]["table"][MICHEL["speedup"]["headline_batch"]]
    return pd.DataFrame({
        "": ["model and task", "what is pruned", "retraining",
             f"cost removed within {tolerance_text(inp.metric, inp.point)}", "measured speedup", "time to prune"],
        "Michel et al. (2019)": ["BERT-base, MNLI", "heads", "none",
                                 f"{MICHEL['prunable']['MNLI']} of heads (heads hold about a third of the FLOPs)",
                                 f"+{ref[2]}% examples/s, 50% of heads, batch 64, GPU", "one importance pass"],
        "Kwon et al. (2022), reported": [KWON["where"], "heads + FFN neurons", "none",
                                         f"{pct(KWON['flops_removed'])} of FLOPs ({KWON['loss']} lost)",
                                         f"{KWON['latency_speedup']}x lower latency",
                                         f"under {KWON['minutes']} minutes on {KWON['hardware']}"],
        f"this run ({BUDGETED_TUNED})": [
            str((inp.finetune or {}).get(TASK_MODEL, "")) + ", " + str((inp.finetune or {}).get(TASK_DATA, "")),
            "heads + FFN neurons", "none",
            f"{pct(ours_level)} of {cost} ({split})" if ours_level is not None else "none of the levels",
            speed or "not measured", f"{whole:.0f} s on this machine's CPU" if whole is not None else "not measured"],
    })


# The tools a decoder-only LLM is pruned with today, and what they publish (issue 16's survey of them).
ANCHORS = {
    "torch_pruning": "Torch-Pruning's LLM example prunes the same number of query heads in every KV group by weight "
                     "magnitude, never a KV head, and its readme reports Llama-3.1-8B at 50% pruned reaching "
                     "WikiText-2 perplexity 576,501 before any recovery",
    "llm_pruner": "LLM-Pruner removes whole KV groups by Taylor importance from 10 samples and saves with "
                  "torch.save, which from_pretrained cannot load",
    "minitron": "Minitron keeps every layer the same width by activation importance",
}


def _curve_at(curve: pd.DataFrame, method: str, split: str, fraction: float) -> float | None:
    rows = curve[(curve.method == method) & (curve.split == split)]
    rows = rows[np.isclose(rows.fraction_pruned.astype(float), fraction, atol=0.051)]
    return None if rows.empty else float(rows.sort_values("fraction_pruned").metric.iloc[-1])


def llm_anchor_sentences(inp: Inputs, split: str = TEST, fraction: float = 0.5) -> list[str]:
    """One sentence per anchor tool, setting this run's measured numbers beside what the tool publishes."""
    sentences = []
    curve, name = inp.curve, inp.metric_name
    if curve is not None:
        ours, magnitude = _curve_at(curve, IMPORTANCE, split, fraction), _curve_at(curve, "magnitude", split, fraction)
        if ours is not None and magnitude is not None:
            sentences.append(f"{ANCHORS['torch_pruning']}; on this model with {pct(fraction)} of query heads removed "
                             f"and no recovery, its criterion gives {split} {name} {num(magnitude)} and the paper's "
                             f"importance {num(ours)} (a small model and another corpus: the comparison is of the "
                             f"criteria on one model, not of the tools' models).")
        activation = _curve_at(curve, "activation", split, fraction)
        if ours is not None and activation is not None:
            sentences.append(f"{ANCHORS['minitron']}; its activation criterion, chosen here as importance is, gives "
                             f"{split} {name} {num(activation)} at {pct(fraction)} of query heads removed, "
                             f"against {num(ours)} for importance.")
    serving = inp.kv_groups
    bench = inp.llm_benchmark
    for fraction, saved in serving.items():
        rows = None if bench is None else bench[bench.model == kv_groups_label(float(fraction))]
        if rows is None or rows.empty:
            continue
        form = ("a stock Hugging Face folder that from_pretrained loads with no project code" if saved[STOCK]
                else f"the project's format ({saved.get(NOT_STOCK_BECAUSE, '')})")
        sentences.append(f"{ANCHORS['llm_pruner']}; here the model with {pct(float(fraction))} of every layer's KV "
                         f"groups removed is {form}, and its KV cache holds "
                         f"{num(float(rows.kv_bytes_per_token.iloc[0]), 0)} bytes per token, "
                         f"{num(float(rows.ideal_speedup_kv.iloc[0]), 2)}x fewer than unpruned.")
    return sentences
