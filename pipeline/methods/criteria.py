"""Head criteria beside the paper's gradient importance, for decoder-only language models (and any model whose
attention sites all read one token sequence).

Each returns what `pipeline.core.importance.head_importance` returns, one `[num_heads]` float tensor per attention
site (higher: more important), so `rank_heads(scores, groups, unit)` and `select_heads` take them unchanged.

- `weight_magnitude`: Torch-Pruning's criterion for LLM heads (`examples/LLMs/prune_llm.py`, VainF/Torch-Pruning
  at e80127d: `GroupMagnitudeImportance(p=2, group_reduction="mean")`). Needs no data.
- `activation_norm`: Minitron's criterion (Muralidharan et al., 2024, "Compact Language Models via Pruning and
  Knowledge Distillation"): the size of each head's output on calibration tokens. Needs a forward pass, no labels.
- `paper-importance`: the paper's E_x |dL(x)/dxi_h| (`head_importance`), drawn beside a score stage that ranks
  otherwise (score.estimator, score.normalize_p), so that the paper's own order stays on the plot.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
from torch import nn
from tqdm.auto import tqdm

from pipeline.core.importance import head_importance
from pipeline.core.layerwise import LayerwiseModel, carry_forward
from pipeline.core.sites import AttentionSite, attention_sites
from pipeline.files.schema import ACTIVATION, CROSS, HEAD_CRITERIA, MAGNITUDE, PAPER_IMPORTANCE

MODEL_INPUTS = ("input_ids", "attention_mask")


def _output_rows(layer: nn.Module) -> torch.Tensor:
    """`[out, in]`: one row per output channel (GPT-2's Conv1D stores its weight as `[in, out]`)."""
    return layer.weight if isinstance(layer, nn.Linear) else layer.weight.T


def _input_rows(layer: nn.Module) -> torch.Tensor:
    """`[in, out]`: one row per input channel."""
    return layer.weight.T if isinstance(layer, nn.Linear) else layer.weight


@torch.no_grad()
def weight_magnitude(model: nn.Module, p: float = 2.0) -> list[torch.Tensor]:
    """Torch-Pruning's magnitude importance of each query head, one `[num_heads]` tensor per site.

    As TP computes it for a head (importance.py `GroupMagnitudeImportance.__call__`: `w.abs().pow(p).sum(1)` per
    output row of q_proj and per input column of o_proj, the layers' scores averaged by `group_reduction="mean"`;
    base_pruner.py: `imp.view(num_heads, -1).mean(1)` per head), a head's score is the mean over its `head_dim`
    channels of the mean over {its row of q_proj, its column of o_proj} of sum |w|^p. With p=2 (TP's LLM example)
    that is the squared L2 norm, not the norm: TP takes no root. GPT-2's fused `c_attn` (`[in, 3 * width]`)
    contributes its query columns, the first `width`. Key/value projections are not scored: under grouped-query
    attention they belong to a group, which `rank_heads(unit="group")` scores as the sum of its query heads.

    TP's example prunes the same ratio in every layer (`global_pruning=False`), which here is
    `select_heads(..., uniform=True)`; its per-layer `normalizer="mean"` then changes no choice, so it is left out.
    """
    scores = []
    for site in attention_sites(model):
        width = site.num_heads * site.head_dim
        query_rows = _output_rows(site.projections[0])[:width]  # fused: [query | key | value], query first
        out_columns = _input_rows(site.out_proj)
        per_channel = (query_rows.float().abs().pow(p).sum(1) + out_columns.float().abs().pow(p).sum(1)) / 2
        scores.append(per_channel.view(site.num_heads, site.head_dim).mean(1).cpu())
    return scores


def _head_output_norms(site: AttentionSite, heads_output: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`[num_heads]` float64: the sum over the real tokens (`mask`, `[batch, seq]` float) of the L2 norm of each
    head's output, `heads_output` being the output projection's input `[..., heads * head_dim]`."""
    heads = heads_output.float().unflatten(-1, (site.num_heads, site.head_dim)).norm(dim=-1)  # [b, s, heads]
    tokens = mask if site.layout.batch_dim == 0 else mask.T
    return (heads * tokens.unsqueeze(-1)).sum(dim=(0, 1)).double().cpu()


@torch.inference_mode()
def activation_norm(
    model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]], progress: bool = True,
) -> list[torch.Tensor]:
    """Minitron's activation importance of each head, one `[num_heads]` tensor per site: the mean, over every
    calibration token that is not padding (`attention_mask` 1), of the L2 norm of the head's output, read where
    it enters the output projection (`[..., heads * head_dim]`, head-major).

    The paper's head score is sum_{B,S} ||Attn(X W_Q^i, X W_K^i, X W_V^i)||_2, the sum over batch and sequence of
    each token's head-output norm; dividing by the number of tokens (the same for every head) changes no
    ranking and makes scores from different calibration sets comparable. The paper's aggregation study prefers
    the mean over the sequence and the L2 norm over the batch, as ModelOpt's code does (megatron.py
    `_linear_proj_forward_hook`: `input.abs().mean(dim=0)` over the sequence per channel, squares summed over the
    batch, then `_estimate_all_head_importance` takes the L2 norm of each head's channels); that mixes channels
    across tokens before the norm, and with padding it would need a per-example token count. The per-token norm
    kept here is the paper's formula, and padding is excluded from it exactly.
    """
    sites = attention_sites(model)
    if any(site.kind == CROSS for site in sites):
        raise ValueError("activation_norm reads one token sequence per example: encoder-decoder models (whose "
                         "decoder sites see the target, not the input) are not supported")
    device = next(model.parameters()).device
    totals = [torch.zeros(site.num_heads, dtype=torch.float64) for site in sites]
    mask: torch.Tensor | None = None  # the current batch's `[batch, seq]` token mask, read by the hooks

    def accumulate(index: int):
        def hook(_module: nn.Module, args: tuple) -> None:
            totals[index] += _head_output_norms(sites[index], args[0], mask)

        return hook

    was_training = model.training
    model.eval()
    handles = [site.out_proj.register_forward_pre_hook(accumulate(i)) for i, site in enumerate(sites)]
    tokens_seen = 0
    try:
        for batch in tqdm(batches, desc="activation norm", disable=not progress, leave=False):
            inputs = {k: batch[k].to(device) for k in MODEL_INPUTS if k in batch}
            if "attention_mask" not in inputs:
                inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
            mask = inputs["attention_mask"].float()
            model(**inputs)
            tokens_seen += int(inputs["attention_mask"].sum())
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    if not tokens_seen:
        raise ValueError("activation_norm got no tokens: the calibration data is empty")
    return [(total / tokens_seen).float() for total in totals]


def layerwise_activation_norm(lm: LayerwiseModel, batches: Sequence[Mapping[str, torch.Tensor]],
                               progress: bool = True) -> list[torch.Tensor]:
    """`activation_norm` with one decoder layer on the device at a time (pipeline/core/layerwise.py): a forward
    pass only, each site's sums taken while its layer runs on each batch, in the same order; the same scores."""
    sites = lm.sites  # decoder-only: every site reads the batch's token sequence
    totals = [torch.zeros(site.num_heads, dtype=torch.float64) for site in sites]
    masks = [batch.get("attention_mask", torch.ones_like(batch["input_ids"])).float().to(lm.device)
             for batch in batches]

    @contextmanager
    def watch(layer: int, b: int) -> Iterator[None]:
        def hook(index: int):
            def accumulate(_module: nn.Module, args: tuple) -> None:  # a pre-hook: returning None keeps the input
                totals[index] += _head_output_norms(sites[index], args[0], masks[b])

            return accumulate

        handles = [sites[i].out_proj.register_forward_pre_hook(hook(i)) for i in lm.sites_of(layer)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    tokens_seen = sum(int(mask.sum()) for mask in masks)
    if not tokens_seen:
        raise ValueError("activation_norm got no tokens: the calibration data is empty")
    inputs = [{k: batch[k] for k in MODEL_INPUTS if k in batch} for batch in batches]
    carry_forward(lm, inputs, keep=False, watch=watch, progress=progress)
    return [(total / tokens_seen).float() for total in totals]


def head_scores(criterion: str, model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]]) -> list[torch.Tensor]:
    """The scores of one of `HEAD_CRITERIA` (`batches`: the calibration data, which magnitude ignores)."""
    if criterion == MAGNITUDE:
        return weight_magnitude(model)
    if criterion == ACTIVATION:
        return activation_norm(model, batches, progress=False)
    if criterion == PAPER_IMPORTANCE:  # the paper's own estimator, beside a score stage set otherwise
        return head_importance(model, batches, progress=False)
    raise ValueError(f"unknown head criterion {criterion!r}; choose one of {', '.join(HEAD_CRITERIA)}")
