"""What every width-pruning criterion reads of the unpruned model, gathered in one pass over the calibration data.

One forward and one backward pass per calibration batch, with hooks on the input of every output projection
(`o_proj`, whose input is the heads' outputs side by side; `down_proj`, whose input is the MLP's channels), fills
`CalibrationStatistics`: per channel the mean and the sum of squares (FLAP's fluctuation and bias, Wanda-sp's
norm), per unit (a head's `head_dim` channels, or one MLP channel) the mean L2 norm of its activation (Minitron)
and the mean |dL/dxi| of a gate on it (the paper's importance, per token), and per unit the first-order Taylor
saliency sum |w * dL/dw| over the unit's coupled weights (LLM-Pruner). So the peers differ only in what they do
with these numbers, and calibration costs one pass however many methods run: the issue's "gathered once per layer,
not once per method". FLAP and Wanda-sp gather theirs layer by layer, Wanda-sp on the already pruned layers below;
here every method reads the unpruned model, which is what FLAP's own code does (lib/prune.py `prune_flap`: "Use the
original output as input to the next layer").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from tqdm.auto import tqdm

from pipeline.core.importance import per_example_loss
from pipeline.core.sites import attention_sites, ffn_sites

Batch = Mapping[str, torch.Tensor]


@dataclass
class ProjectionInputs:
    """The input of one output projection over the calibration tokens (padding excluded), in float64.

    `unit_width` channels make one unit: `head_dim` for the attention's heads, 1 for the MLP's channels."""

    unit_width: int
    tokens: int
    sum: torch.Tensor  # [channels]
    sum_sq: torch.Tensor  # [channels]
    unit_norm: torch.Tensor  # [units]: the sum over tokens of the L2 norm of the unit's slice
    unit_gate: torch.Tensor  # [units]: the sum over tokens of |dL/dxi|, xi a gate multiplying the unit's slice

    @classmethod
    def empty(cls, channels: int, unit_width: int) -> ProjectionInputs:
        zeros = torch.zeros(channels, dtype=torch.float64)
        units = torch.zeros(channels // unit_width, dtype=torch.float64)
        return cls(unit_width, 0, zeros, zeros.clone(), units, units.clone())

    @property
    def mean(self) -> torch.Tensor:
        return self.sum / max(self.tokens, 1)

    @property
    def variance(self) -> torch.Tensor:
        """The sample variance of each channel (FLAP's "fluctuation")."""
        n = max(self.tokens, 2)
        return (self.sum_sq - self.sum.pow(2) / n) / (n - 1)

    def add(self, x: torch.Tensor) -> None:
        """`x`: `[tokens, channels]`, the real tokens of one batch."""
        x = x.double()
        self.tokens += x.shape[0]
        self.sum += x.sum(0).cpu()
        self.sum_sq += x.pow(2).sum(0).cpu()
        self.unit_norm += x.unflatten(1, (-1, self.unit_width)).norm(dim=2).sum(0).cpu()

    def add_gradient(self, x: torch.Tensor, grad: torch.Tensor) -> None:
        """dL/dxi_u at one token is the sum over the unit's channels of x * dL/dx (a gate of 1 multiplying them)."""
        per_unit = (x.double() * grad.double()).unflatten(1, (-1, self.unit_width)).sum(2)
        self.unit_gate += per_unit.abs().sum(0).cpu()


@dataclass
class CalibrationStatistics:
    """Per attention site and per MLP site (model order), what the criteria read (`ProjectionInputs`), and the
    LLM-Pruner saliency of each head and each MLP channel."""

    attention: list[ProjectionInputs]
    mlp: list[ProjectionInputs]
    taylor_heads: list[torch.Tensor]  # [num_heads]
    taylor_neurons: list[torch.Tensor]  # [num_neurons]
    windows: int


def _rows(layer: nn.Linear) -> torch.Tensor:
    """Per output row, the sum of |w * dL/dw|."""
    return (layer.weight.detach() * layer.weight.grad).abs().double().sum(1).cpu()


def _columns(layer: nn.Linear) -> torch.Tensor:
    """Per input column, the sum of |w * dL/dw|."""
    return (layer.weight.detach() * layer.weight.grad).abs().double().sum(0).cpu()


def gather_statistics(model: nn.Module, batches: Sequence[Batch], progress: bool = True) -> CalibrationStatistics:
    """Everything the width criteria read, from one forward and backward pass per batch of `batches` (with
    `labels`); the model's parameters and gradients are left as they were."""
    sites, ffns = attention_sites(model), ffn_sites(model)
    stats_a = [ProjectionInputs.empty(s.num_heads * s.head_dim, s.head_dim) for s in sites]
    stats_m = [ProjectionInputs.empty(f.num_neurons, 1) for f in ffns]
    linears = [*(lin for s in sites for lin in (*s.projections, s.out_proj)),
               *(lin for f in ffns for lin in (*f.inputs, f.fc_out))]
    device = next(model.parameters()).device
    was_training, grad_flags = model.training, {p: p.requires_grad for p in model.parameters()}
    mask: torch.Tensor | None = None

    def watch(stats: ProjectionInputs):
        def pre_hook(_module: nn.Module, args: tuple) -> None:
            x, real = args[0], mask.reshape(-1)
            stats.add(x.detach().reshape(-1, x.shape[-1])[real].float())
            if x.requires_grad:  # the input itself (no copy) waits for the backward pass
                held = x.detach()
                x.register_hook(lambda grad: stats.add_gradient(held.reshape(-1, held.shape[-1])[real].float(),
                                                                grad.reshape(-1, grad.shape[-1])[real].float()))

        return pre_hook

    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    for lin in linears:
        lin.weight.requires_grad_(True)
        lin.weight.grad = None
    handles = [s.out_proj.register_forward_pre_hook(watch(st)) for s, st in zip(sites, stats_a, strict=True)]
    handles += [f.fc_out.register_forward_pre_hook(watch(st)) for f, st in zip(ffns, stats_m, strict=True)]
    try:
        for batch in tqdm(batches, desc="width statistics", disable=not progress, leave=False):
            batch = {k: v.to(device) for k, v in batch.items()}
            mask = batch.get("attention_mask", torch.ones_like(batch["input_ids"])).bool()
            per_example_loss(model, {**batch, "use_cache": False}).sum().backward()
        taylor_heads, taylor_neurons = [], []
        for site in sites:
            q, k, v = site.projections
            hd = site.head_dim
            per_head = (_rows(q) + _columns(site.out_proj)).view(site.num_heads, hd).sum(1)
            kv = (_rows(k) + _rows(v)).view(-1, hd).sum(1)  # per key/value head, shared by its group's heads
            for kv_index, group in enumerate(site.head_groups):
                per_head[group] += kv[kv_index] / len(group)
            taylor_heads.append(per_head)
        for ffn in ffns:
            taylor_neurons.append(sum(_rows(lin) for lin in ffn.inputs) + _columns(ffn.fc_out))
    finally:
        for handle in handles:
            handle.remove()
        for lin in linears:
            lin.weight.grad = None
        for p, flag in grad_flags.items():
            p.requires_grad_(flag)
        model.train(was_training)
    windows = sum(len(batch["input_ids"]) for batch in batches)
    return CalibrationStatistics(stats_a, stats_m, taylor_heads, taylor_neurons, windows)
