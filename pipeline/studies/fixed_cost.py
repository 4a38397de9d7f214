"""How much of a forward pass does not shrink with FLOPs, and the bound that puts on a pruned model's speedup.

A pruned model's speedup falls short of its FLOP ratio for two reasons: the work pruning leaves alone (embeddings,
LayerNorms, residual adds, the attention mask, the classifier head, each call's fixed overhead), and kernels that
run narrower matrices less efficiently. This study separates the two. It times, in interleaved rounds, the unpruned
model, the pruned one and a floor model: the unpruned one with a single head and a single FFN neuron left in every
layer, whose time is nearly all fixed work. If the rest of the time shrank exactly with the FLOPs, the pruned model
would take

    T_floor + (T_full - T_floor) * (F_pruned - F_floor) / (F_full - F_floor)

which gives the Amdahl bound on its speedup, printed beside the measured one. Random full-length inputs, as
`pipeline.methods.bench` uses:

    python -m pipeline.studies.fixed_cost --params params.yaml --level 0.4     # the budgeted-tuned 40% model
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from torch import nn

from pipeline.core.sites import attention_sites, ffn_sites
from pipeline.core.surgery import prune_heads, prune_neurons
from pipeline.files.atomic import write_csv
from pipeline.methods.bench import measure_throughput, random_inputs
from pipeline.run.experiment import Experiment

OUT = Path("reports/studies/fixed-cost")


def floor_model(model: nn.Module) -> nn.Module:
    """A copy of `model` with only the first of its present heads in every attention site and the first of its
    present neurons in every FFN: what is left to time is the work that pruning does not shrink."""
    floor = copy.deepcopy(model)
    prune_heads(floor, {i: s.kept_heads[1:] for i, s in enumerate(attention_sites(floor))})
    prune_neurons(floor, {i: s.kept_neurons[1:] for i, s in enumerate(ffn_sites(floor))})
    return floor.eval()


def amdahl_bound(t_full: float, t_floor: float, f_full: float, f_pruned: float, f_floor: float) -> float:
    """The speedup of a model of `f_pruned` FLOPs if all but the floor's time shrank exactly with the FLOPs."""
    scalable = (t_full - t_floor) * (f_pruned - f_floor) / (f_full - f_floor)
    return t_full / (t_floor + scalable)


def fixed_cost_rows(full: nn.Module, pruned: nn.Module, batch_sizes: Sequence[int], seq_len: int,
                    rounds: int) -> list[dict]:
    """One row per batch size: the three models' median milliseconds (`measure_throughput`, the benchmark's own
    interleaved rounds), the floor's share of the full model's time, and the pruned model's measured speedup beside
    its FLOP ideal and Amdahl bound."""
    models = {"full": full, "pruned": pruned, "floor": floor_model(full)}
    table = measure_throughput(models, [random_inputs(full, b, seq_len) for b in batch_sizes], rounds)
    rows = []
    for batch_size in batch_sizes:
        measured = {r["fraction_pruned"]: r for r in table if r["batch_size"] == batch_size}
        ms = {name: 1e3 * batch_size / r["examples_per_s"] for name, r in measured.items()}
        # FLOPs as fractions of the full model's: the inverse of each one's ideal speedup.
        flops = {name: 1 / r["ideal_speedup"] for name, r in measured.items()}
        r = measured["pruned"]
        bound = amdahl_bound(ms["full"], ms["floor"], flops["full"], flops["pruned"], flops["floor"])
        rows.append(dict(
            batch_size=batch_size, seq_len=seq_len, rounds=rounds, full_ms=ms["full"], pruned_ms=ms["pruned"],
            floor_ms=ms["floor"], floor_share=ms["floor"] / ms["full"], speedup=r["speedup"],
            speedup_q1=r["speedup_q1"], speedup_q3=r["speedup_q3"], ideal_speedup=r["ideal_speedup"],
            amdahl_bound=bound, speedup_of_ideal=r["speedup"] / r["ideal_speedup"],
            bound_of_ideal=bound / r["ideal_speedup"],
        ))
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipeline.studies.fixed_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--level", type=float, default=0.4,
                        help="the saved budgeted-tuned level to time (prune.budgeted.save_levels)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", help="default: benchmark.batch_sizes")
    parser.add_argument("--rounds", type=int, default=15, help="rounds after a warm-up, each model once a round")
    args = parser.parse_args(argv)
    exp = Experiment.from_params_file(args.params)
    directory = exp.budgeted_dir(args.level)
    if not directory.is_dir():
        raise SystemExit(f"error: --level {args.level:g}: no saved budgeted-tuned model at {directory}; saved levels "
                         f"come from prune.budgeted.save_levels {exp.params.prune.budgeted.save_levels} "
                         f"(run `dvc repro prune` first)")
    b = exp.params.benchmark
    rows = fixed_cost_rows(exp.load(exp.finetuned_dir).eval(), exp.load(directory).eval(),
                           args.batch_sizes or b.batch_sizes, b.seq_len, args.rounds)
    table = pd.DataFrame(rows).assign(experiment=exp.params.experiment, level=args.level)
    path = OUT / f"{exp.params.experiment}.csv"
    write_csv(path, table)
    columns = ["batch_size", "full_ms", "floor_share", "speedup", "speedup_q1", "speedup_q3", "ideal_speedup",
               "speedup_of_ideal", "amdahl_bound", "bound_of_ideal"]
    print(table[columns].round(3).to_string(index=False))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
