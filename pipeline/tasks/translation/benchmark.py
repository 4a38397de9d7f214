"""The benchmark stage for translation: decoding speed (sentences/s and tokens/s) of the unpruned and pruned models
at each batch size, on the longest test sources."""

from __future__ import annotations

import pandas as pd
import torch

from pipeline.core.runtime import Runtime
from pipeline.files.schema import BENCHMARK_TABLE, BUDGETED_BENCHMARK_TABLE, TABLE_COLUMNS
from pipeline.methods.bench import measure_generation
from pipeline.methods.speedups import headline_speedups, log_speedups
from pipeline.run.experiment import Experiment
from pipeline.tasks.translation.marian import collate_pairs


def generation_inputs(exp: Experiment, batch_size: int) -> dict[str, torch.Tensor]:
    """`batch_size` of the longest test sources, padded: the benchmark's decoding input. Longest first, so every
    batch size decodes real, comparable sources."""
    test = exp.split("test")
    if exp.task.is_fairseq:
        ids = sorted(test["input_ids"][:], key=len, reverse=True)[:batch_size]
        batch = collate_pairs(ids, ids, exp.task.pad_token_id)
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    sources = sorted(test["source"][:], key=len, reverse=True)[:batch_size]
    return dict(exp.tokenizer()(sources, padding=True, return_tensors="pt"))


def translation(exp: Experiment, models: dict, runtime: Runtime) -> pd.DataFrame:
    b = exp.params.benchmark
    batches = [generation_inputs(exp, batch_size) for batch_size in b.batch_sizes]
    return pd.DataFrame(measure_generation(models, batches, b.new_tokens, b.repeats, runtime=runtime,
                                           turn_seconds=b.turn_seconds))


def benchmark(exp: Experiment, each: list[Runtime]) -> tuple[dict[str, pd.DataFrame], dict]:
    """(benchmark.csv, an empty benchmark_budgeted.csv, benchmark.json) at each runtime of `each`."""
    b = exp.params.benchmark
    tables = []
    for impl in b.attn_implementations:
        models = exp.task.pruned_models(impl)
        tables += [translation(exp, models, runtime) for runtime in each]
    table = pd.concat(tables, ignore_index=True)
    budgeted = pd.DataFrame(columns=TABLE_COLUMNS[BUDGETED_BENCHMARK_TABLE])
    largest = max(b.batch_sizes)
    log_speedups(table, largest)
    return ({BENCHMARK_TABLE: table, BUDGETED_BENCHMARK_TABLE: budgeted},
            headline_speedups(table, budgeted, largest, b.attn_implementations[0], exp.runtime.precision))
