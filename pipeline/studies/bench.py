"""The encoder benchmark on random weights: throughput of unpruned vs evenly head-pruned encoders at the shapes of
BERT-base and MiniLM-L6, beside the ideal speedup from FLOPs, then what importance scoring costs.

    python -m pipeline.studies.bench                      # BERT-base and MiniLM-L6 shapes, sdpa and eager
    python -m pipeline.studies.bench --shapes minilm-l6 --batch-sizes 1 16 --repeats 7 --csv bench.csv

The models of one shape and batch size take turns for `--repeats` rounds after a warm-up, each called back to back
for `--turn-seconds` a turn (pipeline/methods/bench.py; the timer is pipeline/core/timer.py). A speedup is the median
of the rounds' ratios to the unpruned model's time in the same round, with its range in brackets.
The scoring-cost line compares one importance pass (forward + backward to the gates) over a data set with a forward
pass over the same data.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence

import torch

from pipeline.core.importance import head_importance
from pipeline.core.timer import interleaved_times, speedup_ratio
from pipeline.methods.bench import SHAPES, random_encoder, random_inputs, throughput_table


def scoring_cost(shape: str, batch_size: int, batches: int, seq_len: int, repeats: int) -> dict:
    """Seconds for importance scoring vs a forward pass over the same `batches` batches."""
    model = random_encoder(shape, "sdpa")
    data = []
    for i in range(batches):
        inputs = random_inputs(model, batch_size, seq_len, seed=i)
        inputs["labels"] = torch.randint(0, 2, (batch_size,), generator=torch.Generator().manual_seed(i))
        data.append(inputs)

    def forward_pass() -> None:
        with torch.inference_mode():
            for batch in data:
                model(**batch)

    seconds = interleaved_times({"forward": forward_pass,
                                 "scoring": lambda: head_importance(model, data, progress=False)}, repeats)
    return dict(shape=shape, examples=batch_size * batches, forward_s=statistics.median(seconds["forward"]),
                scoring_s=statistics.median(seconds["scoring"]),
                ratio=speedup_ratio(seconds["scoring"], seconds["forward"]).median)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["bert-base", "minilm-l6"], choices=list(SHAPES))
    parser.add_argument("--fractions", nargs="+", type=float, default=[0.0, 0.25, 0.5, 0.75])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 4, 16, 64])
    parser.add_argument("--attn", nargs="+", default=["sdpa", "eager"], choices=["sdpa", "eager"])
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=7, help="rounds, after a warm-up")
    parser.add_argument("--turn-seconds", type=float, default=0.2,
                        help="each model's calls in a turn last at least this long (0: one call a turn)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--csv", default=None, help="also write the throughput table here")
    args = parser.parse_args(argv)
    fractions = sorted(set(args.fractions) | {0.0})
    if not all(0.0 <= f < 1.0 for f in fractions):
        parser.error(f"--fractions must lie in [0, 1), got {args.fractions}")
    if args.repeats < 1 or args.turn_seconds < 0:
        parser.error(f"--repeats must be at least 1 and --turn-seconds at least 0, got {args.repeats} and "
                     f"{args.turn_seconds}")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, seq_len {args.seq_len}, "
          f"median of {args.repeats} interleaved rounds of {args.turn_seconds:g}-s turns [range]", flush=True)

    table = throughput_table(args.shapes, fractions, args.batch_sizes, args.attn, args.seq_len, args.repeats,
                             turn_seconds=args.turn_seconds)
    if args.csv:
        table.to_csv(args.csv, index=False)
    pivot = table.pivot_table(index=["shape", "attn_implementation", "batch_size"], columns="fraction_pruned",
                              values=["examples_per_s", "speedup", "speedup_min", "speedup_max", "ideal_speedup"])
    print("\n" + pivot.round(3).to_string())

    cost = scoring_cost(args.shapes[-1], batch_size=16, batches=4, seq_len=args.seq_len, repeats=args.repeats)
    print(f"\nscoring cost ({cost['shape']}, {cost['examples']} examples): forward {cost['forward_s']:.2f} s, "
          f"importance {cost['scoring_s']:.2f} s, ratio {cost['ratio']:.2f}x")


if __name__ == "__main__":
    main()
