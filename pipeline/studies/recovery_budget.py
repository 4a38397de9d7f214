"""Recovery against its token budget, and the teacher's top-k logits standing in for the whole distribution, on one
saved model of the language-modelling pipeline (run after `make repro-llm`, which leaves the models and data in
artifacts/): what the recover stage's one budget cannot show.

For each budget (a multiple of recover.tokens) the model is recovered by each of the recover stage's methods
(recover.method and its baselines) from scratch, its own warm-up and decay to zero, on the stage's windows (a larger
budget reads on where a smaller one stopped); then by the distilling method once more at the stage's budget with the
teacher's top-k logits cached (recover.teacher_top_k). Test perplexity on the stage's windows, over the unpruned
model's. The trend of each method: a straight line through log(ratio - 1) against log(tokens), solved for the tokens
at `--target` (1.15x).

    python -m pipeline.studies.recovery_budget                    # the width model, 1, 2 and 4 x the budget
    python -m pipeline.studies.recovery_budget --model "33% of KV groups" --budgets 1 8 --top-k 16 64
"""

from __future__ import annotations

import argparse
import math
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


def tokens_for(table: pd.DataFrame, method: str, target: float) -> float | None:
    """The tokens at which the trend of `method`'s full-distribution rows reaches `target` x the unpruned perplexity:
    a least-squares line through log(ratio - 1) against log(tokens); None where it does not fall with tokens."""
    rows = table[(table["method"] == method) & table["top_k"].isna() & (table["ratio"] > 1)]
    if len(rows) < 2:
        return None
    slope, intercept = np.polyfit(np.log(rows["tokens"]), np.log(rows["ratio"] - 1), 1)
    if slope > -1e-6:  # flat (to rounding) or rising: no budget reaches the target
        return None
    return math.exp((math.log(target - 1) - intercept) / slope)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="llm/params.yaml")
    parser.add_argument("--model", default=None, help="a saved model's label (default: the last saved, the width one)")
    parser.add_argument("--budgets", nargs="+", type=float, default=[1, 2, 4],
                        help="multiples of recover.tokens")
    parser.add_argument("--top-k", nargs="*", type=int, default=[64], help="teacher logits kept, at the stage's budget")
    parser.add_argument("--target", type=float, default=1.15, help="x the unpruned model's perplexity")
    parser.add_argument("--csv", default=None, help="default: reports/studies/recovery-budget/<experiment>.csv")
    args = parser.parse_args(argv)
    exp = Experiment.from_cli(["--params", args.params])
    r, task, window = exp.params.recover, exp.task, exp.params.data.max_length
    models = task.saved_models()
    label = args.model or list(models)[-1]
    if label not in models or label == UNPRUNED_MODEL:
        parser.error(f"--model {label!r}: not a saved pruned model; saved: {', '.join(list(models)[1:])}")
    if not r.method.startswith("kd-") and args.top_k:
        parser.error(f"--top-k needs a distilling recover.method (kd-lora, kd-full), not {r.method}")
    test = task.evaluation("test", r.max_examples)
    dense = exp.load(models[UNPRUNED_MODEL])
    unpruned = test(dense)[0]
    runs = ([(method, budget, None) for budget in sorted(args.budgets) for method in r.methods]
            + [(r.method, 1.0, k) for k in args.top_k])
    longest = max(r.steps(window) * budget for _, budget, _ in runs)
    windows = recovery_sequences(exp, math.ceil(longest) * r.batch_size)
    rows = []
    for method, budget, top_k in runs:
        steps = max(1, round(r.steps(window) * budget))
        model = exp.load(models[label])
        config = recovery_config(exp, method, steps)
        start = time.perf_counter()
        recover_language_model(model, windows[: steps * r.batch_size], task.pad_token_id, config,
                               runtime=exp.runtime, teacher=Teacher(dense, top_k) if config.distils else None)
        seconds = time.perf_counter() - start
        after = test(model)[0]
        rows.append(dict(model=label, method=method, top_k=top_k, steps=steps, tokens=steps * r.batch_size * window,
                         perplexity=after, ratio=after / unpruned, seconds=round(seconds, 1)))
        print(f"{label}: {method}{f' (teacher top-{top_k})' if top_k else ''}, {rows[-1]['tokens']:,} tokens: "
              f"perplexity {after:.2f} = {after / unpruned:.3f}x unpruned ({seconds:.0f} s)", flush=True)
    table = pd.DataFrame(rows)
    out = write_csv(args.csv or f"reports/studies/recovery-budget/{exp.params.experiment}.csv", table)
    print(f"unpruned perplexity {unpruned:.2f}; table: {out}")
    for method in r.methods:
        needed = tokens_for(table, method, args.target)
        print(f"{method}: the trend reaches {args.target}x at "
              + (f"{needed:,.0f} tokens" if needed else "no budget (it does not fall with tokens)"))


if __name__ == "__main__":
    main()
