"""Stage finetune: fine-tune the base model on train; the metric on dev and test.

Translation: train the Marian model from scratch (saving checkpoints for the training-dynamics figure),
or take a pretrained one (or a fairseq checkpoint) as it is; BLEU with beam search on dev and test.
Language modelling: train the Llama model from scratch, or take a pretrained one as it is; perplexity on dev and test.
"""

from __future__ import annotations

from pipeline.run.preflight import preflight

if __name__ == "__main__":  # the params in a second or two, before the imports below load torch
    preflight("finetune")

import time

import pandas as pd
from transformers import LlamaConfig, MarianConfig

from pipeline.core.checkpoint import save_model
from pipeline.files.atomic import staged_dir, write_csv, write_json
from pipeline.files.schema import (
    BLEU,
    EVAL_SPLITS,
    FINETUNE_SUMMARY,
    PERPLEXITY,
    SPLITS,
    TASK_DATA,
    TASK_DATA_ATTRIBUTION,
    TASK_METRIC,
    TASK_MODEL,
    TRAINING_LOSS_TABLE,
    checkpoint_name,
)
from pipeline.lm.llama import new_llama
from pipeline.lm.perplexity import unigram_perplexity
from pipeline.lm.training import LanguageModelTrainConfig, train_language_model
from pipeline.mt.bleu import bleu
from pipeline.mt.marian import new_marian
from pipeline.mt.training import TranslationTrainConfig, train_translation
from pipeline.run.experiment import Experiment, log
from pipeline.tasks.evaluation import evaluate
from pipeline.training.classification import TrainConfig, finetune


def described(task: dict) -> dict:
    """What finetune.json repeats of task.json for the report's title and credits: the model, the data and its
    attribution."""
    return {key: task[key] for key in (TASK_MODEL, TASK_DATA, TASK_DATA_ATTRIBUTION)}


def write_training_loss(exp: Experiment, losses: list[float]) -> None:
    """The loss of every optimisation step of a model trained from scratch (a DVC plot); empty for one pruned as is."""
    write_csv(exp.reports / TRAINING_LOSS_TABLE, pd.DataFrame({"step": range(1, len(losses) + 1), "loss": losses}))


def classification(exp: Experiment) -> None:
    p, task = exp.params, exp.task()
    tokenizer = exp.tokenizer()
    start = time.perf_counter()
    if p.finetune.epochs == 0:  # a fine-tuned checkpoint, pruned as it is: the model as prepared, its own head
        model, losses = exp.checkpoint_classifier(), []
    else:
        model = exp.base_classifier()
        config = TrainConfig(batch_size=p.finetune.batch_size, learning_rate=p.finetune.learning_rate,
                             warmup_ratio=p.finetune.warmup_ratio, weight_decay=p.finetune.weight_decay,
                             epochs=p.finetune.epochs, seed=p.seed)
        losses = finetune(model, exp.splits()["train"], tokenizer, config, runtime=exp.runtime)
    seconds = time.perf_counter() - start
    with exp.runtime.autocast():
        # Also the splits beyond train/dev/test that the data brings (MNLI's mismatched validation set).
        extra = tuple(split for split in exp.splits() if split not in SPLITS)
        scores = {split: evaluate(model, es, task[TASK_METRIC])[0]
                  for split, es in exp.eval_sets((*EVAL_SPLITS, *extra)).items()}
    save_model(model, exp.finetuned_dir, tokenizer)
    write_json(exp.reports / FINETUNE_SUMMARY, {
        TASK_METRIC: task[TASK_METRIC], **scores, **described(task), "train_steps": len(losses),
        "train_loss_last": losses[-1] if losses else None, "train_seconds": round(seconds),
    })
    log.info("finetune: %s dev %.2f, test %.2f (%d steps, %.0f s)", task[TASK_METRIC], scores["dev"], scores["test"],
             len(losses), seconds)


def translation(exp: Experiment) -> None:
    p, task = exp.params, exp.task()
    t = p.finetune
    # Checkpoints go to a staging folder that replaces the old one at the end: a killed run leaves none that a
    # rerun would trust.
    start = time.perf_counter()
    with staged_dir(exp.checkpoints_dir) as staging:
        if exp.trains_from_scratch:
            tokenizer = exp.tokenizer()
            model = new_marian(MarianConfig.from_pretrained(exp.base_model_dir), p.seed).to(exp.runtime.device)
            model.set_attn_implementation(p.model.attn_implementation)
            config = TranslationTrainConfig(steps=t.steps, max_tokens=t.max_tokens, learning_rate=t.learning_rate,
                                            warmup_steps=t.warmup_steps, schedule=t.schedule,
                                            label_smoothing=t.label_smoothing, seed=p.seed)
            losses = train_translation(model, exp.splits()["train"], tokenizer, config, t.checkpoint_steps,
                                       lambda step, m: exp.save(m, staging / checkpoint_name(step)),
                                       runtime=exp.runtime)
            final_step = t.steps
        else:  # a pretrained model (or a fairseq checkpoint) is pruned as it is; its only "checkpoint" is itself
            model, losses, final_step = exp.load(exp.base_model_dir), [], 0
        seconds = time.perf_counter() - start
        exp.save(model, staging / checkpoint_name(final_step))
    scores, signature = {}, ""
    for split in EVAL_SPLITS:
        task_eval = exp.translation_eval(split, num_beams=p.translate.num_beams)
        with exp.runtime.autocast():
            hypotheses = task_eval(model)[1]
        scores[split], signature = bleu(hypotheses, task_eval.references)
    exp.save(model, exp.finetuned_dir)
    write_training_loss(exp, losses)
    write_json(exp.reports / FINETUNE_SUMMARY, {
        TASK_METRIC: BLEU, **scores, "bleu_signature": signature, "num_beams": p.translate.num_beams,
        **described(task), "train_steps": len(losses), "train_loss_last": losses[-1] if losses else None,
        "train_seconds": round(seconds),
    })
    log.info("finetune: BLEU dev %.2f, test %.2f (beam %d; %d steps, %.0f s)", scores["dev"], scores["test"],
             p.translate.num_beams, len(losses), seconds)


def language_modeling(exp: Experiment) -> None:
    p, task = exp.params, exp.task()
    t = p.finetune
    start = time.perf_counter()
    if exp.trains_from_scratch:
        model = new_llama(LlamaConfig.from_pretrained(exp.base_model_dir), p.seed).to(exp.runtime.device)
        model.set_attn_implementation(p.model.attn_implementation)
        config = LanguageModelTrainConfig(steps=t.steps, batch_size=t.batch_size, learning_rate=t.learning_rate,
                                          warmup_steps=t.warmup_steps, weight_decay=t.weight_decay, seed=p.seed)
        losses = train_language_model(model, exp.split("train")["input_ids"][:], exp.pad_token_id, config,
                                      runtime=exp.runtime)
    else:  # a pretrained model is pruned as it is
        model, losses = exp.load(exp.base_model_dir), []
    seconds = time.perf_counter() - start
    scores = {split: exp.lm_eval(split)(model)[0] for split in EVAL_SPLITS}
    train, test = exp.split("train")["input_ids"][:], exp.split("test")["input_ids"][:]
    unigram = unigram_perplexity(train, test, model.config.vocab_size)
    exp.save(model, exp.finetuned_dir)
    write_training_loss(exp, losses)
    write_json(exp.reports / FINETUNE_SUMMARY, {
        TASK_METRIC: PERPLEXITY, **scores, "test_unigram": unigram, **described(task), "texts": task["texts"],
        "tokens": task["tokens"], "train_steps": len(losses), "train_loss_last": losses[-1] if losses else None,
        "train_seconds": round(seconds),
    })
    log.info("finetune: perplexity dev %.2f, test %.2f (unigram baseline on test %.2f; %d steps, %.0f s)",
             scores["dev"], scores["test"], unigram, len(losses), seconds)


def main() -> None:
    exp = Experiment.from_cli()
    if exp.is_language_modeling:
        language_modeling(exp)
    else:
        translation(exp) if exp.is_translation else classification(exp)


if __name__ == "__main__":
    main()
