"""The classification `Task`: what every stage of its pipeline uses (pipeline/run/task.py)."""

from __future__ import annotations

from collections.abc import Mapping

import datasets

from pipeline.data.evaluation import ClassificationEval, EvalSet, TaskEval, labelled_batches, make_eval_set
from pipeline.files.schema import CLASSIFICATION, EVAL_SPLITS
from pipeline.run.task import Batch, Task


class ClassificationTask(Task):
    name = CLASSIFICATION

    def batches(self, data: datasets.Dataset, batch_size: int) -> list[Batch]:
        return labelled_batches(data, self.exp.tokenizer(), batch_size)

    def eval_sets(self, splits: tuple[str, ...] = EVAL_SPLITS, max_examples: int | None = None
                  ) -> dict[str, EvalSet]:
        """Evaluation batches of each split; a seeded random subset of `max_examples` when given (the sweeps of
        ablate and prune evaluate hundreds of models, and their cost is linear in it)."""
        exp = self.exp
        data, tokenizer = exp.splits(), exp.tokenizer()
        sets = {}
        for split in splits:
            dataset = data[split]
            if max_examples is not None and max_examples < len(dataset):
                dataset = dataset.shuffle(seed=exp.params.seed).select(range(max_examples))
            sets[split] = make_eval_set(dataset, tokenizer, exp.params.eval.batch_size)
        return sets

    def evaluation(self, split: str, max_examples: int | None = None) -> ClassificationEval:
        return ClassificationEval(self.eval_sets((split,), max_examples)[split], self.exp.metric, self.exp.runtime)

    def evaluations(self, max_examples: int | None) -> dict[str, TaskEval]:
        sets = self.eval_sets(self.sweep_splits, max_examples)
        return {split: ClassificationEval(s, self.exp.metric, self.exp.runtime) for split, s in sets.items()}

    def probe_batch(self, evals: Mapping[str, TaskEval]) -> Batch:
        """The first evaluation batch: sentences of the task's own length."""
        return {k: v[:8] for k, v in next(iter(evals.values())).eval_set.batches[0].items()}


TASK = ClassificationTask
