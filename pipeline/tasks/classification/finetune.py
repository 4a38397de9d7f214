"""The finetune stage for classification: a fresh classification head fine-tuned with the encoder on train (the
paper's BERT recipe), or a fine-tuned checkpoint taken as it is (`finetune.epochs: 0`); the metric on dev, test and
any further split the data brings (MNLI's mismatched validation set)."""

from __future__ import annotations

import time

import torch
import transformers
from transformers import AutoModelForSequenceClassification

from pipeline.data.evaluation import evaluate
from pipeline.files.schema import EVAL_SPLITS, SPLITS, TASK_METRIC
from pipeline.run.experiment import Experiment, log
from pipeline.run.task import Finetuned, training_summary
from pipeline.tasks.classification.data import HeadMismatch, checkpoint_label_order, reorder_head
from pipeline.tasks.classification.training import TrainConfig
from pipeline.tasks.classification.training import finetune as train


def base_classifier(exp: Experiment) -> torch.nn.Module:
    """The prepared encoder with a new classification head for the task's labels."""
    torch.manual_seed(exp.params.seed)  # the fresh classification head's initialisation
    return AutoModelForSequenceClassification.from_pretrained(
        exp.base_model_dir, num_labels=exp.task_info()["num_labels"], trust_remote_code=exp.trust_remote_code,
        attn_implementation=exp.params.model.attn_implementation).to(exp.runtime.device)


def checkpoint_classifier(exp: Experiment) -> torch.nn.Module:
    """The prepared model as the fine-tuned model (`finetune.epochs: 0`): its own classification head, checked
    against the task and reordered to the task's labels, with no weight initialised afresh. Anything else exits
    with one line naming the keys, before the stage writes anything."""
    task, base = exp.task_info(), exp.base_model_dir
    config = transformers.AutoConfig.from_pretrained(base, trust_remote_code=exp.trust_remote_code)

    def refuse(why: str) -> SystemExit:
        return SystemExit(f"error: finetune.epochs: 0 evaluates model.name_or_path ({task['model']}) as it is, "
                          f"but {why}; allowed: a fine-tuned *ForSequenceClassification checkpoint with the "
                          f"task's {task['num_labels']} labels ({', '.join(task['label_names'] or []) or 'ids'}), "
                          f"or finetune.epochs > 0 to fine-tune a new head")

    try:
        order = checkpoint_label_order(getattr(config, "architectures", None), config.id2label, config.num_labels,
                                       task["num_labels"], task["label_names"], exp.params.finetune.head_labels)
    except HeadMismatch as error:
        raise refuse(str(error)) from None
    model, info = AutoModelForSequenceClassification.from_pretrained(
        base, attn_implementation=exp.params.model.attn_implementation, output_loading_info=True,
        trust_remote_code=exp.trust_remote_code)
    fresh = [*info.get("missing_keys", []), *info.get("mismatched_keys", [])]
    if fresh:
        raise refuse(f"its weights lack {', '.join(map(str, list(fresh)[:4]))}, which would be initialised at "
                     f"random")
    reorder_head(model, order, task["label_names"])
    return model.eval().to(exp.runtime.device)


def finetune(exp: Experiment) -> Finetuned:
    p, task = exp.params, exp.task_info()
    start = time.perf_counter()
    if p.finetune.epochs == 0:  # a fine-tuned checkpoint, pruned as it is: the model as prepared, its own head
        model, losses = checkpoint_classifier(exp), []
    else:
        model = base_classifier(exp)
        config = TrainConfig(batch_size=p.finetune.batch_size, learning_rate=p.finetune.learning_rate,
                             warmup_ratio=p.finetune.warmup_ratio, weight_decay=p.finetune.weight_decay,
                             epochs=p.finetune.epochs, seed=p.seed)
        losses = train(model, exp.splits()["train"], exp.tokenizer(), config, runtime=exp.runtime)
    seconds = time.perf_counter() - start
    with exp.runtime.autocast():
        # Also the splits beyond train/dev/test that the data brings (MNLI's mismatched validation set).
        extra = tuple(split for split in exp.splits() if split not in SPLITS)
        scores = {split: evaluate(model, es, task[TASK_METRIC])[0]
                  for split, es in exp.task.eval_sets((*EVAL_SPLITS, *extra)).items()}
    log.info("finetune: %s dev %.2f, test %.2f (%d steps, %.0f s)", task[TASK_METRIC], scores["dev"], scores["test"],
             len(losses), seconds)
    return Finetuned(model, {**scores, **training_summary(losses, seconds)})
