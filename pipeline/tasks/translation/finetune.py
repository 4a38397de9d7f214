"""The finetune stage for translation: train the Marian model from scratch (saving checkpoints for the
training-dynamics figure), or take a pretrained model or a fairseq checkpoint as it is; BLEU with beam search
(translate.num_beams) on dev and test."""

from __future__ import annotations

import time

from transformers import MarianConfig

from pipeline.files.atomic import staged_dir
from pipeline.files.schema import EVAL_SPLITS, checkpoint_name
from pipeline.run.experiment import Experiment, log
from pipeline.run.task import Finetuned, training_summary
from pipeline.tasks.translation.bleu import bleu
from pipeline.tasks.translation.marian import new_marian
from pipeline.tasks.translation.training import TranslationTrainConfig, train_translation


def finetune(exp: Experiment) -> Finetuned:
    p = exp.params
    t = p.finetune
    # Checkpoints go to a staging folder that replaces the old one at the end: a killed run leaves none that a
    # rerun would trust.
    start = time.perf_counter()
    with staged_dir(exp.checkpoints_dir) as staging:
        if exp.task.trains_from_scratch:
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
        task_eval = exp.task.evaluation(split, num_beams=p.translate.num_beams)
        with exp.runtime.autocast():
            hypotheses = task_eval(model)[1]
        scores[split], signature = bleu(hypotheses, task_eval.references)
    log.info("finetune: BLEU dev %.2f, test %.2f (beam %d; %d steps, %.0f s)", scores["dev"], scores["test"],
             p.translate.num_beams, len(losses), seconds)
    return Finetuned(model, {**scores, **training_summary(losses, seconds)}, losses,
                     about={"bleu_signature": signature, "num_beams": p.translate.num_beams})
