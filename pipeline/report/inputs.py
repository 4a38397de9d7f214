"""The report's inputs: the tables and summaries the stages wrote to reports/<experiment>/, read and checked.

Every input file is optional; a section whose file is missing (or empty) is skipped. Metrics are in
percent (0-100) or BLEU points, so "1 point" is 1.0 everywhere.

Inputs in report_dir (columns; `pipeline.files.schema.TABLE_COLUMNS` names the required ones):
    finetune.json       {"dev", "test", ...}: the metric of the fine-tuned model (DVC metrics: numbers only)
    about.json          {"metric", "model", "data", optional "data_attribution", ...}: what the experiment is; an
                        older report folder has these in finetune.json, which is read alike
    prune.json          optional per split the prunable fraction, the metric there and unpruned (schema's
                        METRICS_KEYS)
    budgeted.json       optional: how the budgeted comparison ran (its cost, FFN widths; schema's BUDGETED_FILE)
    prune_seconds.csv   part, level, seconds   (where the prune stage's time went)
    kv_groups.csv       fraction_removed, layer, kv_heads, stock, not_stock_because   (serving-shape models)
    rank_correlation.csv  step, spearman   (Figure 6: each checkpoint's importance against the final model's)
    importance.csv      kind, layer, head, importance            (per-layer normalised)
    ablation.csv        kind, layer, head, metric, delta, p_value [, examples]
                        (one head masked; delta = masked - full)
    one_head.csv        kind, layer, best_head, metric, delta    (only one head kept in a layer)
    pruning_curve.csv   method, split, fraction_pruned, metric [, heads_pruned, metric_std,
                        fraction_flops_removed, examples]
    recovery.csv        fraction_pruned, metric_before, metric_after [, model, metric_unpruned, method, steps,
                        seconds: language models, the unpruned model fine-tuned alike as the row at 0]
    benchmark.csv       fraction_pruned, batch_size, attn_implementation, examples_per_s, speedup,
                        ideal_speedup, device, precision [, params, tokens_per_s, weights_mb, activations_mb,
                        peak_memory_mb, floor_share, amdahl_speedup]
                        (speedup = throughput ratio pruned / unpruned at the same precision, batch and
                        attention, 1.0 = no change)
    budgeted_curve.csv  method, split, budget_removed, fraction_flops_removed, heads_pruned,
                        neurons_pruned, metric, examples, seconds [, collapsed]   (the paper's order and
                        Kwon-style budgets; collapsed: the level fell more than prune.budgeted.collapse)
    budgeted_layers.csv method, budget_removed, unit, kind, layer, kept, of   (what each pruned model keeps)
    benchmark_budgeted.csv  attn_implementation, batch_size, budget_removed, widths, examples_per_s, speedup,
                        ideal_speedup, floor_share, amdahl_speedup, params, device, precision
                        (amdahl_speedup: the row's speedup if a floor model's share of the time, timed in
                        the same rounds, stayed and the rest shrank with the FLOPs: an estimate, not a bound)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.files.artifacts import read_table, reading
from pipeline.files.schema import (
    ABLATION_TABLE,
    ABOUT_FILE,
    BENCHMARK_TABLE,
    BLEU,
    BUDGET,
    BUDGETED_BENCHMARK_TABLE,
    BUDGETED_FILE,
    BUDGETED_TABLE,
    CURVE_TABLE,
    EVAL_SPLITS,
    FINETUNE_SUMMARY,
    GENERATIONS_TABLE,
    GGUF_TABLE,
    IMPORTANCE_TABLE,
    KINDS,
    KV_GROUPS_TABLE,
    LAYERS_TABLE,
    LLM_BENCHMARK_TABLE,
    LOWER_IS_BETTER,
    NOT_STOCK_BECAUSE,
    ONE_GROUP_TABLE,
    ONE_HEAD_TABLE,
    OTHER_UNIT_CURVE_TABLE,
    PRUNE_SECONDS_TABLE,
    PRUNE_SUMMARY,
    RANK_CORRELATION_TABLE,
    RECOVERY_TABLE,
    STOCK,
    TASK_DATA,
    TASK_METRIC,
    TASK_MODEL,
    WHOLE_PRUNE,
    WIDTH_TABLE,
    ZERO_SHOT_TABLE,
    checkpoint_method,
    kind_method,
)

ENCODER, DECODER, CROSS = KINDS
DEV, TEST = EVAL_SPLITS  # the headline numbers are on test, as the paper's are
KIND_METHODS = {kind_method(kind): kind for kind in KINDS}  # Figure 5's curves: one attention kind pruned alone


def checkpoint_of(method: str) -> int | None:
    """The training step of a checkpoint curve's method (Figure 6), or None for any other method."""
    digits = method[len(method.rstrip("0123456789")):]
    # Inverting schema's own name keeps one definition of the format.
    return int(digits) if digits and method == checkpoint_method(int(digits)) else None


def kinds_in(df: pd.DataFrame) -> list[str]:
    """The attention kinds present in a table: the schema's order first, then any other."""
    present = list(dict.fromkeys(df["kind"]))
    return [k for k in KINDS if k in present] + [k for k in present if k not in KINDS]


def splits_in(df: pd.DataFrame) -> list[str]:
    """The splits present in a table: dev, test, then any other alphabetically."""
    present = list(dict.fromkeys(df["split"]))
    return [s for s in EVAL_SPLITS if s in present] + sorted(s for s in present if s not in EVAL_SPLITS)


def rows_at(df: pd.DataFrame, column: str, value: float) -> pd.DataFrame:
    """Rows whose float column equals value (fractions come from CSV, so compare with a tolerance)."""
    return df[np.isclose(df[column].astype(float), value, atol=1e-6)]


def precisions_in(bench: pd.DataFrame) -> list[str]:
    """The benchmark's precisions, fp32 first (the precision a single-precision run measures)."""
    present = list(dict.fromkeys(bench["precision"]))
    return sorted(present, key=lambda p: (p != "fp32", present.index(p)))


def sorted_by_precision(rows: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """`rows` sorted by the columns `by`, the precision in `precisions_in` order (fp32 first), so that every table
    of a report lists its precisions alike."""
    order = precisions_in(rows)
    return rows.sort_values(by, key=lambda column: column.map(order.index) if column.name == "precision" else column)


def measured_on(bench: pd.DataFrame) -> str:
    """Where and at what precision a benchmark table was measured: "cpu, fp32" or "NVIDIA H200, fp32 and bf16"."""
    devices = list(dict.fromkeys(bench["device"].astype(str)))
    return f"{' and '.join(devices)}, {' and '.join(precisions_in(bench))}"


def unpruned(part: pd.DataFrame) -> float | None:
    """Unpruned metric for one split: the fraction-0 rows (all methods agree there; take the mean)."""
    rows = rows_at(part, "fraction_pruned", 0.0)
    return float(rows["metric"].mean()) if not rows.empty else None


def budgeted_at(curve: pd.DataFrame, split: str, method: str, level: float) -> float | None:
    """A budgeted-curve method's metric with `level` of the cost removed (None: the level is out of its reach)."""
    rows = rows_at(curve[(curve["split"] == split) & (curve["method"] == method)], "budget_removed", level)
    return float(rows["metric"].iloc[0]) if not rows.empty else None


def collapsed_at(curve: pd.DataFrame, split: str) -> set[tuple[str, float]]:
    """The (method, level) rows of `split` that the prune stage flagged as collapsed (none in older tables)."""
    if "collapsed" not in curve:
        return set()
    rows = curve[(curve["split"] == split) & curve["collapsed"].fillna(False).astype(bool)]
    return {(r.method, float(r.budget_removed)) for r in rows.itertuples()}


def _read_csv(report_dir: Path, name: str) -> pd.DataFrame | None:
    """A table, or None when its stage wrote none (its section is left out). A damaged one raises
    `DamagedArtifact`: a silently skipped section would hide it."""
    path = report_dir / name
    if not path.is_file():
        return None
    df = read_table(path)
    return None if df.empty else df


@dataclass
class Inputs:
    finetune: dict | None = None
    importance: pd.DataFrame | None = None
    ablation: pd.DataFrame | None = None
    one_head: pd.DataFrame | None = None
    one_group: pd.DataFrame | None = None
    curve: pd.DataFrame | None = None
    recovery: pd.DataFrame | None = None
    benchmark: pd.DataFrame | None = None
    prune: dict | None = None
    budgeted: pd.DataFrame | None = None
    budgeted_layers: pd.DataFrame | None = None
    benchmark_budgeted: pd.DataFrame | None = None
    llm_benchmark: pd.DataFrame | None = None
    other_unit_curve: pd.DataFrame | None = None
    zero_shot: pd.DataFrame | None = None
    generations: pd.DataFrame | None = None
    budgeted_run: dict | None = None
    prune_seconds: pd.DataFrame | None = None
    kv_group_shapes: pd.DataFrame | None = None
    rank_correlations: pd.DataFrame | None = None
    width: pd.DataFrame | None = None
    gguf: pd.DataFrame | None = None
    report_dir: Path | None = None  # where a family's report section finds a table of its own (`table`)

    @classmethod
    def load(cls, report_dir: Path) -> Inputs:
        def read_json(name: str) -> dict | None:
            path = report_dir / name
            if not path.is_file():
                return None
            with reading(path, json.JSONDecodeError, UnicodeDecodeError):
                return json.loads(path.read_text())

        finetune, about = read_json(FINETUNE_SUMMARY), read_json(ABOUT_FILE)
        return cls(
            finetune=None if finetune is None and about is None else {**(about or {}), **(finetune or {})},
            prune=read_json(PRUNE_SUMMARY),
            budgeted_run=read_json(BUDGETED_FILE),
            prune_seconds=_read_csv(report_dir, PRUNE_SECONDS_TABLE),
            kv_group_shapes=_read_csv(report_dir, KV_GROUPS_TABLE),
            rank_correlations=_read_csv(report_dir, RANK_CORRELATION_TABLE),
            importance=_read_csv(report_dir, IMPORTANCE_TABLE),
            ablation=_read_csv(report_dir, ABLATION_TABLE),
            one_head=_read_csv(report_dir, ONE_HEAD_TABLE),
            one_group=_read_csv(report_dir, ONE_GROUP_TABLE),
            curve=_read_csv(report_dir, CURVE_TABLE),
            recovery=_read_csv(report_dir, RECOVERY_TABLE),
            benchmark=_read_csv(report_dir, BENCHMARK_TABLE),
            budgeted=_read_csv(report_dir, BUDGETED_TABLE),
            budgeted_layers=_read_csv(report_dir, LAYERS_TABLE),
            benchmark_budgeted=_read_csv(report_dir, BUDGETED_BENCHMARK_TABLE),
            llm_benchmark=_read_csv(report_dir, LLM_BENCHMARK_TABLE),
            other_unit_curve=_read_csv(report_dir, OTHER_UNIT_CURVE_TABLE),
            zero_shot=_read_csv(report_dir, ZERO_SHOT_TABLE),
            generations=_read_csv(report_dir, GENERATIONS_TABLE),
            width=_read_csv(report_dir, WIDTH_TABLE),
            gguf=_read_csv(report_dir, GGUF_TABLE),
            report_dir=report_dir,
        )

    def table(self, name: str) -> pd.DataFrame | None:
        """A table that one family's stages write and its report section reads (a name kept in that family's
        package), as the tables above are read: None when absent or empty."""
        return None if self.report_dir is None else _read_csv(self.report_dir, name)

    @property
    def metric(self) -> str:
        """finetune.json's metric, the key of its direction and tolerance (files/schema.py); "" when unknown."""
        return str((self.finetune or {}).get(TASK_METRIC, "")).lower()

    @property
    def is_bleu(self) -> bool:
        return self.metric == BLEU

    @property
    def metric_name(self) -> str:
        return "BLEU" if self.is_bleu else str((self.finetune or {}).get(TASK_METRIC, "metric"))

    @property
    def metric_label(self) -> str:
        """Axis label with unit."""
        if self.metric in LOWER_IS_BETTER:
            return f"{self.metric_name} (lower is better)"
        return "BLEU" if self.is_bleu else f"{self.metric_name} (%)"

    @property
    def points(self) -> str:
        if self.metric in LOWER_IS_BETTER:
            return self.metric_name  # "-3.1 perplexity": perplexity has no points
        return "BLEU points" if self.is_bleu else "points"

    @property
    def point(self) -> str:
        if self.metric in LOWER_IS_BETTER:
            return self.metric_name
        return "BLEU point" if self.is_bleu else "point"

    def delta_label(self, unit: bool = True) -> str:
        """What the tables' delta is (files/schema.py, `improvement`): the change in the metric (with its unit, or
        not), or for a lower-is-better metric its fall, so that a positive delta is better either way."""
        if self.metric in LOWER_IS_BETTER:
            return f"fall in {self.metric_name} (positive: better)"
        return f"change in {self.metric_label if unit else self.metric_name}"

    @property
    def is_mt(self) -> bool:
        """Encoder-decoder experiment: decides which of the paper's numbers we compare against."""
        present: set[str] = set()
        for df in (self.importance, self.ablation, self.one_head):
            if df is not None:
                present |= set(df["kind"])
        methods = set(self.curve["method"]) if self.curve is not None else set()
        # Decoder self-attention alone is a decoder-only language model, not an encoder-decoder.
        return (self.is_bleu or CROSS in present or {ENCODER, DECODER} <= present
                or bool(methods & KIND_METHODS.keys()))

    @property
    def title(self) -> str:
        """The report's title: the model and the data that finetune.json names."""
        finetune = self.finetune or {}
        if TASK_MODEL in finetune and TASK_DATA in finetune:
            return f"Head pruning: {finetune[TASK_MODEL]} on {finetune[TASK_DATA]}"
        return "Are Sixteen Heads Really Better than One? - reproduction"

    @property
    def task(self) -> str | None:
        """Which of the paper's tasks this run corresponds to, from finetune.json's "data"."""
        data = str((self.finetune or {}).get(TASK_DATA, "")).lower()
        if "mnli" in data:
            return "MNLI"
        if "sst" in data:
            return "SST-2"
        if "wmt" in data or self.is_mt:
            return "WMT"
        return None

    @property
    def budget_name(self) -> str:
        """The cost the budgeted methods cut, as the report says it: "FLOPs" or "latency"."""
        return "latency" if self.budgeted_summary.get(BUDGET) == "latency" else "FLOPs"

    @property
    def budgeted_summary(self) -> dict:
        """budgeted.json: how the budgeted comparison ran ({} when there is none)."""
        return self.budgeted_run or {}

    @property
    def whole_prune_seconds(self) -> float | None:
        """Seconds of one whole budgeted-tuned prune, Fisher pass to tuned model (None: not measured)."""
        if self.prune_seconds is None:
            return None
        whole = self.prune_seconds[self.prune_seconds["part"] == WHOLE_PRUNE]
        return float(whole["seconds"].iloc[0]) if not whole.empty else None

    @property
    def rank_correlation(self) -> dict[str, float]:
        """Figure 6: {checkpoint step: Spearman rank correlation of its importance with the final model's}."""
        table = self.rank_correlations
        return {} if table is None else {str(int(r.step)): float(r.spearman) for r in table.itertuples()}

    @property
    def kv_groups(self) -> dict[str, dict]:
        """The serving-shape models by fraction of KV groups removed ("0.5"): {STOCK: bool, NOT_STOCK_BECAUSE: why}."""
        table = self.kv_group_shapes
        found: dict[str, dict] = {}
        for fraction, rows in ([] if table is None else table.groupby("fraction_removed", sort=False)):
            why = rows[NOT_STOCK_BECAUSE].dropna().astype(str)
            found[f"{float(fraction):g}"] = {STOCK: bool(rows[STOCK].astype(bool).all()),
                                              NOT_STOCK_BECAUSE: why.iloc[0] if not why.empty else ""}
        return found
