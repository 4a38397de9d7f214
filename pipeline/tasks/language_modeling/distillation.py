"""Knowledge distillation from the unpruned model: the loss that `recover.method: kd-lora | kd-full` trains on.

Minitron (Sreenivas et al., 2024, "LLM Pruning and Distillation in Practice") recovers a pruned LLM on the KL
divergence from the unpruned model's next-token distribution alone, and finds it beats training the small model on
the next token; NVIDIA's Model Optimizer implements it as `LogitsDistillationLoss`
(modelopt/torch/distill/losses.py: KL(softmax(teacher / T) || softmax(student / T)) * T^2, averaged over tokens).
This module computes that loss, token by token, on the batches of the training loop
(`pipeline.tasks.language_modeling.training`):

- `kd_token_loss`: KL(teacher || student) at temperature T, times T^2 (so the gradient's scale does not shrink as T
  grows, as Hinton et al. 2015 prescribe), summed over each row's predicted tokens, with the padding left out.
- `Teacher`: the unpruned model run beside the student on the same batch (exact), or, with `top_k`, the teacher's k
  largest logits of each position cached once per batch, so that every pruned model recovered on the same batches
  reads them without running the teacher again (the student's log-probabilities at those k tokens against the
  teacher's, renormalised over them: a bound from above on the exact KL over the whole vocabulary).
- `distillation_objective`: the training loop's per-row loss, KL plus, by `next_token_weight`, the next-token NLL.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.core.importance import LABEL_PAD
from pipeline.tasks.language_modeling.llama import token_nll

# The training loop's objective: (model, batch, the batch's rows of the training sequences) -> summed loss per row.
Objective = Callable[[nn.Module, dict[str, torch.Tensor], np.ndarray], torch.Tensor]


def _predicted(labels: torch.Tensor) -> torch.Tensor:
    """Which positions predict a token: position t predicts label t + 1, and padding (-100) is never predicted."""
    return labels[:, 1:] != LABEL_PAD


def kd_token_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor,
                  temperature: float = 1.0) -> torch.Tensor:
    """T^2 KL(softmax(teacher / T) || softmax(student / T)) at every predicted position, summed over each row: the
    loss is 0 exactly where the student's distribution is the teacher's. Logits are upcast to fp32."""
    s = F.log_softmax(student_logits[:, :-1].float() / temperature, dim=-1)
    t = F.log_softmax(teacher_logits[:, :-1].float() / temperature, dim=-1)
    kl = (t.exp() * (t - s)).sum(dim=-1) * temperature**2
    return (kl * _predicted(labels)).sum(dim=1)


def kd_top_k_loss(student_logits: torch.Tensor, top_values: torch.Tensor, top_indices: torch.Tensor,
                  labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """`kd_token_loss` against the teacher's k largest logits only (`top_values`, `top_indices`: batch x positions x
    k, the positions those of the student's logits but the last): the teacher's distribution renormalised over its
    k tokens, the student's full log-probabilities at them. Never below the KL between the renormalised teacher and
    the student, so never negative."""
    s = F.log_softmax(student_logits[:, :-1].float() / temperature, dim=-1).gather(-1, top_indices)
    t = F.log_softmax(top_values.float() / temperature, dim=-1)
    kl = (t.exp() * (t - s)).sum(dim=-1) * temperature**2
    return (kl * _predicted(labels)).sum(dim=1)


@dataclass
class Teacher:
    """The unpruned model as the student's teacher, frozen and in eval mode. `top_k` None: its logits on every batch,
    computed beside the student's; `top_k` k: its k largest logits per position, computed once per batch (by the
    rows it holds) and cached for every student that trains on the same batches."""

    model: nn.Module
    top_k: int | None = None
    _cache: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.model.eval()  # no dropout: the targets are the model's own distribution

    @torch.no_grad()
    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The teacher's logits on `batch`, on the batch's device (under `accelerate launch` each process's own)."""
        device = batch["input_ids"].device
        if next(self.model.parameters()).device != device:
            self.model.to(device)
        return self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits

    def top(self, batch: dict[str, torch.Tensor], rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The k largest logits (values, token ids) at every position but the last, cached by `rows`."""
        key = tuple(int(r) for r in rows)
        if key not in self._cache:
            values, indices = self.logits(batch)[:, :-1].topk(self.top_k, dim=-1)
            self._cache[key] = (values.to(torch.bfloat16), indices.to(torch.int32))
        values, indices = self._cache[key]
        return values.to(batch["input_ids"].device), indices.to(batch["input_ids"].device, torch.int64)


def distillation_objective(teacher: Teacher, temperature: float = 1.0, next_token_weight: float = 0.0) -> Objective:
    """The loop's loss for distillation: per row, the KD loss summed over its tokens plus `next_token_weight` times its
    summed next-token NLL (0: the KL alone, as Minitron trains)."""

    def objective(model: nn.Module, batch: dict[str, torch.Tensor], rows: np.ndarray) -> torch.Tensor:
        student = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        if teacher.top_k is None:
            loss = kd_token_loss(student, teacher.logits(batch), batch["labels"], temperature)
        else:
            loss = kd_top_k_loss(student, *teacher.top(batch, rows), batch["labels"], temperature)
        if next_token_weight:
            loss = loss + next_token_weight * token_nll(student, batch["labels"])[0]
        return loss

    return objective
