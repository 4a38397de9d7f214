"""The recover stage for language modelling: every saved pruned model recovered (recover.method: LoRA merged back,
or full fine-tuning) and saved under recovered/ by its folder's name, for the zero-shot stage; test perplexity before
and after, beside the unpruned model's on the same windows. The first row is the control: the unpruned model
fine-tuned the same way (not saved), for a pretrained model also adapts to the recovery data, and that gain is not the
pruned model's recovery.

Under `accelerate launch` (docs/distributed.md) every process trains its share of each batch and evaluates the whole
test set itself; only the first saves the models (and the stage writes the table from it alone)."""

from __future__ import annotations

import time

import pandas as pd

from pipeline.core.flops import non_embedding_parameters
from pipeline.core.runtime import is_main_process
from pipeline.core.sites import attention_sites
from pipeline.files.schema import UNPRUNED_MODEL, WHOLE
from pipeline.run.experiment import Experiment, log
from pipeline.tasks.language_modeling.training import RecoveryConfig, recover_language_model


def recover(exp: Experiment) -> pd.DataFrame:
    p, r, task = exp.params, exp.params.recover, exp.task
    if exp.runtime.placement != WHOLE:  # accelerate's dispatched or offloaded layers evaluate, but do not train
        raise SystemExit(f"error: runtime.placement: {exp.runtime.placement} does not train; recover a model across "
                         "GPUs with "
                         "placement: whole under accelerate launch and configs/accelerate/fsdp.yaml "
                         "(docs/distributed.md)")
    train, test = exp.split("train")["input_ids"][:], task.evaluation("test", r.max_examples)
    config = RecoveryConfig(steps=r.steps, method=r.method, batch_size=r.batch_size, learning_rate=r.learning_rate,
                            warmup_steps=r.warmup_steps, weight_decay=r.weight_decay, rank=r.rank, alpha=r.alpha,
                            dropout=r.dropout, seed=p.seed)
    models = task.saved_models()
    dense = exp.load(models[UNPRUNED_MODEL])
    unpruned, dense_params = test(dense)[0], non_embedding_parameters(dense)
    rows = []
    for label, path in models.items():
        model = exp.load(path)
        sites = attention_sites(model)
        before = test(model)[0] if label != UNPRUNED_MODEL else unpruned
        start = time.perf_counter()
        recover_language_model(model, train, task.pad_token_id, config, runtime=exp.runtime)
        seconds = time.perf_counter() - start
        if label != UNPRUNED_MODEL and is_main_process():  # under accelerate launch every process holds the same
            exp.save(model, exp.recovered_root / path.name)
        rows.append(dict(model=label, fraction_pruned=1 - sum(s.num_heads for s in sites) / sum(
                             s.original_num_heads for s in sites),
                         params_removed=1 - non_embedding_parameters(model) / dense_params,
                         metric_unpruned=unpruned, metric_before=before, metric_after=test(model)[0],
                         method=r.method, steps=r.steps, seconds=round(seconds, 1)))
        log.info("recover: %s, test perplexity %.2f -> %.2f after %d %s steps (unpruned %.2f; %.0f s)", label,
                 before, rows[-1]["metric_after"], r.steps, r.method, unpruned, seconds)
    return pd.DataFrame(rows)
