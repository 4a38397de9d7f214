"""Training a language model, from scratch or to recover after pruning: AdamW, linear warm-up then linear decay to
0, batches of texts grouped by length, the loss the mean NLL over the batch's predicted tokens (so longer texts
weigh more, as in every LM's pre-training).

One loop (`train_language_model`) trains whatever parameters require grad: all of them for training from scratch
and full fine-tuning, only the adapters' for LoRA (`pipeline.tasks.language_modeling.lora`), which
`recover_language_model` wraps around the pruned model for the loop and merges back afterwards."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from pipeline.core.runtime import CPU_FP32, Runtime
from pipeline.data.evaluation import length_grouped_batches
from pipeline.files.schema import RECOVERY_METHODS
from pipeline.tasks.language_modeling.llama import batch_nll, collate_texts
from pipeline.tasks.language_modeling.lora import lora_adapters
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


@dataclass(frozen=True)
class RecoveryConfig:
    """Brief fine-tuning of a pruned model to win back perplexity: LoRA (LLM-Pruner's recovery; the default) or
    full fine-tuning. The defaults suit a 135M-parameter model on two CPU cores (about 2 s a step at 8 x 128
    tokens) and a GPU alike; they are LoRA's: full fine-tuning wants a learning rate some ten times smaller."""

    steps: int = 50
    method: str = "lora"  # one of RECOVERY_METHODS
    batch_size: int = 8  # texts per step
    learning_rate: float = 5e-4  # the peak
    warmup_steps: int = 5
    weight_decay: float = 0.0  # as LLM-Pruner's LoRA: none
    rank: int = 8  # LoRA only: the rank of each linear's update B A, and its scale alpha / rank
    alpha: float = 16.0
    dropout: float = 0.0  # LoRA only: on each adapter's input
    seed: int = 0

    def __post_init__(self) -> None:
        if self.method not in RECOVERY_METHODS:
            raise ValueError(f"recovery method must be one of {', '.join(RECOVERY_METHODS)}, got {self.method!r}")
        if self.rank < 1 or self.alpha <= 0 or not 0 <= self.dropout < 1:
            raise ValueError(f"LoRA needs rank >= 1, alpha > 0 and 0 <= dropout < 1; got rank {self.rank}, "
                             f"alpha {self.alpha}, dropout {self.dropout}")

    def train_config(self) -> LanguageModelTrainConfig:
        """The training loop's settings."""
        return LanguageModelTrainConfig(steps=self.steps, batch_size=self.batch_size,
                                        learning_rate=self.learning_rate, warmup_steps=self.warmup_steps,
                                        weight_decay=self.weight_decay, seed=self.seed)


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
    """Train `model`'s parameters that require grad in place, on its device, for cfg.steps optimisation steps over
    `sequences` (token ids, as tokenize_texts makes them), the forward passes at `runtime`'s precision; returns
    every step's loss. The same model, data, config and seed give the same losses (single-threaded CPU, or
    deterministic kernels)."""
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


def recover_language_model(
    model: PreTrainedModel,
    sequences: Sequence[Sequence[int]],
    pad_id: int,
    cfg: RecoveryConfig,
    progress: bool = True,
    runtime: Runtime = CPU_FP32,
) -> list[float]:
    """Fine-tune a (pruned) `model` in place for cfg.steps steps over `sequences`, by cfg.method; returns every
    step's loss. LoRA's adapters are merged into the weights at the end, so `model` stays a plain model of the
    same modules, shapes and parameter count, which `pipeline.core.checkpoint.save_model` saves as any other."""
    if cfg.method == "full":
        return train_language_model(model, sequences, pad_id, cfg.train_config(), progress, runtime)
    with lora_adapters(model, cfg.rank, cfg.alpha, cfg.dropout, cfg.seed) as adapted:
        return train_language_model(adapted, sequences, pad_id, cfg.train_config(), progress, runtime)
