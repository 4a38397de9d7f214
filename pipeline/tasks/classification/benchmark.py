"""The benchmark stage for classification, the paper's Table 4: examples/s of the unpruned and physically pruned
models at each batch size, beside the ideal FLOP speedup, parameters and peak memory; the budgeted-tuned models
(heads and FFN neurons pruned, prune.budgeted.save_levels) measured the same way in a table of their own. Both time a
floor model (one head and one FFN neuron a layer) in the same rounds: the work no pruning removes, whose share gives
each model its Amdahl estimate (the speedup if the rest shrank exactly with the FLOPs; an estimate, not a bound:
pipeline/methods/bench.py)."""

from __future__ import annotations

import pandas as pd
import torch

from pipeline.core.runtime import Runtime
from pipeline.files.schema import (
    BENCHMARK_TABLE,
    BUDGETED_BENCHMARK_TABLE,
    FULL_WIDTHS,
    ROUNDED_WIDTHS,
    SEARCHED_WIDTHS,
    TABLE_COLUMNS,
)
from pipeline.methods.bench import floor_model, forward_memory_mb, measure_throughput
from pipeline.methods.speedups import headline_speedups, log_speedups
from pipeline.run.experiment import Experiment, log


def classification_inputs(exp: Experiment) -> dict:
    """Real test sentences padded to a fixed length, as the paper's code padded MNLI to 128 tokens."""
    b = exp.params.benchmark
    test, tokenizer = exp.splits()["test"], exp.tokenizer()
    examples = test.select(range(min(max(b.batch_sizes), len(test))))
    return tokenizer.pad({"input_ids": examples["input_ids"]}, padding="max_length", max_length=b.seq_len,
                         return_tensors="pt")


def throughput(exp: Experiment, models: dict, runtime: Runtime, floor: torch.nn.Module | None = None) -> list[dict]:
    b = exp.params.benchmark
    encoded = classification_inputs(exp)
    batches = [{k: v[:batch_size, : b.seq_len] for k, v in encoded.items()} for batch_size in b.batch_sizes]
    return measure_throughput(models, batches, b.repeats, runtime, b.turn_seconds, floor)


def classification(exp: Experiment, models: dict, runtime: Runtime, floor: torch.nn.Module) -> pd.DataFrame:
    b = exp.params.benchmark
    encoded = classification_inputs(exp)
    rows = throughput(exp, models, runtime, floor)
    largest = max(b.batch_sizes)
    inputs = {k: v[:largest, : b.seq_len] for k, v in encoded.items()}
    memory = [dict(fraction_pruned=f, batch_size=largest, **forward_memory_mb(model, inputs, runtime))
              for f, model in models.items()]
    # Memory at the largest batch: weights plus the peak of live activations, and their sum.
    table = pd.DataFrame(rows).merge(pd.DataFrame(memory), how="left", on=["fraction_pruned", "batch_size"])
    table["peak_memory_mb"] = table.weights_mb + table.activations_mb
    return table


def budgeted_models(exp: Experiment, levels: list[float]) -> dict[tuple[float, str], object]:
    """The unpruned model and the saved budgeted-tuned models, keyed by (level removed, widths): a level whose
    widths were rounded to the measured multiple (prune.budgeted.width_multiple) also has its twin as searched."""
    models = {(0.0, FULL_WIDTHS): exp.load(exp.finetuned_dir)}
    for level in levels:
        twin = exp.budgeted_dir(level, unrounded=True)
        models[level, ROUNDED_WIDTHS if twin.is_dir() else SEARCHED_WIDTHS] = exp.load(exp.budgeted_dir(level))
        if twin.is_dir():
            models[level, SEARCHED_WIDTHS] = exp.load(twin)
    return models


def benchmark(exp: Experiment, each: list[Runtime]) -> tuple[dict[str, pd.DataFrame], dict]:
    """(benchmark.csv and benchmark_budgeted.csv, benchmark.json) at each runtime of `each`."""
    b = exp.params.benchmark
    tables = []
    for impl in b.attn_implementations:
        models = exp.task.pruned_models(impl)
        # Timed beside Table 4's models: the work no pruning removes, and so each one's Amdahl estimate.
        floor = floor_model(models[0.0])
        tables += [classification(exp, models, runtime, floor) for runtime in each]
    table = pd.concat(tables, ignore_index=True)
    # A level the budget could not reach (the prune stage logs it) has no model to measure.
    levels = [lv for lv in exp.params.prune.budgeted.save_levels if exp.budgeted_dir(lv).is_dir()]
    rows = []
    for impl in b.attn_implementations if levels else []:
        models = budgeted_models(exp, levels)
        for model in models.values():
            model.set_attn_implementation(impl)
        # Timed beside them: the work no pruning removes, and so each model's Amdahl estimate (amdahl_speedup).
        floor = floor_model(models[0.0, FULL_WIDTHS])
        for runtime in each:
            rows += throughput(exp, models, runtime, floor)
    for row in rows:  # the models' keys: (level removed, widths)
        row["budget_removed"], row["widths"] = row.pop("fraction_pruned")
    budgeted = pd.DataFrame(rows, columns=None if rows else TABLE_COLUMNS[BUDGETED_BENCHMARK_TABLE])
    for r in budgeted[budgeted.batch_size == max(b.batch_sizes)].itertuples():
        log.info("benchmark: budgeted-tuned, %.0f%% of the cost removed (%s widths), batch %d, %s, %s %s: "
                 "speedup %.3f [range %.3f, %.3f] (ideal %.3f, Amdahl %.3f)", 100 * r.budget_removed, r.widths,
                 r.batch_size, r.attn_implementation, r.device, r.precision, r.speedup, r.speedup_min,
                 r.speedup_max, r.ideal_speedup, r.amdahl_speedup)
    largest = max(b.batch_sizes)
    log_speedups(table, largest)
    return ({BENCHMARK_TABLE: table, BUDGETED_BENCHMARK_TABLE: budgeted},
            headline_speedups(table, budgeted, largest, b.attn_implementations[0], exp.runtime.precision))
