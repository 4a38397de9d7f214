"""Decoding: beam search over batches of sources, and the BLEU evaluation the pruning sweeps call."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import MarianMTModel, PreTrainedTokenizerBase

from pipeline.core.runtime import CPU_FP32, Runtime
from pipeline.files.schema import BLEU
from pipeline.tasks.translation.bleu import bleu, bleu_paired_pvalue, check_lengths


@torch.inference_mode()
def translate(
    model: MarianMTModel,
    tokenizer: PreTrainedTokenizerBase,
    sources: Sequence[str],
    num_beams: int = 4,
    batch_size: int = 64,
    max_new_tokens: int = 128,
    max_source_length: int | None = None,
    progress: bool = False,
) -> list[str]:
    """Translate `sources`, returning detokenised strings in the same order.

    Sentences are batched longest first, so each batch pads to similar lengths (and an out-of-memory
    batch fails at once); beam search with `num_beams` (1: greedy). Sources are truncated to
    `max_source_length` tokens (default: the model's position table). The model is left in eval mode.
    """
    model.eval()
    if not sources:
        return []
    device = next(model.parameters()).device
    max_source_length = max_source_length or model.config.max_position_embeddings
    encoded = tokenizer(list(sources), truncation=True, max_length=max_source_length)["input_ids"]
    order = np.argsort([-len(x) for x in encoded], kind="stable")
    outputs: list[str] = [""] * len(encoded)
    for start in tqdm(range(0, len(order), batch_size), desc="translate", disable=not progress, leave=False):
        rows = order[start : start + batch_size]
        batch = tokenizer.pad({"input_ids": [encoded[i] for i in rows]}, return_tensors="pt")
        generated = model.generate(
            input_ids=batch["input_ids"].to(device),
            attention_mask=batch["attention_mask"].to(device),
            num_beams=num_beams,
            do_sample=False,
            max_new_tokens=max_new_tokens,
        )
        texts = tokenizer.batch_decode(generated, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        for i, text in zip(rows, texts, strict=True):
            outputs[i] = text
    return outputs


class TranslationEval:
    """Scores a model by the corpus BLEU of its translations of one split (`ClassificationEval`'s twin).

    The outputs are the hypotheses, so the paired bootstrap compares two models' translations of the
    same sentences.
    """

    metric = BLEU

    def __init__(self, tokenizer: PreTrainedTokenizerBase, sources: Sequence[str], references: Sequence[str],
                 num_beams: int = 1, batch_size: int = 64, max_new_tokens: int = 64, runtime: Runtime = CPU_FP32):
        check_lengths(references, sources=sources)
        self.tokenizer, self.sources, self.references = tokenizer, list(sources), list(references)
        self.num_beams, self.batch_size, self.max_new_tokens = num_beams, batch_size, max_new_tokens
        self.runtime = runtime  # decodes under its autocast, also on a Dask worker

    def __len__(self) -> int:
        return len(self.sources)

    def __call__(self, model: MarianMTModel) -> tuple[float, list[str]]:
        with self.runtime.autocast():
            hypotheses = translate(model, self.tokenizer, self.sources, self.num_beams, self.batch_size,
                                   self.max_new_tokens)
        return bleu(hypotheses, self.references)[0], hypotheses

    def pvalue(self, outputs: Sequence[str], baseline: Sequence[str], n_resamples: int, seed: int) -> float:
        return bleu_paired_pvalue(outputs, baseline, self.references, n_resamples, seed)
