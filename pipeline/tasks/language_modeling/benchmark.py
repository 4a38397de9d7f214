"""The benchmark stage for language modelling (llm_benchmark.csv): prefill and cached-decode tokens/s at each batch
size, KV-cache bytes per token measured from the cache, and peak memory, beside the ideals from FLOPs and from KV
bytes (pipeline/methods/llm_bench.py), for the pruned models of prune.save_fractions and of the serving shape
(prune.kv_group_fractions: whole key/value groups removed, every layer alike), which is what shrinks the cache."""

from __future__ import annotations

import pandas as pd

from pipeline.core.runtime import Runtime
from pipeline.files.schema import BATCH_SIZE, FRACTION_PRUNED, IDEAL_SPEEDUP, LLM_BENCHMARK_TABLE, SPEEDUP
from pipeline.methods.llm_bench import DECODE, llm_benchmark
from pipeline.run.experiment import Experiment, log


def language_model(exp: Experiment, runtime: Runtime) -> pd.DataFrame:
    b = exp.params.benchmark
    models = {label: exp.load(path) for label, path in exp.task.saved_models().items()}
    return llm_benchmark(models, b.batch_sizes, b.prompt_tokens, b.new_tokens, b.repeats, runtime, b.turn_seconds)


def benchmark(exp: Experiment, each: list[Runtime]) -> tuple[dict[str, pd.DataFrame], dict]:
    """(llm_benchmark.csv, benchmark.json) at each runtime of `each`. benchmark.json: the most pruned saved model's
    cached-decode speedup at the largest batch and the runtime's precision, beside its FLOP ideal (its KV-bytes ideal,
    the prefill and every other model are in llm_benchmark.csv)."""
    table = pd.concat([language_model(exp, runtime) for runtime in each], ignore_index=True)
    largest = max(exp.params.benchmark.batch_sizes)
    summary: dict = {}
    headline = exp.task.headline_model()
    if headline is not None:  # the most pruned model's cached decoding at the runtime's precision
        label, fraction = headline
        rows = table[(table.batch_size == largest) & (table.phase == DECODE) & (table.model == label)
                     & (table.precision == exp.runtime.precision)]
        if not rows.empty:
            r = rows.iloc[0]
            summary = {FRACTION_PRUNED: round(float(fraction), 4), BATCH_SIZE: largest,
                       SPEEDUP: round(float(r.speedup), 4), IDEAL_SPEEDUP: round(float(r.ideal_speedup_flops), 4)}
    for r in table[table.batch_size == largest].itertuples():
        if r.phase == DECODE:
            log.info("benchmark: %s, decode at batch %d, %s %s: %.0f tokens/s, speedup %.3f (ideal %.3f from FLOPs, "
                     "%.3f from KV bytes), %.0f KV bytes/token", r.model, largest, r.device, r.precision,
                     r.tokens_per_s, r.speedup, r.ideal_speedup_flops, r.ideal_speedup_kv, r.kv_bytes_per_token)
    return {LLM_BENCHMARK_TABLE: table}, summary


