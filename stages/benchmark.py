"""Stage benchmark: the paper's Table 4 on this experiment's physically pruned models: examples/s
at each batch size beside the ideal FLOP speedup, parameters and peak memory. The budgeted-tuned models
(heads and FFN neurons pruned, prune.budgeted.save_levels) are measured the same way against the
unpruned model, in a table of their own. Both tables time a floor model (one head and one FFN neuron a layer) in
the same rounds: the work no pruning removes, whose share gives each model its Amdahl estimate (the speedup if the
rest shrank exactly with the FLOPs; an estimate, not a bound: pipeline/methods/bench.py).

Translation: decoding speed (sentences/s and tokens/s) of the unpruned and pruned models.

Language modelling (llm_benchmark.csv): prefill and cached-decode tokens/s at each batch size, KV-cache bytes per
token measured from the cache, and peak memory, beside the ideals from FLOPs and from KV bytes
(pipeline/methods/llm_bench.py), for the pruned models of prune.save_fractions and of the serving shape
(prune.kv_group_fractions: whole key/value groups removed, every layer alike), which is what shrinks the cache.

Models run on the runtime's device (`runtime.device`). Every model is timed at each precision of
`benchmark.precisions` (and at `runtime.precision`, if not among them), under autocast; each row names its device
and precision, and a speedup compares models at the same precision, batch size and attention implementation.
On a GPU the timer synchronises the device around each repeat and peak memory is CUDA's allocator peak.
"""

from __future__ import annotations

from pipeline.run.preflight import preflight

if __name__ == "__main__":  # the params in a second or two, before the imports below load torch
    preflight("benchmark")

import pandas as pd
import torch

from pipeline.core.runtime import Runtime, RuntimeUnavailable, resolve_runtime
from pipeline.core.timer import SPEEDUP_SPREAD
from pipeline.files.atomic import write_csv, write_json
from pipeline.files.schema import (
    BENCHMARK_SUMMARY,
    BENCHMARK_TABLE,
    BUDGETED_BENCHMARK_TABLE,
    FULL_WIDTHS,
    LLM_BENCHMARK_TABLE,
    ROUNDED_WIDTHS,
    SEARCHED_WIDTHS,
    TABLE_COLUMNS,
    UNPRUNED_MODEL,
)
from pipeline.methods.bench import floor_model, forward_memory_mb, measure_generation, measure_throughput
from pipeline.methods.llm_bench import DECODE, llm_benchmark
from pipeline.run.experiment import Experiment, log


def classification_inputs(exp: Experiment) -> dict:
    """Real test sentences padded to a fixed length, as the paper's code padded MNLI to 128 tokens."""
    b = exp.params.benchmark
    test, tokenizer = exp.splits()["test"], exp.tokenizer()
    examples = test.select(range(min(max(b.batch_sizes), len(test))))
    return tokenizer.pad({"input_ids": examples["input_ids"]}, padding="max_length", max_length=b.seq_len,
                         return_tensors="pt")


def runtimes(exp: Experiment) -> list[Runtime]:
    """The runtime's device at each precision the benchmark times: `benchmark.precisions`, then
    `runtime.precision` if it is not among them (one line, naming the key, when this machine cannot run one)."""
    device = exp.runtime.device
    precisions = list(dict.fromkeys([*exp.params.benchmark.precisions, exp.runtime.precision]))
    try:
        return [resolve_runtime(str(device), p) for p in precisions]
    except RuntimeUnavailable as error:
        raise SystemExit(f"error: benchmark.precisions: {error}") from None


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


def translation(exp: Experiment, models: dict, runtime: Runtime) -> pd.DataFrame:
    b = exp.params.benchmark
    batches = [exp.generation_inputs(batch_size) for batch_size in b.batch_sizes]
    return pd.DataFrame(measure_generation(models, batches, b.new_tokens, b.repeats, runtime=runtime,
                                           turn_seconds=b.turn_seconds))


def language_model(exp: Experiment, runtime: Runtime) -> pd.DataFrame:
    b = exp.params.benchmark
    models = {label: exp.load(path) for label, path in exp.saved_models().items()}
    return llm_benchmark(models, b.batch_sizes, b.prompt_tokens, b.new_tokens, b.repeats, runtime, b.turn_seconds)


def language_model_stage(exp: Experiment) -> None:
    table = pd.concat([language_model(exp, runtime) for runtime in runtimes(exp)], ignore_index=True)
    write_csv(exp.reports / LLM_BENCHMARK_TABLE, table)
    largest = max(exp.params.benchmark.batch_sizes)
    summary: dict = {}
    for r in table[table.batch_size == largest].itertuples():
        if r.model != UNPRUNED_MODEL:
            summary.setdefault(f"{r.phase}@batch{largest}-{r.precision}", {})[r.model] = {
                "speedup": round(float(r.speedup), 4), "ideal_speedup_flops": round(float(r.ideal_speedup_flops), 4),
                "ideal_speedup_kv": round(float(r.ideal_speedup_kv), 4),
                "kv_bytes_per_token": round(float(r.kv_bytes_per_token), 1)}
        if r.phase == DECODE:
            log.info("benchmark: %s, decode at batch %d, %s %s: %.0f tokens/s, speedup %.3f (ideal %.3f from FLOPs, "
                     "%.3f from KV bytes), %.0f KV bytes/token", r.model, largest, r.device, r.precision,
                     r.tokens_per_s, r.speedup, r.ideal_speedup_flops, r.ideal_speedup_kv, r.kv_bytes_per_token)
    write_json(exp.reports / BENCHMARK_SUMMARY, summary)


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


def headline_speedups(table: pd.DataFrame, budgeted: pd.DataFrame, batch_size: int) -> dict:
    """Table 4's numbers at the largest batch, for `dvc metrics`: each model's median speedup, its interquartile
    range and range, and its ideal (FLOPs). A budgeted level with rounded widths names its twin as searched
    "-unrounded"."""
    summary: dict = {}
    twins = set(budgeted.loc[budgeted.widths == ROUNDED_WIDTHS, "budget_removed"])
    for name, frame, column in (("pruned", table, "fraction_pruned"), ("budgeted", budgeted, "budget_removed")):
        for r in frame[(frame.batch_size == batch_size) & (frame[column] > 0)].itertuples():
            # fp32 keeps the key it had before precisions were timed; another precision names itself.
            impl = r.attn_implementation if r.precision == "fp32" else f"{r.attn_implementation}-{r.precision}"
            level = getattr(r, column)
            twin = name == "budgeted" and r.widths == SEARCHED_WIDTHS and level in twins
            model = f"{name}@{level:g}" + ("-unrounded" if twin else "")
            summary.setdefault(f"{impl}@batch{batch_size}", {})[model] = {
                **{key: round(float(getattr(r, key)), 4) for key in SPEEDUP_SPREAD},
                "ideal_speedup": round(float(r.ideal_speedup), 4)}
    return summary


def main() -> None:
    exp = Experiment.from_cli()
    if exp.is_language_modeling:
        return language_model_stage(exp)
    b = exp.params.benchmark
    each = runtimes(exp)
    dirs = {0.0: exp.finetuned_dir, **{f: exp.pruned_dir(f) for f in exp.params.prune.save_fractions}}
    tables = []
    for impl in b.attn_implementations:
        models = {f: exp.load(d) for f, d in dirs.items()}
        for model in models.values():
            model.set_attn_implementation(impl)
        if exp.is_translation:
            tables += [translation(exp, models, runtime) for runtime in each]
            continue
        # Timed beside Table 4's models: the work no pruning removes, and so each one's Amdahl estimate.
        floor = floor_model(models[0.0])
        tables += [classification(exp, models, runtime, floor) for runtime in each]
    table = pd.concat(tables, ignore_index=True)
    write_csv(exp.reports / BENCHMARK_TABLE, table)
    # A level the budget could not reach (the prune stage logs it) has no model to measure.
    levels = [lv for lv in exp.params.prune.budgeted.save_levels if exp.budgeted_dir(lv).is_dir()]
    budgeted = pd.DataFrame(columns=TABLE_COLUMNS[BUDGETED_BENCHMARK_TABLE])
    if levels and not exp.is_translation:
        rows = []
        for impl in b.attn_implementations:
            models = budgeted_models(exp, levels)
            for model in models.values():
                model.set_attn_implementation(impl)
            # Timed beside them: the work no pruning removes, and so each model's Amdahl estimate (amdahl_speedup).
            floor = floor_model(models[0.0, FULL_WIDTHS])
            for runtime in each:
                rows += throughput(exp, models, runtime, floor)
        for row in rows:  # the models' keys: (level removed, widths)
            row["budget_removed"], row["widths"] = row.pop("fraction_pruned")
        budgeted = pd.DataFrame(rows)
        for r in budgeted[budgeted.batch_size == max(b.batch_sizes)].itertuples():
            log.info("benchmark: budgeted-tuned, %.0f%% of the cost removed (%s widths), batch %d, %s, %s %s: "
                     "speedup %.3f [range %.3f, %.3f] (ideal %.3f, Amdahl %.3f)", 100 * r.budget_removed, r.widths,
                     r.batch_size, r.attn_implementation, r.device, r.precision, r.speedup, r.speedup_min,
                     r.speedup_max, r.ideal_speedup, r.amdahl_speedup)
    write_csv(exp.reports / BUDGETED_BENCHMARK_TABLE, budgeted)
    largest = max(b.batch_sizes)
    write_json(exp.reports / BENCHMARK_SUMMARY, headline_speedups(table, budgeted, largest))
    for r in table[table.batch_size == largest].itertuples():
        log.info("benchmark: %.0f%% pruned, batch %d, %s, %s %s: %.1f examples/s, speedup %.3f (ideal %.3f)",
                 100 * r.fraction_pruned, r.batch_size, r.attn_implementation, r.device, r.precision,
                 r.examples_per_s, r.speedup, r.ideal_speedup)


if __name__ == "__main__":
    main()
