"""The recover stage's learning rate and next-token weight, chosen on dev: each saved pruned model of the
language-modelling pipeline (run after `make repro-llm`, which leaves the models and data in artifacts/) recovered by
each of the recover stage's methods at the stage's budget, over a grid of peak learning rates and, for a distilling
method (kd-lora, kd-full), of next-token weights beside the KL. Dev perplexity on recover.max_examples windows, so
that the test split the stage reports stays unseen by the choice.

    python -m pipeline.studies.recovery_settings
    python -m pipeline.studies.recovery_settings --learning-rates 1e-3 2e-3 --next-token-weights 0 1
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence

import numpy as np
import pandas as pd

from pipeline.files.atomic import write_csv
from pipeline.files.schema import UNPRUNED_MODEL
from pipeline.run.experiment import Experiment
from pipeline.tasks.language_modeling.distillation import Teacher
from pipeline.tasks.language_modeling.recover import recovery_config, recovery_sequences
from pipeline.tasks.language_modeling.training import recover_language_model


def best_settings(table: pd.DataFrame) -> pd.DataFrame:
    """Per method, the settings with the lowest dev perplexity summed in log over the models (each model counts the
    same, however far pruning moved it)."""
    table = table.assign(log_ratio=np.log(table["perplexity"] / table["before"]))
    totals = table.groupby(["method", "learning_rate", "next_token_weight"], as_index=False)["log_ratio"].sum()
    return totals.loc[totals.groupby("method")["log_ratio"].idxmin()].reset_index(drop=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="llm/params.yaml")
    parser.add_argument("--learning-rates", nargs="+", type=float, default=[5e-4, 2e-3, 5e-3, 1e-2])
    parser.add_argument("--next-token-weights", nargs="+", type=float, default=[0.0, 1.0],
                        help="beside the KL, for a distilling method only")
    parser.add_argument("--csv", default=None, help="default: reports/studies/recovery-settings/<experiment>.csv")
    args = parser.parse_args(argv)
    exp = Experiment.from_cli(["--params", args.params])
    r, task, window = exp.params.recover, exp.task, exp.params.data.max_length
    steps = r.steps(window)
    models = task.saved_models()
    windows = recovery_sequences(exp, steps * r.batch_size)
    dev = task.evaluation("dev", r.max_examples)
    dense = exp.load(models[UNPRUNED_MODEL])
    teacher = Teacher(dense, r.teacher_top_k) if any(m.startswith("kd-") for m in r.methods) else None
    rows = []
    for label in list(models)[1:]:
        before = dev(exp.load(models[label]))[0]
        for method in r.methods:
            distils = method.startswith("kd-")
            for learning_rate in args.learning_rates:
                for weight in args.next_token_weights if distils else [0.0]:
                    model = exp.load(models[label])
                    config = dataclasses.replace(recovery_config(exp, method, steps), learning_rate=learning_rate,
                                                 next_token_weight=weight)
                    start = time.perf_counter()
                    recover_language_model(model, windows, task.pad_token_id, config, runtime=exp.runtime,
                                           teacher=teacher if distils else None)
                    seconds = time.perf_counter() - start
                    after = dev(model)[0]
                    rows.append(dict(model=label, method=method, learning_rate=learning_rate,
                                     next_token_weight=weight, steps=steps, tokens=steps * r.batch_size * window,
                                     before=before, perplexity=after, seconds=round(seconds, 1)))
                    print(f"{label}: {method}, learning rate {learning_rate:g}"
                          f"{f', next-token weight {weight:g}' if distils else ''}: dev perplexity {before:.2f} -> "
                          f"{after:.2f} ({seconds:.0f} s)", flush=True)
    table = pd.DataFrame(rows)
    out = write_csv(args.csv or f"reports/studies/recovery-settings/{exp.params.experiment}.csv", table)
    print(f"table: {out}")
    for best in best_settings(table).itertuples():
        print(f"{best.method}: best on dev at learning rate {best.learning_rate:g}"
              + (f", next-token weight {best.next_token_weight:g}" if best.method.startswith("kd-") else ""))


if __name__ == "__main__":
    main()
