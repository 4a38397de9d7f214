"""Stage benchmark: the paper's Table 4 on this experiment's physically pruned models: examples/s
at each batch size beside the ideal FLOP speedup, parameters and peak memory."""

from __future__ import annotations

import pandas as pd

from pipeline.atomic import write_csv
from pipeline.bench import measure_throughput, peak_memory_mb
from pipeline.experiment import Experiment, log


def main() -> None:
    exp = Experiment.from_params_file()
    b = exp.params.benchmark
    dirs = {0.0: exp.finetuned_dir, **{f: exp.pruned_dir(f) for f in exp.params.prune.save_fractions}}
    test = exp.splits()["test"]
    tokenizer = exp.tokenizer()
    # Real test sentences padded to a fixed length, as the paper's code padded MNLI to 128 tokens.
    examples = test.select(range(min(max(b.batch_sizes), len(test))))
    encoded = tokenizer.pad({"input_ids": examples["input_ids"]}, padding="max_length", max_length=b.seq_len,
                            return_tensors="pt")
    rows = []
    for impl in b.attn_implementations:
        models = {f: exp.load(d) for f, d in dirs.items()}
        for model in models.values():
            model.set_attn_implementation(impl)
        for batch_size in b.batch_sizes:
            inputs = {k: v[:batch_size, : b.seq_len] for k, v in encoded.items()}
            rows += measure_throughput(models, inputs, b.repeats)
    table = pd.DataFrame(rows)
    largest = max(b.batch_sizes)
    memory = {f: peak_memory_mb(d, largest, b.seq_len) for f, d in dirs.items()}
    table["peak_memory_mb"] = table.fraction_pruned.map(memory)
    write_csv(exp.reports / "benchmark.csv", table)
    for r in table[table.batch_size == largest].itertuples():
        log.info("benchmark: %.0f%% pruned, batch %d, %s: %.1f ex/s, speedup %.3f (ideal %.3f)",
                 100 * r.fraction_pruned, r.batch_size, r.attn_implementation, r.examples_per_s, r.speedup,
                 r.ideal_speedup)


if __name__ == "__main__":
    main()
