"""The finetune stage for language modelling: train the Llama model from scratch, or take a pretrained one as it
is; perplexity on dev and test, beside a unigram baseline on test."""

from __future__ import annotations

import time

from transformers import LlamaConfig

from pipeline.files.schema import EVAL_SPLITS
from pipeline.run.experiment import Experiment, log
from pipeline.run.task import Finetuned, training_summary
from pipeline.tasks.language_modeling.llama import new_llama
from pipeline.tasks.language_modeling.perplexity import unigram_perplexity
from pipeline.tasks.language_modeling.training import LanguageModelTrainConfig, train_language_model


def finetune(exp: Experiment) -> Finetuned:
    p, task = exp.params, exp.task_info()
    t = p.finetune
    start = time.perf_counter()
    if exp.task.trains_from_scratch:
        model = new_llama(LlamaConfig.from_pretrained(exp.base_model_dir), p.seed).to(exp.runtime.device)
        model.set_attn_implementation(p.model.attn_implementation)
        config = LanguageModelTrainConfig(steps=t.steps, batch_size=t.batch_size, learning_rate=t.learning_rate,
                                          warmup_steps=t.warmup_steps, weight_decay=t.weight_decay, seed=p.seed)
        losses = train_language_model(model, exp.split("train")["input_ids"][:], exp.task.pad_token_id, config,
                                      runtime=exp.runtime)
    else:  # a pretrained model is pruned as it is
        model, losses = exp.load(exp.base_model_dir), []
    seconds = time.perf_counter() - start
    scores = {split: exp.task.evaluation(split)(model)[0] for split in EVAL_SPLITS}
    train, test = exp.split("train")["input_ids"][:], exp.split("test")["input_ids"][:]
    unigram = unigram_perplexity(train, test, model.config.vocab_size)
    log.info("finetune: perplexity dev %.2f, test %.2f (unigram baseline on test %.2f; %d steps, %.0f s)",
             scores["dev"], scores["test"], unigram, len(losses), seconds)
    return Finetuned(model, {**scores, **training_summary(losses, seconds)}, losses,
                     about={"test_unigram": unigram, "texts": task["texts"], "tokens": task["tokens"]})
