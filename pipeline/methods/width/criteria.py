"""The width criteria: one score per query head and per MLP channel (higher: keep), each as its paper defines it,
computed from the unpruned model's weights and one `CalibrationStatistics` pass.

A unit the allocation removes whole (a slice of query heads, a key/value group) scores the sum of its heads'
scores, or their mean for FLAP, whose head score is already a mean over channels (`UnitScores.unit_reduce`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from pipeline.core.sites import attention_sites, ffn_sites
from pipeline.methods.criteria import weight_magnitude
from pipeline.methods.width.statistics import CalibrationStatistics


@dataclass(frozen=True)
class UnitScores:
    """Per attention site a `[num_heads]` tensor, per MLP site a `[num_neurons]` tensor; higher is more important."""

    heads: list[torch.Tensor]
    neurons: list[torch.Tensor]
    unit_reduce: str = "sum"  # how a unit of several heads scores: "sum" or "mean" of its heads'


def _per_head(per_channel: torch.Tensor, head_dim: int, reduce: str = "sum") -> torch.Tensor:
    grouped = per_channel.view(-1, head_dim)
    return grouped.sum(1) if reduce == "sum" else grouped.mean(1)


def _weight(layer: nn.Linear) -> torch.Tensor:
    return layer.weight.detach().double().cpu()


def paper_importance(model: nn.Module, stats: CalibrationStatistics) -> UnitScores:
    """The paper's I_h = E |dL/dxi_h|, per token as the project's LLM default scores heads (score.estimator:
    token, no per-layer normalisation: docs/llm-importance.md), with a gate on each MLP channel as on each head."""
    return UnitScores([s.unit_gate / s.tokens for s in stats.attention], [s.unit_gate / s.tokens for s in stats.mlp])


def llm_pruner(model: nn.Module, stats: CalibrationStatistics) -> UnitScores:
    """LLM-Pruner (Ma et al., NeurIPS 2023), first-order Taylor importance of coupled structures
    (horseee/LLM-Pruner, LLMPruner/pruner/hf_llama_pruner.py `TaylorImportance`, taylor="param_first",
    group_reduction="sum"): per weight |w * dL/dw|, summed over every weight the structure couples: a head's rows
    of q_proj and columns of o_proj (and its share of its key/value head's rows of k_proj and v_proj), an MLP
    channel's rows of gate_proj and up_proj and column of down_proj."""
    return UnitScores(stats.taylor_heads, stats.taylor_neurons)


def flap(model: nn.Module, stats: CalibrationStatistics) -> UnitScores:
    """FLAP (An et al., AAAI 2024), the fluctuation metric WIFV (CASIA-IVA-Lab/FLAP, lib/prune.py `prune_flap` and
    `metrics["WIFV"]`): per input channel j of o_proj and down_proj, Var(X_j) * sum_i W_ij^2; the attention's
    squared, as the code does. Each layer's channel scores are standardised (`standarlization`: minus the layer's
    mean, over its standard deviation), so scores compare across layers and between attention and MLP; a head
    scores the mean of its channels'."""
    def standardised(x: torch.Tensor) -> torch.Tensor:
        return (x - x.mean()) / x.std().clamp(min=1e-30)  # a layer of equal scores stays finite

    heads, neurons = [], []
    for site, s in zip(attention_sites(model), stats.attention, strict=True):
        wifv = s.variance * _weight(site.out_proj).pow(2).sum(0)
        heads.append(_per_head(standardised(wifv.pow(2)), site.head_dim, "mean"))
    for ffn, s in zip(ffn_sites(model), stats.mlp, strict=True):
        neurons.append(standardised(s.variance * _weight(ffn.fc_out).pow(2).sum(0)))
    return UnitScores(heads, neurons, unit_reduce="mean")


def wanda_sp(model: nn.Module, stats: CalibrationStatistics) -> UnitScores:
    """Wanda-sp, Wanda's metric |W| * ||X|| made structured (Sun et al., ICLR 2024; as FLAP's authors run it,
    CASIA-IVA-Lab/FLAP lib/prune.py `prune_wanda_sp`): per input channel j of o_proj and down_proj, the mean over
    output rows i of |W_ij| * ||X_j||_2, the norm over the calibration tokens; a head scores the sum over its
    channels. The code's norm is sqrt(mean over samples of the sum of squares), the same up to one factor."""
    heads, neurons = [], []
    for site, s in zip(attention_sites(model), stats.attention, strict=True):
        heads.append(_per_head(_weight(site.out_proj).abs().mean(0) * s.sum_sq.sqrt(), site.head_dim))
    for ffn, s in zip(ffn_sites(model), stats.mlp, strict=True):
        neurons.append(_weight(ffn.fc_out).abs().mean(0) * s.sum_sq.sqrt())
    return UnitScores(heads, neurons)


def minitron(model: nn.Module, stats: CalibrationStatistics) -> UnitScores:
    """Minitron (Muralidharan et al., 2024, "Compact Language Models via Pruning and Knowledge Distillation"),
    activation-based importance (NVIDIA/TensorRT-Model-Optimizer, modelopt/torch/nas/plugins/megatron.py: hooks
    on the input of linear_proj and linear_fc2): a head's output norm and an MLP channel's activation magnitude,
    each averaged over the calibration tokens: the paper's sum over batch and sequence of each token's norm
    (pipeline.methods.criteria.activation_norm's form), not ModelOpt's aggregation (|x| averaged over the sequence,
    then the L2 norm over the batch and the head's channels), which mixes channels across tokens before the norm."""
    return UnitScores([s.unit_norm / s.tokens for s in stats.attention], [s.unit_norm / s.tokens for s in stats.mlp])


def magnitude(model: nn.Module, stats: CalibrationStatistics) -> UnitScores:
    """Torch-Pruning's group magnitude (VainF/Torch-Pruning, torch_pruning/pruner/importance.py
    `GroupMagnitudeImportance(p=2, group_reduction="mean")`, as examples/LLMs/prune_llm.py uses it): per coupled
    channel the sum of w^2 of each layer's slice, averaged over the layers; heads as
    `pipeline.methods.criteria.weight_magnitude`, an MLP channel over its rows of gate_proj and up_proj and its
    column of down_proj. Needs no data."""
    neurons = []
    for ffn in ffn_sites(model):
        slices = [_weight(lin).pow(2).sum(1) for lin in ffn.inputs] + [_weight(ffn.fc_out).pow(2).sum(0)]
        neurons.append(torch.stack(slices).mean(0))
    return UnitScores([s.double() for s in weight_magnitude(model)], neurons)
