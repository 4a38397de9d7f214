"""The budgeted comparison as the prune stage and the report see it: collapse flags, the per-layer view."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.core.sites import attention_sites, ffn_sites
from pipeline.core.surgery import prune_heads, prune_neurons
from pipeline.data.evaluation import ClassificationEval, EvalSet
from pipeline.files.schema import (
    BUDGETED,
    BUDGETED_BENCHMARK_TABLE,
    BUDGETED_HEADS,
    BUDGETED_TUNED,
    LAYERS_TABLE,
    PAPER,
    PERPLEXITY,
    TABLE_COLUMNS,
)
from pipeline.methods.comparison import budgeted_comparison, collapse_lines, flag_collapses, kept_per_layer
from pipeline.methods.pruning import CurveEvaluator
from pipeline.report.build import build_report
from tests.tiny_models import tiny_batch, tiny_model

LEVELS = [0.0, 0.1, 0.2, 0.3]


def curve(metrics: dict[str, list[float]], split: str = "test") -> pd.DataFrame:
    return pd.DataFrame([dict(method=m, split=split, budget_removed=lv, metric=v)
                         for m, values in metrics.items() for lv, v in zip(LEVELS, values, strict=True)])


def test_a_level_collapses_when_it_falls_more_than_the_threshold_below_the_level_before():
    flagged = flag_collapses(curve({BUDGETED: [90.0, 89.0, 78.5, 77.0]}), "accuracy", collapse=10)
    assert flagged["collapsed"].tolist() == [False, False, True, True]  # 77.0 is 13 below unpruned


def test_a_slow_slide_collapses_once_it_is_the_threshold_below_unpruned():
    flagged = flag_collapses(curve({PAPER: [90.0, 86.0, 82.0, 78.0]}), "accuracy", collapse=10)
    assert flagged["collapsed"].tolist() == [False, False, False, True]


def test_perplexity_collapses_by_its_relative_rise_and_methods_and_splits_are_flagged_apart():
    table = pd.concat([curve({BUDGETED: [20.0, 22.0, 25.0, 40.0], BUDGETED_HEADS: [20.0, 20.5, 21.0, 21.0]}),
                       curve({BUDGETED: [20.0, 21.0, 23.0, 29.0]}, split="dev")], ignore_index=True)
    flagged = flag_collapses(table, PERPLEXITY, collapse=50)  # percent of unpruned perplexity
    assert flagged[flagged.collapsed].set_index(["method", "split"]).budget_removed.to_dict() == {
        (BUDGETED, "test"): 0.3}  # 40 is 100% above 20; dev's 29 is 45% above, heads-only 5%


def test_the_warning_line_names_method_level_split_and_the_values_it_fell_from():
    flagged = flag_collapses(curve({BUDGETED: [95.8, 95.7, 94.9, 43.3]}), "accuracy", collapse=10)
    assert collapse_lines(flagged, "flops") == [
        "budgeted collapsed at 30% of the flops removed on test: 43.3, after 94.9 at 20% and 95.8 unpruned"]
    assert collapse_lines(flag_collapses(curve({BUDGETED: [95.8] * 4}), "accuracy", 10), "flops") == []


def test_kept_per_layer_counts_the_heads_and_neurons_each_site_keeps_of_its_original():
    model = tiny_model("bert", attn_implementation="eager")
    prune_heads(model, {0: [0, 1]})
    prune_neurons(model, {1: list(range(10))})
    rows = pd.DataFrame(kept_per_layer(model, BUDGETED, 0.2))
    heads, ffn = attention_sites(model), ffn_sites(model)
    assert rows[rows.unit == "heads"][["layer", "kept", "of"]].values.tolist() == [
        [0, heads[0].original_num_heads - 2, heads[0].original_num_heads],
        [1, heads[1].original_num_heads, heads[1].original_num_heads]]
    assert rows[rows.unit == "neurons"]["kept"].tolist() == [ffn[0].original_num_neurons,
                                                              ffn[1].original_num_neurons - 10]
    assert set(rows.columns) == set(TABLE_COLUMNS[LAYERS_TABLE])


def compare(**options):
    model = tiny_model("bert", attn_implementation="eager").eval()
    batches = [tiny_batch("bert", batch_size=4, length=9, seed=s) for s in range(3)]
    held_out = [tiny_batch("bert", batch_size=4, length=9, seed=s) for s in (5, 6)]
    eval_batches = [{k: v for k, v in b.items() if k != "labels"} for b in held_out]
    labels = [int(y) for b in held_out for y in b["labels"]]
    eval_set = EvalSet(eval_batches, np.arange(len(labels)), np.array(labels))
    evaluator = CurveEvaluator(model, {"test": ClassificationEval(eval_set, "accuracy")},
                               {k: v[:2] for k, v in eval_batches[0].items()})
    order = [(i, h) for i, site in enumerate(attention_sites(model)) for h in range(site.num_heads)]
    return budgeted_comparison(model, order, eval_batches[0], evaluator, batches, batches,
                               [BUDGETED_HEADS, BUDGETED, BUDGETED_TUNED], [0.1, 0.3], calibration=held_out,
                               collapse=10, **options)


@pytest.fixture(scope="module")
def comparison():
    return compare()


def test_with_a_neuron_multiple_the_saved_level_has_a_twin_as_searched_and_its_metrics_in_the_summary():
    rounded = compare(keep_models_at=[0.3], width_multiple=4)
    widths = rounded.summary["widths"]
    assert widths["multiple"] == 4 and sorted(widths["unrounded"]) == ["test@0.3"]
    kept = [site.num_neurons for site in ffn_sites(rounded.models[0.3])]
    assert all(n % 4 == 0 or n == site.original_num_neurons
               for n, site in zip(kept, ffn_sites(rounded.models[0.3]), strict=True)), kept
    assert list(rounded.unrounded) == [0.3]
    assert compare(keep_models_at=[0.3]).unrounded == {}  # a multiple of one has nothing to compare


def test_the_comparison_flags_its_rows_and_lists_what_every_pruned_model_keeps(comparison):
    assert comparison.table["collapsed"].dtype == bool
    assert list(comparison.table.columns) == TABLE_COLUMNS["budgeted_curve.csv"]
    layers = comparison.layers
    assert list(layers.columns) == TABLE_COLUMNS[LAYERS_TABLE]
    reached = comparison.table[["method", "budget_removed"]].drop_duplicates()
    assert len(layers) == len(reached) * 4  # two attention and two FFN sites per model
    unpruned = layers[layers.budget_removed == 0.0]
    assert (unpruned.kept == unpruned.of).all()
    heads_only = layers[(layers.method == BUDGETED_HEADS) & (layers.unit == "neurons")]
    assert (heads_only.kept == heads_only.of).all()


def test_the_summary_records_per_level_where_budgeted_heads_came_from_and_whether_the_tuning_was_kept(comparison):
    summary = comparison.summary
    heads_reached = comparison.table[(comparison.table.method == BUDGETED_HEADS)
                                     & (comparison.table.budget_removed > 0)].budget_removed.unique()
    assert sorted(summary["heads_from"]) == sorted(f"{level:g}" for level in heads_reached)
    names = {f"{ranking}{suffix}" for ranking in ("paper's importance", "fisher normalised", "fisher")
             for suffix in ("", ", rearranged")}
    assert set(summary["heads_from"].values()) <= names
    assert sorted(summary["tuning_kept"]) == ["0.1", "0.3"]
    assert all(isinstance(kept, bool) for kept in summary["tuning_kept"].values())


def test_the_report_marks_collapsed_rows_lists_them_in_column_order_and_draws_the_per_layer_view(
        tmp_path: Path, comparison):
    (tmp_path / "finetune.json").write_text(json.dumps({"metric": "accuracy", "dev": 60.0, "test": 60.0,
                                                        "model": "tiny", "data": "tiny"}))
    table = comparison.table.copy()
    table.loc[(table.method == BUDGETED) & (table.budget_removed == 0.3), ["metric", "collapsed"]] = [5.0, True]
    table.loc[(table.method == BUDGETED_TUNED) & (table.budget_removed == 0.3), "collapsed"] = True
    table.to_csv(tmp_path / "budgeted_curve.csv", index=False)
    comparison.layers.to_csv(tmp_path / LAYERS_TABLE, index=False)
    build_report(tmp_path, "tiny")
    md = (tmp_path / "report.md").read_text()
    assert "| 5.0 ⚠ |" in md.replace("5.00 ⚠", "5.0 ⚠")
    assert "Collapsed (⚠): `budgeted` at 30%; `budgeted-tuned` at 30%." in md  # by level, then column order
    assert "(figures/budgeted_layers.png)" in md
    assert (tmp_path / "figures" / "budgeted_layers.png").stat().st_size > 1000


def test_the_budgeted_speed_table_lists_fp32_first_as_table_4_does(tmp_path: Path, comparison):
    (tmp_path / "finetune.json").write_text(json.dumps({"metric": "accuracy", "dev": 60.0, "test": 60.0,
                                                        "model": "tiny", "data": "tiny"}))
    comparison.table.to_csv(tmp_path / "budgeted_curve.csv", index=False)
    row = dict(attn_implementation="sdpa", batch_size=1, widths="as searched", examples_per_s=10.0, speedup=1.5,
               speedup_q1=1.4, speedup_q3=1.6, speedup_min=1.3, speedup_max=1.7, ideal_speedup=1.65,
               floor_share=0.14, amdahl_speedup=1.54, params=1e6, device="cpu")
    rows = [dict(row, budget_removed=level, precision=precision)
            for precision in ("bf16", "fp32") for level in (0.0, 0.4)]
    pd.DataFrame(rows, columns=TABLE_COLUMNS[BUDGETED_BENCHMARK_TABLE]).to_csv(
        tmp_path / BUDGETED_BENCHMARK_TABLE, index=False)
    build_report(tmp_path, "tiny")
    md = (tmp_path / "report.md").read_text()
    section = md.split(f"## Speed of the saved `{BUDGETED_TUNED}` models", 1)[1].split("\n#", 1)[0]
    assert [line.split(" | ")[0] for line in section.splitlines() if line.startswith(("| fp32", "| bf16"))] == [
        "| fp32", "| bf16"]
