"""Fine-tuning: plain PyTorch AdamW with linear warm-up and decay, seeded."""

from __future__ import annotations

import math
from dataclasses import dataclass

import datasets
import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase, get_linear_schedule_with_warmup

from pipeline.core.runtime import CPU_FP32, Runtime
from pipeline.data.evaluation import training_batches
from pipeline.training.optim import adamw, train_step


@dataclass(frozen=True)
class TrainConfig:
    batch_size: int
    learning_rate: float
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    epochs: float | None = None  # either a (possibly fractional) number of epochs...
    steps: int | None = None  # ...or a number of optimisation steps
    seed: int = 0
    max_grad_norm: float = 1.0


def finetune(
    model: nn.Module, train: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, config: TrainConfig,
    progress: bool = True, runtime: Runtime = CPU_FP32,
) -> list[float]:
    """Train `model` in place, on its device, with the forward passes at `runtime`'s precision; returns the
    loss of every step."""
    if (config.epochs is None) == (config.steps is None):
        raise ValueError("give exactly one of epochs or steps")
    steps_per_epoch = math.ceil(len(train) / config.batch_size)
    total = config.steps or max(1, round(config.epochs * steps_per_epoch))
    optimizer = adamw(model, config.learning_rate, config.weight_decay)
    scheduler = get_linear_schedule_with_warmup(optimizer, round(config.warmup_ratio * total), total)
    generator = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)  # dropout masks
    device = next(model.parameters()).device
    scaler = runtime.grad_scaler()
    model.train()
    losses: list[float] = []
    with tqdm(total=total, desc="fine-tune", disable=not progress) as bar:
        while len(losses) < total:
            for batch in training_batches(train, tokenizer, config.batch_size, generator):
                with runtime.autocast():
                    loss = model(**{k: v.to(device) for k, v in batch.items()}).loss
                losses.append(train_step(loss, model, optimizer, scheduler, config.max_grad_norm, scaler))
                bar.update()
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
                if len(losses) == total:
                    break
    model.eval()
    return losses
