"""Batching and evaluation for sequence classification.

An evaluation split is padded into batches once (`EvalSet`) and reused by every evaluation of
every pruned or masked model. Batches are formed from length-sorted examples, so each pads only to
its own longest sequence; predictions come back in the split's original order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import datasets
import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase

from pipeline.core.runtime import CPU_FP32, Runtime
from pipeline.data.metrics import compute_metric, paired_bootstrap_pvalue

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass
class EvalSet:
    batches: list[dict[str, torch.Tensor]]  # model inputs, without labels
    order: np.ndarray  # order[i] = original index of the i-th example in batch order
    labels: np.ndarray  # in original order

    def __len__(self) -> int:
        return len(self.labels)


def _collate(collator: DataCollatorWithPadding, dataset: datasets.Dataset, indices: Sequence[int]) -> dict:
    rows = dataset.select(indices)
    features = [{k: row[k] for k in rows.column_names if k in (*MODEL_INPUTS, "labels")} for row in rows]
    return dict(collator(features))


def _length_order(dataset: datasets.Dataset) -> np.ndarray:
    lengths = np.array([len(ids) for ids in dataset["input_ids"]])
    return np.argsort(-lengths, kind="stable")  # longest first: a too-large batch fails at once


def labelled_batches(dataset: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, batch_size: int,
                     order: np.ndarray | None = None) -> list[dict[str, torch.Tensor]]:
    """Length-sorted padded batches with labels (for importance scoring)."""
    order = _length_order(dataset) if order is None else order
    collator = DataCollatorWithPadding(tokenizer)
    return [_collate(collator, dataset, order[i : i + batch_size].tolist()) for i in range(0, len(order), batch_size)]


def make_eval_set(dataset: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, batch_size: int) -> EvalSet:
    order = _length_order(dataset)
    batches = labelled_batches(dataset, tokenizer, batch_size, order)
    for batch in batches:
        batch.pop("labels")
    return EvalSet(batches, order, np.asarray(dataset["labels"]))


def training_batches(
    dataset: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, batch_size: int, generator: torch.Generator
) -> Iterator[dict[str, torch.Tensor]]:
    """One epoch of shuffled batches, grouped by length (`length_grouped_batches`)."""
    lengths = np.array([len(ids) for ids in dataset["input_ids"]])
    collator = DataCollatorWithPadding(tokenizer)
    for rows in length_grouped_batches(lengths, batch_size, lambda n: torch.randperm(n, generator=generator).numpy()):
        yield _collate(collator, dataset, rows.tolist())


def length_grouped_batches(lengths: np.ndarray, batch_size: int, permutation: Callable[[int], np.ndarray]
                           ) -> list[np.ndarray]:
    """One epoch of batches (row indices), grouped by length to cut padding (as HF Trainer's group_by_length):
    shuffle, sort within mega-batches of 50 batches, then shuffle the batches. `permutation(n)` is a random order
    of range(n) drawn from the caller's generator, so each caller keeps its own random stream."""
    perm = permutation(len(lengths))
    mega = batch_size * 50
    batches = []
    for start in range(0, len(perm), mega):
        chunk = perm[start : start + mega]
        chunk = chunk[np.argsort(-lengths[chunk], kind="stable")]
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    return [batches[b] for b in permutation(len(batches))]


@torch.inference_mode()
def predict(model: nn.Module, eval_set: EvalSet, progress: bool = False, desc: str = "predict") -> np.ndarray:
    """Predicted class ids, in the split's original order."""
    model.eval()
    device = next(model.parameters()).device
    out = []
    for batch in tqdm(eval_set.batches, desc=desc, disable=not progress, leave=False):
        logits = model(**{k: v.to(device) for k, v in batch.items()}).logits
        out.append(logits.argmax(-1).cpu())
    sorted_preds = torch.cat(out).numpy()
    preds = np.empty_like(sorted_preds)
    preds[eval_set.order] = sorted_preds
    return preds


def evaluate(model: nn.Module, eval_set: EvalSet, metric: str) -> tuple[float, np.ndarray]:
    """(metric in percent, predictions)."""
    preds = predict(model, eval_set)
    return compute_metric(metric, preds, eval_set.labels), preds


class TaskEval(Protocol):
    """What the ablation and pruning sweeps need from a task: a score per model, per-example outputs,
    and a paired significance test between two models' outputs. `metric` names the score, and so which way
    it is better (files/schema.py, LOWER_IS_BETTER)."""

    metric: str

    def __len__(self) -> int: ...

    def __call__(self, model: nn.Module) -> tuple[float, Any]: ...

    def pvalue(self, outputs: Any, baseline: Any, n_resamples: int, seed: int) -> float: ...


class ClassificationEval:
    """Scores a model on one evaluation split: what the ablation and pruning sweeps call, once per
    masked or pruned model. `TranslationEval` (pipeline/tasks/translation/decoding.py) is the same thing with BLEU."""

    def __init__(self, eval_set: EvalSet, metric: str, runtime: Runtime = CPU_FP32):
        # The runtime's precision goes with the evaluation, so that a sweep's shards on other processes (Dask
        # workers) evaluate under the same autocast as the stage.
        self.eval_set, self.metric, self.runtime = eval_set, metric, runtime

    def __len__(self) -> int:
        return len(self.eval_set)

    @property
    def model_inputs(self) -> list[dict[str, torch.Tensor]]:
        """The inputs of the evaluation's model calls, one per batch, in order (the ablation replays layers on them)."""
        return self.eval_set.batches

    def __call__(self, model: nn.Module) -> tuple[float, np.ndarray]:
        """(score, per-example outputs for `pvalue`)."""
        with self.runtime.autocast():
            return evaluate(model, self.eval_set, self.metric)

    def pvalue(self, outputs: np.ndarray, baseline: np.ndarray, n_resamples: int, seed: int) -> float:
        return paired_bootstrap_pvalue(self.metric, outputs, baseline, self.eval_set.labels, n_resamples, seed)
