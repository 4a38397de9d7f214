"""Training a language model from scratch: AdamW, linear warm-up then linear decay to 0, batches of texts
grouped by length, the loss the mean NLL over the batch's predicted tokens (so longer texts weigh more, as in
every LM's pre-training)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from pipeline.core.runtime import CPU_FP32, Runtime
from pipeline.lm.llama import batch_nll, collate_texts
from pipeline.tasks.evaluation import length_grouped_batches
from pipeline.training.optim import adamw, train_step


@dataclass(frozen=True)
class LanguageModelTrainConfig:
    steps: int
    batch_size: int = 64  # texts per step
    learning_rate: float = 2e-3  # the peak, reached at the end of warm-up
    warmup_steps: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)  # Llama's
    max_grad_norm: float = 1.0
    seed: int = 0


def linear_schedule(warmup_steps: int, steps: int) -> Callable[[int], float]:
    """Multiplier of the peak learning rate at scheduler step `s` (0-based): linear warm-up, then linear decay to
    0 at `steps` (a fixed, short budget)."""
    warmup = max(1, warmup_steps)

    def factor(s: int) -> float:
        step = s + 1
        if step <= warmup:
            return step / warmup
        return max(0.0, (steps - step) / max(1, steps - warmup))

    return factor


def train_language_model(
    model: PreTrainedModel,
    sequences: Sequence[Sequence[int]],
    pad_id: int,
    cfg: LanguageModelTrainConfig,
    progress: bool = True,
    runtime: Runtime = CPU_FP32,
) -> list[float]:
    """Train `model` in place, on its device, for cfg.steps optimisation steps over `sequences` (token ids, as
    tokenize_texts makes them), the forward passes at `runtime`'s precision; returns every step's loss. The same
    model, data, config and seed give the same losses (single-threaded CPU, or deterministic kernels)."""
    if cfg.steps < 1 or not sequences:
        raise ValueError(f"training needs steps >= 1 and some sequences; got {cfg.steps} steps, "
                         f"{len(sequences)} sequences")
    longest = max(map(len, sequences))
    if longest > model.config.max_position_embeddings:
        raise ValueError(f"a training sequence has {longest} tokens but the model has "
                         f"{model.config.max_position_embeddings} positions; tokenize with max_length <= that")
    optimizer = adamw(model, cfg.learning_rate, cfg.weight_decay, cfg.betas)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_schedule(cfg.warmup_steps, cfg.steps))
    generator = np.random.default_rng(cfg.seed)
    torch.manual_seed(cfg.seed)  # attention dropout, if any
    device = next(model.parameters()).device
    scaler = runtime.grad_scaler()
    lengths = np.array([len(s) for s in sequences])
    losses: list[float] = []
    model.train()
    with tqdm(total=cfg.steps, desc="train", disable=not progress) as bar:
        while len(losses) < cfg.steps:
            for rows in length_grouped_batches(lengths, cfg.batch_size, generator.permutation):
                batch = {k: v.to(device) for k, v in collate_texts([sequences[i] for i in rows], pad_id).items()}
                with runtime.autocast():
                    nll, tokens = batch_nll(model, batch)
                loss = nll.sum() / tokens.sum().clamp(min=1)
                losses.append(train_step(loss, model, optimizer, scheduler, cfg.max_grad_norm, scaler))
                bar.update()
                bar.set_postfix(loss=f"{losses[-1]:.3f}", ppl=f"{math.exp(min(losses[-1], 50)):.1f}")
                if len(losses) == cfg.steps:
                    break
    model.eval()
    return losses
