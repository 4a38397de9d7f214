"""Stage benchmark: the paper's Table 4 on this experiment's physically pruned models: examples/s
at each batch size beside the ideal FLOP speedup, parameters and peak memory.

Translation: decoding speed (sentences/s and tokens/s) of the unpruned and pruned models.
"""

from __future__ import annotations

import pandas as pd

from pipeline.atomic import write_csv
from pipeline.bench import forward_memory_mb, measure_generation, measure_throughput
from pipeline.experiment import Experiment, log


def classification(exp: Experiment, models: dict) -> pd.DataFrame:
    b = exp.params.benchmark
    test, tokenizer = exp.splits()["test"], exp.tokenizer()
    # Real test sentences padded to a fixed length, as the paper's code padded MNLI to 128 tokens.
    examples = test.select(range(min(max(b.batch_sizes), len(test))))
    encoded = tokenizer.pad({"input_ids": examples["input_ids"]}, padding="max_length", max_length=b.seq_len,
                            return_tensors="pt")
    rows, memory = [], []
    largest = max(b.batch_sizes)
    for batch_size in b.batch_sizes:
        inputs = {k: v[:batch_size, : b.seq_len] for k, v in encoded.items()}
        rows += measure_throughput(models, inputs, b.repeats)
    inputs = {k: v[:largest, : b.seq_len] for k, v in encoded.items()}
    memory = [dict(fraction_pruned=f, batch_size=largest, **forward_memory_mb(model, inputs))
              for f, model in models.items()]
    # Memory at the largest batch: weights plus the peak of live activations, and their sum.
    table = pd.DataFrame(rows).merge(pd.DataFrame(memory), how="left", on=["fraction_pruned", "batch_size"])
    table["peak_memory_mb"] = table.weights_mb + table.activations_mb
    return table


def translation(exp: Experiment, models: dict) -> pd.DataFrame:
    b = exp.params.benchmark
    rows = []
    for batch_size in b.batch_sizes:
        rows += measure_generation(models, exp.generation_inputs(batch_size), b.new_tokens, b.repeats)
    return pd.DataFrame(rows)


def main() -> None:
    exp = Experiment.from_cli()
    b = exp.params.benchmark
    dirs = {0.0: exp.finetuned_dir, **{f: exp.pruned_dir(f) for f in exp.params.prune.save_fractions}}
    tables = []
    for impl in b.attn_implementations:
        models = {f: exp.load(d) for f, d in dirs.items()}
        for model in models.values():
            model.set_attn_implementation(impl)
        tables.append((translation if exp.is_translation else classification)(exp, models))
    table = pd.concat(tables, ignore_index=True)
    write_csv(exp.reports / "benchmark.csv", table)
    largest = max(b.batch_sizes)
    for r in table[table.batch_size == largest].itertuples():
        log.info("benchmark: %.0f%% pruned, batch %d, %s: %.1f examples/s, speedup %.3f (ideal %.3f)",
                 100 * r.fraction_pruned, r.batch_size, r.attn_implementation, r.examples_per_s, r.speedup,
                 r.ideal_speedup)


if __name__ == "__main__":
    main()
