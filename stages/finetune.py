"""Stage finetune: fine-tune the base model on train; the metric on dev and test."""

from __future__ import annotations

import time

from pipeline.atomic import write_json
from pipeline.checkpoint import save_model
from pipeline.evaluation import evaluate
from pipeline.experiment import Experiment, log
from pipeline.training import TrainConfig, finetune


def main() -> None:
    exp = Experiment.from_params_file()
    p, task = exp.params, exp.task()
    model, tokenizer = exp.base_classifier(), exp.tokenizer()
    config = TrainConfig(batch_size=p.finetune.batch_size, learning_rate=p.finetune.learning_rate,
                         warmup_ratio=p.finetune.warmup_ratio, weight_decay=p.finetune.weight_decay,
                         epochs=p.finetune.epochs, seed=p.seed)
    start = time.perf_counter()
    losses = finetune(model, exp.splits()["train"], tokenizer, config)
    seconds = time.perf_counter() - start
    scores = {split: evaluate(model, es, task["metric"])[0] for split, es in exp.eval_sets().items()}
    save_model(model, exp.finetuned_dir, tokenizer)
    write_json(exp.reports / "finetune.json", {
        "metric": task["metric"], **scores, "model": task["model"], "data": task["data"],
        "data_attribution": task["data_attribution"], "train_loss_last": losses[-1], "train_seconds": round(seconds),
    })
    log.info("finetune: %s dev %.2f, test %.2f (%d steps, %.0f s)", task["metric"], scores["dev"], scores["test"],
             len(losses), seconds)


if __name__ == "__main__":
    main()
