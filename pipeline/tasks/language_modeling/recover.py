"""The recover stage for language modelling: every saved pruned model recovered by each of recover.methods (`method`,
then its `baselines`, on the same batches at the same token budget: LoRA merged back or full fine-tuning, on the next
token or distilled from the unpruned model) and saved under recovered/<method>/ by its folder's name, for the zero-shot
stage; test perplexity before and after, beside the unpruned model's on the same windows. The first rows are the
control: the unpruned model recovered the same way (not saved), for a pretrained model also adapts to the recovery
data, and that gain is not the pruned model's recovery.

The training windows (`recovery_data`) are cut once and shared by every model and method. Under `accelerate launch`
(docs/distributed.md) every process trains its share of each batch and evaluates the whole test set itself; only the
first saves the models (and the stage writes the table from it alone)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.core.flops import non_embedding_parameters
from pipeline.core.runtime import is_main_process
from pipeline.core.sites import attention_sites
from pipeline.data.sources import tatoeba_file
from pipeline.files.schema import UNPRUNED_MODEL, WHOLE
from pipeline.run.experiment import WHEEL_CACHE, Experiment, log
from pipeline.tasks.language_modeling.data import wikitext_files
from pipeline.tasks.language_modeling.distillation import Teacher
from pipeline.tasks.language_modeling.recovery_data import (
    GENERAL,
    detokenized_wikitext,
    recovery_windows,
    sampled_texts,
    tatoeba_sentences,
)
from pipeline.tasks.language_modeling.training import RecoveryConfig, recover_language_model


def recovery_sequences(exp: Experiment, count: int) -> list[list[int]]:
    """`count` windows of data.max_length tokens of recover.corpus, seeded: general English (WikiText-2 train as
    prose and Tatoeba's English sentences, half each), or the experiment's train split."""
    r, tokenizer, seed = exp.params.recover, exp.tokenizer(), exp.params.seed
    if r.corpus == GENERAL:
        corpora = [detokenized_wikitext(wikitext_files(WHEEL_CACHE)["train"]),
                   tatoeba_sentences(tatoeba_file(WHEEL_CACHE))]
        # Twice the characters the windows need at 4 characters a token (English runs 4 to 5 in a BPE vocabulary):
        # a short draw would only be read again.
        characters = 8 * exp.params.data.max_length * -(-count // len(corpora))
        sources = [tokenizer(sampled_texts(texts, characters, seed), add_special_tokens=False)["input_ids"]
                   for texts in corpora]
    else:
        sequences = exp.split("train")["input_ids"][:]
        sources = [[sequences[i] for i in np.random.default_rng(seed).permutation(len(sequences))]]
    # Texts are joined by a blank line, as documents are; a tokenizer with no token for it joins them by </s>.
    separator = tokenizer("\n\n", add_special_tokens=False)["input_ids"] or [tokenizer.eos_token_id]
    return recovery_windows(sources, exp.params.data.max_length, count, separator)


def recovered_path(exp: Experiment, method: str, folder: str) -> Path:
    """Where the saved model in `folder` goes once recovered by `method`."""
    return exp.recovered_root / method / folder


def recovery_config(exp: Experiment, method: str, steps: int) -> RecoveryConfig:
    """The training settings of recovering by `method` for `steps` steps, from the recover params."""
    r = exp.params.recover
    return RecoveryConfig(steps=steps, method=method, batch_size=r.batch_size, learning_rate=r.learning_rate,
                          warmup_steps=r.warmup_steps, weight_decay=r.weight_decay, rank=r.rank, alpha=r.alpha,
                          dropout=r.dropout, temperature=r.temperature, next_token_weight=r.next_token_weight,
                          seed=exp.params.seed)


def recover(exp: Experiment) -> pd.DataFrame:
    p, r, task = exp.params, exp.params.recover, exp.task
    if exp.runtime.placement != WHOLE:  # accelerate's dispatched or offloaded layers evaluate, but do not train
        raise SystemExit(f"error: runtime.placement: {exp.runtime.placement} does not train; recover a model across "
                         "GPUs with "
                         "placement: whole under accelerate launch and configs/accelerate/fsdp.yaml "
                         "(docs/distributed.md)")
    window = p.data.max_length
    steps = r.steps(window)
    train, test = recovery_sequences(exp, steps * r.batch_size), task.evaluation("test", r.max_examples)
    tokens = steps * r.batch_size * window
    models = task.saved_models()
    dense = exp.load(models[UNPRUNED_MODEL])
    unpruned, dense_params = test(dense)[0], non_embedding_parameters(dense)
    # The unpruned model, frozen, as every kd- method's teacher: the same object for every student, so its top-k cache
    # (recover.teacher_top_k) serves them all.
    teacher = Teacher(dense, r.teacher_top_k) if any(m.startswith("kd-") for m in r.methods) else None
    rows = []
    for label, path in models.items():
        before = test(exp.load(path))[0] if label != UNPRUNED_MODEL else unpruned
        for method in r.methods:
            config = recovery_config(exp, method, steps)
            model = exp.load(path)
            sites = attention_sites(model)
            start = time.perf_counter()
            # The unpruned model distilled from itself on the KL alone has nothing to learn: its loss is 0 and its
            # gradient 0 but for rounding, which Adam (dividing by the gradient's own scale) would turn into steps of
            # noise. The control of a kd- method is the unpruned model as it is.
            trains = not (label == UNPRUNED_MODEL and config.distils and not config.next_token_weight)
            if trains:
                recover_language_model(model, train, task.pad_token_id, config, runtime=exp.runtime,
                                       teacher=teacher if config.distils else None)
            seconds = time.perf_counter() - start
            if label != UNPRUNED_MODEL and is_main_process():  # under accelerate launch every process holds the same
                exp.save(model, recovered_path(exp, method, path.name))
            rows.append(dict(model=label, fraction_pruned=1 - sum(s.num_heads for s in sites) / sum(
                                 s.original_num_heads for s in sites),
                             params_removed=1 - non_embedding_parameters(model) / dense_params,
                             metric_unpruned=unpruned, metric_before=before,
                             metric_after=test(model)[0] if trains else before,
                             method=method, steps=steps, tokens=tokens, seconds=round(seconds, 1)))
            log.info("recover: %s, test perplexity %.2f -> %.2f after %d %s steps, %d tokens (unpruned %.2f; %.0f s)",
                     label, before, rows[-1]["metric_after"], steps, method, tokens, unpruned, seconds)
    return pd.DataFrame(rows)
