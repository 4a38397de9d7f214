"""The decoder-only benchmark on a small random Llama (grouped-query attention), unpruned vs without a share of
its key/value groups: prefill and decode tokens/s, KV-cache bytes per token and peak memory, beside the ideal
speedups from FLOPs and from KV bytes (pipeline/methods/llm_bench.py says how each phase is timed).

    python -m pipeline.studies.llm_bench                  # a small random Llama, unpruned vs half its KV groups
    python -m pipeline.studies.llm_bench --batch-sizes 1 8 32 --new-tokens 32 --repeats 5 --csv llm_bench.csv
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch
import transformers
from torch import nn

from pipeline.files.schema import UNPRUNED_MODEL, kv_groups_label
from pipeline.methods.llm_bench import (
    BATCH_SIZE,
    IDEAL_SPEEDUP_FLOPS,
    IDEAL_SPEEDUP_KV,
    KV_BYTES_PER_TOKEN,
    MODEL,
    PEAK_MEMORY_MB,
    PHASE,
    SPEEDUP,
    TOKENS_PER_S,
    llm_benchmark,
    without_kv_groups,
)

# A small Llama for the command line: grouped-query attention (8 query heads on 2 key/value heads), random weights.
SMALL_LLAMA = dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=2,
                   intermediate_size=688, vocab_size=2000, max_position_embeddings=512)


def random_llama(seed: int = 0, **overrides) -> nn.Module:
    config = transformers.LlamaConfig(**(SMALL_LLAMA | overrides))
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa").eval()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fraction", type=float, default=0.5, help="of the key/value groups removed")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=7, help="rounds, after a warm-up")
    parser.add_argument("--turn-seconds", type=float, default=0.2,
                        help="each model's calls in a turn last at least this long (0: one call a turn)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--csv", default=None, help="also write the table here")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.turn_seconds < 0:
        parser.error(f"--repeats must be at least 1 and --turn-seconds at least 0, got {args.repeats} and "
                     f"{args.turn_seconds}")
    if args.threads:
        torch.set_num_threads(args.threads)
    models = {UNPRUNED_MODEL: random_llama(),
              kv_groups_label(args.fraction): without_kv_groups(random_llama(), args.fraction)}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, prompt {args.prompt_tokens} tokens, "
          f"{args.new_tokens} new, median of {args.repeats} interleaved rounds", flush=True)
    table = llm_benchmark(models, args.batch_sizes, args.prompt_tokens, args.new_tokens, args.repeats,
                          turn_seconds=args.turn_seconds)
    if args.csv:
        table.to_csv(args.csv, index=False)
    table["of_ideal_flops"] = table[SPEEDUP] / table[IDEAL_SPEEDUP_FLOPS]
    table["of_ideal_kv"] = table[SPEEDUP] / table[IDEAL_SPEEDUP_KV]
    shown = [MODEL, PHASE, BATCH_SIZE, TOKENS_PER_S, SPEEDUP, f"{SPEEDUP}_min", f"{SPEEDUP}_max", IDEAL_SPEEDUP_FLOPS,
             "of_ideal_flops", IDEAL_SPEEDUP_KV, "of_ideal_kv", KV_BYTES_PER_TOKEN, PEAK_MEMORY_MB]
    print(table.sort_values([PHASE, BATCH_SIZE], kind="stable")[shown].round(3).to_string(index=False))


if __name__ == "__main__":
    main()
