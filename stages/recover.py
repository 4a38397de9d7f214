"""Stage recover: fine-tune the physically pruned models briefly and measure what comes back (language models: LoRA
or full fine-tuning on their training objective, perplexity on test, the recovered models saved)."""

from __future__ import annotations

from pipeline.run.preflight import preflight

if __name__ == "__main__":  # the params in a second or two, before the imports below load torch
    preflight("recover")

import time

import pandas as pd

from pipeline.core.sites import attention_sites
from pipeline.files.atomic import write_csv
from pipeline.files.schema import RECOVERY_TABLE, UNPRUNED_MODEL
from pipeline.lm.training import RecoveryConfig, recover_language_model
from pipeline.run.experiment import Experiment, log
from pipeline.tasks.evaluation import evaluate
from pipeline.training.classification import TrainConfig, finetune


def language_modeling(exp: Experiment) -> list[dict]:
    """Every saved pruned model recovered (recover.method: LoRA merged back, or full fine-tuning) and saved under
    recovered/ by its folder's name, for the zero-shot stage; test perplexity before and after, beside the
    unpruned model's on the same windows. The first row is the control: the unpruned model fine-tuned the same way
    (not saved), for a pretrained model also adapts to the recovery data, and that gain is not the pruned
    model's recovery."""
    p, r = exp.params, exp.params.recover
    train, test = exp.split("train")["input_ids"][:], exp.lm_eval("test", r.max_examples)
    config = RecoveryConfig(steps=r.steps, method=r.method, batch_size=r.batch_size, learning_rate=r.learning_rate,
                            warmup_steps=r.warmup_steps, weight_decay=r.weight_decay, rank=r.rank, alpha=r.alpha,
                            dropout=r.dropout, seed=p.seed)
    models = exp.saved_models()
    unpruned = test(exp.load(models[UNPRUNED_MODEL]))[0]
    rows = []
    for label, path in models.items():
        model = exp.load(path)
        sites = attention_sites(model)
        before = test(model)[0] if label != UNPRUNED_MODEL else unpruned
        start = time.perf_counter()
        recover_language_model(model, train, exp.pad_token_id, config, runtime=exp.runtime)
        seconds = time.perf_counter() - start
        if label != UNPRUNED_MODEL:
            exp.save(model, exp.recovered_root / path.name)
        rows.append(dict(model=label, fraction_pruned=1 - sum(s.num_heads for s in sites) / sum(
                             s.original_num_heads for s in sites),
                         metric_unpruned=unpruned, metric_before=before, metric_after=test(model)[0],
                         method=r.method, steps=r.steps, seconds=round(seconds, 1)))
        log.info("recover: %s, test perplexity %.2f -> %.2f after %d %s steps (unpruned %.2f; %.0f s)", label,
                 before, rows[-1]["metric_after"], r.steps, r.method, unpruned, seconds)
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
