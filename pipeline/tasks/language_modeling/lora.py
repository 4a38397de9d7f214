"""LoRA adapters on a (pruned) model's attention and FFN linears, through peft, merged back when training ends.

LLM-Pruner recovers a pruned LLM with LoRA: the base weights stay frozen and each adapted linear `W` learns a
low-rank update `B A` (`A` random, `B` zero, so training starts from the pruned model itself). Merging writes
`W + alpha / rank * B A` into `W` and puts the original linear back, so what comes out is the same module objects
with the same pruned shapes and attributes (`kept_heads` on the attention modules, `kept_neurons` on the FFN's
input linears), which `pipeline.core.checkpoint.save_model` records and `load_model` rebuilds.

The adapted linears come from the project's site table (`pipeline.core.sites`), so every family it prunes is
covered, whatever it names them: Llama's q/k/v/o_proj and gate/up/down_proj, OPT's fc1/fc2, GPT-2's fused
Conv1D c_attn, ... Pruning leaves each layer its own widths, and peft sizes every adapter from its linear.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn
from transformers.pytorch_utils import Conv1D

from pipeline.core.sites import attention_sites, ffn_sites


def _width(layer: nn.Module) -> tuple[int, int]:
    """(inputs, outputs) of an nn.Linear or of GPT-2's Conv1D, whose weight is stored `[in, out]`."""
    rows, columns = layer.weight.shape
    return (rows, columns) if isinstance(layer, Conv1D) else (columns, rows)


def lora_target_names(model: nn.Module) -> list[str]:
    """Module names of the linears LoRA adapts, in model order: every attention site's query, key, value and
    output projections and every FFN site's linears. Linears that pruning left zero wide (an emptied layer) are
    left out: an adapter there could only ever add zero."""
    names = {id(module): name for name, module in model.named_modules()}
    linears: list[nn.Module] = []
    for site in attention_sites(model):
        linears += [*site.projections, site.out_proj]
    for site in ffn_sites(model):
        linears += [*site.inputs, site.fc_out]
    targets = [names[id(layer)] for layer in linears if 0 not in _width(layer)]
    return list(dict.fromkeys(targets))  # GPT-2's fused c_attn is the query, key and value projection at once


@contextmanager
def lora_adapters(model: nn.Module, rank: int, alpha: float, dropout: float, seed: int) -> Iterator[PeftModel]:
    """`model` with LoRA adapters of `rank` on `lora_target_names`, only they trainable, as a PeftModel to
    train. On leaving the block the adapters are merged into `model`'s weights and removed, and every
    parameter's requires_grad is as it was (peft froze the base), so `model` is a plain model again; if the
    block raises, the adapters are removed unmerged, leaving the weights as they were.

    `seed` draws the adapters' `A` matrices, so the same seed gives the same training."""
    requires_grad = [(param, param.requires_grad) for param in model.parameters()]
    targets = lora_target_names(model)
    if not targets:
        raise ValueError("LoRA has nothing to adapt: pruning emptied every attention and FFN linear")
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=targets,
        bias="none",
        # Conv1D's weight is the transpose of nn.Linear's; peft must be told, or its merge adds B A transposed.
        fan_in_fan_out=isinstance(model.get_submodule(targets[0]), Conv1D),
    )
    torch.manual_seed(seed)
    adapted = get_peft_model(model, config)
    try:
        yield adapted
    except BaseException:
        adapted.unload()
        raise
    else:
        adapted.merge_and_unload()
    finally:
        for param, flag in requires_grad:
            param.requires_grad_(flag)
