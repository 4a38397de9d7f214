"""MT training (Vaswani et al. 2017, scaled down): Adam with betas (0.9, 0.98), warm-up then
inverse-square-root (or linear) decay, label smoothing 0.1, batches by token budget."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Literal

import datasets
import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import MarianMTModel, PreTrainedTokenizerBase

from pipeline.core.importance import LABEL_PAD
from pipeline.core.runtime import CPU_FP32, Runtime
from pipeline.tasks.translation.marian import collate_pairs, decoder_inputs
from pipeline.training.optim import adamw, train_step


@dataclass(frozen=True)
class TranslationTrainConfig:
    steps: int
    max_tokens: int = 4096  # per batch: rows x longest source or target, padding included
    learning_rate: float = 1e-3  # the peak, reached at the end of warm-up
    warmup_steps: int = 400
    schedule: Literal["inverse_sqrt", "linear"] = "inverse_sqrt"
    label_smoothing: float = 0.1
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.98)
    max_grad_norm: float = 1.0
    seed: int = 0


def _lr_factor(cfg: TranslationTrainConfig) -> Callable[[int], float]:
    """Multiplier of the peak learning rate at scheduler step `s` (0-based): linear warm-up, then
    1/sqrt decay (Vaswani et al.; it never reaches 0, so training can be extended) or linear decay to 0
    at cfg.steps (better for a fixed, short budget)."""
    warmup = max(1, cfg.warmup_steps)

    def factor(s: int) -> float:
        step = s + 1
        if step <= warmup:
            return step / warmup
        if cfg.schedule == "inverse_sqrt":
            return math.sqrt(warmup / step)
        return max(0.0, (cfg.steps - step) / max(1, cfg.steps - warmup))

    if cfg.schedule not in ("inverse_sqrt", "linear"):
        raise ValueError(f"unknown schedule {cfg.schedule!r}; allowed: inverse_sqrt, linear")
    return factor


def token_budget_batches(
    src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, generator: np.random.Generator
) -> list[np.ndarray]:
    """One epoch of batches (row indices), each costing at most `max_tokens` = rows x longest side.

    Rows are sorted by length with a random tie-break, so batches hold similar lengths and waste little
    padding; the batch order is then shuffled. Both draws come from `generator`, so a seeded generator
    gives the same epochs. A single row longer than the budget is a batch of its own.
    """
    cost = np.maximum(src_lens, tgt_lens)
    order = np.lexsort((generator.permutation(len(cost)), cost))
    batches, start, longest = [], 0, 0
    for i, row in enumerate(order):
        longest = max(longest, int(cost[row]))
        if i > start and longest * (i - start + 1) > max_tokens:  # row i does not fit: close the batch
            batches.append(order[start:i])
            start, longest = i, int(cost[row])
    batches.append(order[start:])
    return [batches[i] for i in generator.permutation(len(batches))]


def train_translation(
    model: MarianMTModel,
    train_dataset: datasets.Dataset,
    tokenizer: PreTrainedTokenizerBase,
    cfg: TranslationTrainConfig,
    checkpoint_steps: Collection[int] = (),
    on_checkpoint: Callable[[int, MarianMTModel], None] | None = None,
    progress: bool = True,
    runtime: Runtime = CPU_FP32,
) -> list[float]:
    """Train `model` in place, on its device, for cfg.steps optimisation steps, the forward passes at `runtime`'s
    precision; returns every step's training loss.

    `train_dataset` holds input_ids and labels (tokenize_pairs). The loss is the label-smoothed
    cross-entropy averaged over the batch's target tokens (so longer sentences weigh more, as in
    fairseq and Marian). `on_checkpoint(step, model)` is called after each step in `checkpoint_steps`
    (step 0: before training), with the model in eval mode; it must not change the model. The same
    model, data, config and seed give the same losses (single-threaded CPU, or deterministic kernels).
    """
    if cfg.steps < 1:
        raise ValueError(f"steps must be positive; got {cfg.steps}")
    missing = {"input_ids", "labels"} - set(train_dataset.column_names)
    if missing or len(train_dataset) == 0:
        raise ValueError(f"train_dataset needs rows with tokenized columns input_ids, labels (see tokenize_pairs); "
                         f"got {len(train_dataset)} rows with columns {train_dataset.column_names}")
    bad = sorted(s for s in checkpoint_steps if not 0 <= s <= cfg.steps)
    if bad:
        raise ValueError(f"checkpoint steps {bad} lie outside 0..{cfg.steps}")
    if checkpoint_steps and on_checkpoint is None:
        raise ValueError("checkpoint_steps given without on_checkpoint")
    pad_id = tokenizer.pad_token_id
    start_id = model.config.decoder_start_token_id
    # Plain lists: indexing a datasets Column row by row costs ~0.1 ms a row.
    src, tgt = train_dataset["input_ids"][:], train_dataset["labels"][:]
    src_lens, tgt_lens = np.array([len(x) for x in src]), np.array([len(y) for y in tgt])
    longest = int(max(src_lens.max(), tgt_lens.max()))
    if longest > model.config.max_position_embeddings:
        raise ValueError(
            f"a training sentence has {longest} tokens but the model has only "
            f"{model.config.max_position_embeddings} positions; tokenize with max_length <= that"
        )

    optimizer = adamw(model, cfg.learning_rate, cfg.weight_decay, cfg.betas)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_factor(cfg))
    generator = np.random.default_rng(cfg.seed)
    torch.manual_seed(cfg.seed)  # dropout masks
    device = next(model.parameters()).device
    scaler = runtime.grad_scaler()

    def checkpoint(step: int) -> None:
        if step in checkpoint_steps:
            model.eval()
            on_checkpoint(step, model)
            model.train()

    model.train()
    checkpoint(0)
    losses: list[float] = []
    with tqdm(total=cfg.steps, desc="train", disable=not progress) as bar:
        while len(losses) < cfg.steps:
            for rows in token_budget_batches(src_lens, tgt_lens, cfg.max_tokens, generator):
                batch = collate_pairs([src[i] for i in rows], [tgt[i] for i in rows], pad_id)
                batch = {k: v.to(device) for k, v in batch.items()}
                labels = batch.pop("labels")
                with runtime.autocast():
                    logits = model(**batch, decoder_input_ids=decoder_inputs(labels, start_id, pad_id)).logits
                loss = F.cross_entropy(
                    logits.float().flatten(0, 1),
                    labels.flatten(),
                    ignore_index=LABEL_PAD,
                    label_smoothing=cfg.label_smoothing,
                )
                losses.append(train_step(loss, model, optimizer, scheduler, cfg.max_grad_norm, scaler))
                bar.update()
                bar.set_postfix(loss=f"{losses[-1]:.3f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
                checkpoint(len(losses))
                if len(losses) == cfg.steps:
                    break
    model.eval()
    return losses
