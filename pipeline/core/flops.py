"""Analytic FLOP counts, for the ideal speedup that measured speedups are held against.

FLOPs come from `torch.utils.flop_counter`, which derives them from the shapes of the matrix
products a forward pass runs (2 FLOPs per multiply-add), so they follow whatever the model really
is after pruning. It has no formula for PyTorch's fused CPU attention kernel, so the count runs the
model with eager attention, whose score and context products are plain batched matmuls.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


def module_flops(model: nn.Module, inputs: Mapping[str, object]) -> dict[str, int]:
    """FLOPs of one forward pass of `model` on `inputs`, per module: each module's name (as in
    `named_modules`, "" for the whole model) maps to the FLOPs run inside it, its submodules included."""
    device = next(model.parameters()).device
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            # Tensors go to the model's device; other arguments (a KV cache, logits_to_keep) as they are.
            model(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()})
    finally:
        model.set_attn_implementation(previous)
    root = type(model).__name__
    flops = {"": counter.get_total_flops()}
    for name, by_op in counter.get_flop_counts().items():
        if name.startswith(root + "."):
            flops[name.removeprefix(root + ".")] = sum(by_op.values())
    return flops


def forward_flops(model: nn.Module, inputs: Mapping[str, object]) -> int:
    """FLOPs of one forward pass of `model` on `inputs`."""
    return module_flops(model, inputs)[""]


def parameter_count(model: nn.Module) -> int:
    """Distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def non_embedding_parameters(model: nn.Module) -> int:
    """Every parameter but the token embeddings and an untied output head: what LLM pruning tools count when they
    say "20% pruned"."""
    skip = {id(model.get_input_embeddings().weight)}
    head = model.get_output_embeddings()
    if head is not None:
        skip.add(id(head.weight))
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values() if id(p) not in skip)
