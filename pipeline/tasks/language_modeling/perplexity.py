"""Perplexity on held-out text: the evaluation the ablation and pruning sweeps call (`ClassificationEval`'s and
`TranslationEval`'s twin), lower is better.

Perplexity = exp(total NLL / total predicted tokens) over the split: a corpus-level token average, as LM papers
report it (not a mean of per-text perplexities, which short texts would dominate). Each text's output is its
(summed NLL, token count), so the paired bootstrap resamples texts and recomputes corpus perplexity.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from pipeline.core.placement import input_device
from pipeline.core.runtime import CPU_FP32, Runtime
from pipeline.data.metrics import paired_bootstrap
from pipeline.files.schema import PERPLEXITY
from pipeline.tasks.language_modeling.llama import batch_nll, collate_texts


def perplexity(outputs: np.ndarray) -> float:
    """Corpus perplexity of per-text outputs, rows of (summed NLL, tokens)."""
    return float(np.exp(outputs[:, 0].sum() / max(outputs[:, 1].sum(), 1)))


def unigram_perplexity(train: Sequence[Sequence[int]], held_out: Sequence[Sequence[int]], vocab_size: int) -> float:
    """The perplexity of the training tokens' frequencies (add-one smoothed) on the tokens a model predicts in
    `held_out` (all but each sequence's first): the baseline a trained model must clearly beat."""
    counts = np.bincount(np.concatenate([np.asarray(s[1:]) for s in train]), minlength=vocab_size) + 1.0
    log_p = np.log(counts / counts.sum())
    predicted = np.concatenate([np.asarray(s[1:]) for s in held_out])
    return float(np.exp(-log_p[predicted].mean()))


class LanguageModelEval:
    """Scores a model by its perplexity on one split's token sequences, padded into length-sorted batches once."""

    metric = PERPLEXITY

    def __init__(self, sequences: Sequence[Sequence[int]], pad_id: int, batch_size: int = 64,
                 runtime: Runtime = CPU_FP32):
        if not sequences:
            raise ValueError("perplexity needs at least one sequence")
        # Longest first, so a batch too large for memory fails at once; outputs come back in the split's order.
        self.order = np.argsort([-len(s) for s in sequences], kind="stable")
        self.batches = [collate_texts([sequences[i] for i in self.order[start : start + batch_size]], pad_id)
                        for start in range(0, len(sequences), batch_size)]
        self.runtime = runtime  # evaluates under its autocast, also on a Dask worker

    def __len__(self) -> int:
        return len(self.order)

    @property
    def model_inputs(self) -> list[dict[str, torch.Tensor]]:
        """The inputs of the evaluation's model calls, one per batch, in order (the ablation replays layers on them)."""
        return [{"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]} for b in self.batches]

    @torch.inference_mode()
    def outputs(self, model: nn.Module, progress: bool = False) -> np.ndarray:
        """(summed NLL, predicted tokens) of every sequence, in the split's order, float64."""
        model.eval()
        device = input_device(model)  # a sharded model's first layer's device
        rows = []
        with self.runtime.autocast():
            for batch in tqdm(self.batches, desc="perplexity", disable=not progress, leave=False):
                nll, tokens = batch_nll(model, {k: v.to(device) for k, v in batch.items()})
                rows.append(torch.stack([nll.double(), tokens.double()], dim=1).cpu())
        ordered = torch.cat(rows).numpy()
        out = np.empty_like(ordered)
        out[self.order] = ordered
        return out

    def __call__(self, model: nn.Module) -> tuple[float, np.ndarray]:
        """(perplexity, per-sequence outputs for `pvalue`)."""
        outputs = self.outputs(model)
        return perplexity(outputs), outputs

    def pvalue(self, outputs: np.ndarray, baseline: np.ndarray, n_resamples: int, seed: int) -> float:
        """Paired bootstrap over texts: could the perplexity difference of the two models be chance?"""

        def deltas(idx: np.ndarray) -> np.ndarray:
            def ppl(o: np.ndarray) -> np.ndarray:
                return np.exp(o[idx, 0].sum(axis=1) / np.maximum(o[idx, 1].sum(axis=1), 1))

            return ppl(outputs) - ppl(baseline)

        return paired_bootstrap(deltas, len(outputs), n_resamples, seed)
