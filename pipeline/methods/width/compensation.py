"""Retraining-free compensation of a width-pruned model, each saved in a stock folder.

- `bias` (FLAP's, CASIA-IVA-Lab/FLAP lib/prune.py `compress`): what the removed channels fed an output projection on
  average, W[:, removed] @ mean(X[:, removed]) over the calibration tokens, becomes that projection's bias, so the
  layer's mean output is what it was. In memory, where the width sweep evaluates it, any family's output
  projections hold it. A saved folder carries it only where the family's config can say so (`BIAS_CONFIG_KEYS`):
  a Llama folder with `attention_bias` / `mlp_bias` in its config, every other bias those switch on zero. Any other
  family's folder would load without it, so `unsaid_biases` names what would be lost, for the width stage to refuse
  before it saves.
- `refit`: least squares. Layer by layer, in one forward pass of the pruned model over the calibration windows, each
  output projection's kept columns are refitted, just before it runs, so that on the pruned model's own input the
  block gives what the unpruned block gives on that same input: ridge regression towards the current weights W0,
  W = (Y X^T + lambda W0)(X X^T + lambda I)^-1, with lambda = `ridge` times the mean of diag(X X^T). Targets from
  the unpruned model's own trajectory instead (the drift of the inputs absorbed too) fitted the calibration windows
  and did worse on held-out text (docs/width-pruning.md). The folder stays stock: only the weights change.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from pipeline.core.sites import attention_sites, ffn_sites, out_features
from pipeline.files.schema import BIAS_CONFIG_KEYS, COMPENSATIONS, NO_MLP_BLOCK
from pipeline.methods.width.statistics import CalibrationStatistics

NONE, BIAS, REFIT = COMPENSATIONS

Batch = Mapping[str, torch.Tensor]


def _set_bias(layer: nn.Module, value: torch.Tensor | None = None) -> None:
    """Give `layer` (an nn.Linear or GPT-2's Conv1D) a bias (zero unless `value`), added to any it has."""
    bias = torch.zeros(out_features(layer), dtype=layer.weight.dtype, device=layer.weight.device)
    if layer.bias is not None:
        bias = layer.bias.detach().clone()
    if value is not None:
        bias = bias + value.to(bias)
    layer.bias = nn.Parameter(bias, requires_grad=layer.weight.requires_grad)


def _out_in(layer: nn.Module) -> torch.Tensor:
    """A linear's weight as `[out, in]`: GPT-2's Conv1D stores it transposed."""
    return layer.weight if isinstance(layer, nn.Linear) else layer.weight.T


def add_bias_compensation(pruned: nn.Module, dense: nn.Module, stats: CalibrationStatistics) -> None:
    """FLAP's bias, from the unpruned model `dense`'s weights and channel means, into `pruned` (in place), whatever
    its family; its config says so only where it can (`BIAS_CONFIG_KEYS`), so a folder of any other family would
    lose it (`unsaid_biases`)."""
    keys = BIAS_CONFIG_KEYS.get(pruned.config.model_type, ())
    pairs = [(d.out_proj, p.out_proj, p.kept_heads, p.head_dim, s, (*p.projections,))
             for d, p, s in zip(attention_sites(dense), attention_sites(pruned), stats.attention, strict=True)]
    pairs += [(d.fc_out, p.fc_out, p.kept_neurons, 1, s, p.inputs)
              for d, p, s in zip(ffn_sites(dense), ffn_sites(pruned), stats.mlp, strict=True)]
    for dense_out, pruned_out, kept, width, s, inputs in pairs:
        weight = _out_in(dense_out).detach().double().cpu()
        removed = torch.ones(weight.shape[1], dtype=torch.bool)
        for unit in kept:
            removed[unit * width:(unit + 1) * width] = False
        _set_bias(pruned_out, weight[:, removed] @ s.mean[removed])
        if keys:  # the config keys switch these biases on too, so a saved folder must hold them (zero)
            for lin in inputs:
                _set_bias(lin)
    for key in keys:
        setattr(pruned.config, key, True)


def unsaid_biases(model: nn.Module) -> list[str]:
    """The biases of `model` that its family's class, built from its config, does not have: what a saved folder
    would lose on load (FLAP's bias in a family whose config cannot say it)."""
    with torch.device("meta"):  # the parameter names only: nothing allocated
        said = type(model)(model.config).state_dict().keys()
    return [name for name in model.state_dict() if name.endswith(".bias") and name not in said]


def _mlp_block(model: nn.Module, fc_out: nn.Module) -> nn.Module:
    """The module holding an FFN's linears whose forward maps the FFN's input to its output (Llama's `mlp`)."""
    if model.config.model_type in NO_MLP_BLOCK:
        raise ValueError(f"{model.config.model_type}: its FFN linears sit in the decoder layer itself, with no block "
                         f"of their own to refit against; use compensation none or bias")
    names = {module: name for name, module in model.named_modules()}
    return model.get_submodule(names[fc_out].rpartition(".")[0])


def _tokens(x: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """`[tokens, features]` float32: the real (not padding) positions of `[batch, seq, features]`."""
    return x.detach().reshape(-1, x.shape[-1])[real.to(x.device)].float()


def least_squares(x: torch.Tensor, y: torch.Tensor, current: torch.Tensor, ridge: float) -> torch.Tensor:
    """`[out, in]`: the W minimising |x W^T - y|^2 + lambda |W - current|^2, lambda = `ridge` times the mean of
    diag(x^T x); `x` `[tokens, in]`, `y` `[tokens, out]`."""
    with torch.autocast(x.device.type, enabled=False):  # float32 products (not the runtime's bf16)
        gram, moment = (x.T @ x).double(), (x.T @ y).double()
    damping = ridge * gram.diagonal().mean().clamp(min=1e-12)
    gram.diagonal().add_(damping)
    return torch.linalg.solve(gram, moment + damping * current.double().T).T  # a float64 solve


def refit(pruned: nn.Module, dense: nn.Module, batch: Batch, ridge: float = 1e-3) -> nn.Module:
    """Refit the kept columns of every output projection of `pruned` (in place) by ridge least squares, in one
    forward pass over `batch` (every calibration window at once): as each attention and MLP block of `pruned` is
    about to run, the unpruned model's block runs on the same input, and the pruned block's output projection is
    solved to give what it gave. So the fit is on the pruned model's own inputs (the layers below already refitted),
    and its target is the unpruned layer's output on them: only what pruning removed is made up for, not the
    drift of the inputs. The ridge term pulls towards the projection's current weights; a block that lost no unit
    is left as it is."""
    inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask")}
    real = inputs.get("attention_mask", torch.ones_like(inputs["input_ids"])).bool().reshape(-1)
    # A block that lost nothing keeps its weights (the ridge pulls towards them), so it is not solved at all.
    pairs = [(p.module, d.module, p.out_proj) for p, d in zip(attention_sites(pruned), attention_sites(dense),
                                                                strict=True) if 0 < p.num_heads < d.num_heads]
    pairs += [(_mlp_block(pruned, p.fc_out), _mlp_block(dense, d.fc_out), p.fc_out)
              for p, d in zip(ffn_sites(pruned), ffn_sites(dense), strict=True) if 0 < p.num_neurons < d.num_neurons]
    wanted: dict[nn.Module, torch.Tensor] = {}

    def unpruned_output(unpruned_block: nn.Module, projection: nn.Module):
        def pre_hook(_block: nn.Module, args: tuple, kwargs: dict) -> None:
            output = unpruned_block(*args, **kwargs)
            wanted[projection] = _tokens(output[0] if isinstance(output, tuple) else output, real)
        return pre_hook

    def solve(projection: nn.Module, args: tuple) -> None:
        y = wanted.pop(projection)
        if projection.bias is not None:
            y = y - projection.bias.detach().float()
        weight = least_squares(_tokens(args[0], real), y, projection.weight.detach(), ridge)
        projection.weight.data.copy_(weight.to(projection.weight.dtype))

    handles = []
    for block, unpruned_block, projection in pairs:
        handles.append(block.register_forward_pre_hook(unpruned_output(unpruned_block, projection), with_kwargs=True))
        handles.append(projection.register_forward_pre_hook(solve))
    device = next(pruned.parameters()).device
    try:
        with torch.no_grad():  # not inference_mode: the hooks write the parameters
            # No KV cache: the unpruned block runs on the same call's arguments, and would write into it too.
            pruned(**{k: v.to(device) for k, v in inputs.items()}, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return pruned
