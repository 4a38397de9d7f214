"""Stage recover: fine-tune the physically pruned models briefly and measure what comes back (language models: a
few more steps of their training objective, perplexity on test)."""

from __future__ import annotations

from pipeline.run.preflight import preflight

if __name__ == "__main__":  # the params in a second or two, before the imports below load torch
    preflight("recover")

import pandas as pd

from pipeline.files.atomic import write_csv
from pipeline.files.schema import RECOVERY_TABLE
from pipeline.lm.training import LanguageModelTrainConfig, train_language_model
from pipeline.run.experiment import Experiment, log
from pipeline.tasks.evaluation import evaluate
from pipeline.training.classification import TrainConfig, finetune


def language_modeling(exp: Experiment) -> list[dict]:
    p, r = exp.params, exp.params.recover
    train, test = exp.split("train")["input_ids"][:], exp.lm_eval("test")
    config = LanguageModelTrainConfig(steps=r.steps, batch_size=r.batch_size, learning_rate=r.learning_rate,
                                      warmup_steps=r.warmup_steps, weight_decay=r.weight_decay, seed=p.seed)
    rows = []
    for fraction in p.prune.save_fractions:
        model = exp.load(exp.pruned_dir(fraction))
        before = test(model)[0]
        train_language_model(model, train, exp.pad_token_id, config, runtime=exp.runtime)
        rows.append(dict(fraction_pruned=fraction, metric_before=before, metric_after=test(model)[0]))
        log.info("recover: %.0f%% pruned, test perplexity %.2f -> %.2f after %d steps", 100 * fraction, before,
                 rows[-1]["metric_after"], r.steps)
    return rows


def main() -> None:
    exp = Experiment.from_cli()
    if exp.is_language_modeling:
        write_csv(exp.reports / RECOVERY_TABLE, pd.DataFrame(language_modeling(exp)))
        return
    p, metric = exp.params, exp.metric
    r = p.recover
    train, tokenizer = exp.splits()["train"], exp.tokenizer()
    test = exp.eval_sets(("test",))["test"]
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
    write_csv(exp.reports / RECOVERY_TABLE, pd.DataFrame(rows))


if __name__ == "__main__":
    main()
