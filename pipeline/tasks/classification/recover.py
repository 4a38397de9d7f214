"""The recover stage for classification: each saved pruned model fine-tuned briefly on train (recover.steps), the
metric on test before and after."""

from __future__ import annotations

import pandas as pd

from pipeline.data.evaluation import evaluate
from pipeline.run.experiment import Experiment, log
from pipeline.tasks.classification.training import TrainConfig, finetune


def recover(exp: Experiment) -> pd.DataFrame:
    p, metric = exp.params, exp.metric
    r = p.recover
    train, tokenizer = exp.splits()["train"], exp.tokenizer()
    test = exp.task.eval_sets(("test",))["test"]
    config = TrainConfig(batch_size=r.batch_size, learning_rate=r.learning_rate, warmup_ratio=r.warmup_ratio,
                         weight_decay=r.weight_decay, steps=r.steps, seed=p.seed)
    rows = []
    for fraction in p.prune.save_fractions:
        model = exp.load(exp.pruned_dir(fraction))
        with exp.runtime.autocast():
            before = evaluate(model, test, metric)[0]
        finetune(model, train, tokenizer, config, runtime=exp.runtime)
        with exp.runtime.autocast():
            after = evaluate(model, test, metric)[0]
        rows.append(dict(fraction_pruned=fraction, metric_before=before, metric_after=after))
        log.info("recover: %.0f%% pruned, test %.2f -> %.2f after %d steps", 100 * fraction, before, after, r.steps)
    return pd.DataFrame(rows)
