"""The optimiser and the optimisation step that both tasks train with (classification fine-tuning, MT training)."""

from __future__ import annotations

import torch
from torch import nn


def decays(name: str, param: nn.Parameter) -> bool:
    """Whether weight decay applies: to matrices only, the usual BERT/Transformer recipe, so not to biases or
    LayerNorm weights (BERT names them "LayerNorm", Marian "layer_norm")."""
    return param.dim() > 1 and "LayerNorm" not in name and "layer_norm" not in name


def adamw(
    model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.999)
) -> torch.optim.AdamW:
    """AdamW over `model`'s trainable parameters in two groups, decayed (`decays`) and not, each in the
    model's parameter order."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return torch.optim.AdamW(
        [
            {"params": [p for n, p in params if decays(n, p)], "weight_decay": weight_decay},
            {"params": [p for n, p in params if not decays(n, p)], "weight_decay": 0.0},
        ],
        lr=lr,
        betas=betas,
    )


def train_step(
    loss: torch.Tensor,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    max_grad_norm: float,
    scaler: torch.amp.GradScaler | None = None,
) -> float:
    """One optimisation step on `loss`: backward, clip the gradient norm, step the optimiser and the
    learning-rate schedule, clear the gradients. Returns the loss as a float.

    With an enabled `scaler` (fp16), the loss is scaled before backward and the gradients unscaled before
    clipping; a step whose gradients overflowed is skipped, as GradScaler does, and the scale shrinks."""
    if scaler is None or not scaler.is_enabled():
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        scaler.step(optimizer)
        scaler.update()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
