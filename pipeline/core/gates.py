"""Gates: a multiplier on each prunable unit's output, with gradients.

Head gates xi_h sit on the input of the attention output projection, where the heads are still
separate (`[..., num_heads * head_dim]`, head-major). Neuron gates sit on the input of a feed-forward
block's second linear, after the activation (`[..., num_neurons]`). Both are forward pre-hooks on a
linear, so they are the same for every attention implementation (sdpa, eager, ...) and every family
in `pipeline.core.sites`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from pipeline.core.placement import input_device
from pipeline.core.sites import AttentionSite, attention_sites, ffn_sites


class Gates(list):
    """One gate tensor per site (attention sites for heads, FFN sites for neurons), read by the hooks at
    every forward.

    Each entry is either 1-D `[units]` (shared by the batch), 2-D `[batch, units]` (one gate per
    example, so a single backward pass gives per-example gate gradients) or 3-D `[batch, positions, units]` (one
    gate per example and position, for batch-first sites: every token's own gradient).
    Replace entries freely (`gates[i] = ...`) or write into them (`gates[i][h] = 0`).
    """

    def per_example(self, batch_size: int) -> list[torch.Tensor]:
        """Swap in fresh `[batch_size, units]` leaf gates of ones that require grad; returns them."""
        for i, gate in enumerate(self):
            self[i] = torch.ones(batch_size, gate.shape[-1], dtype=gate.dtype, device=gate.device, requires_grad=True)
        return list(self)

    def per_position(self, batch_size: int, length: int) -> list[torch.Tensor]:
        """Swap in fresh `[batch_size, length, units]` leaf gates of ones that require grad; returns them. Only for
        batch-first sites (`batch_dim` 0), whose gated input is `[batch, positions, ...]`."""
        for i, gate in enumerate(self):
            self[i] = torch.ones(batch_size, length, gate.shape[-1], dtype=gate.dtype, device=gate.device,
                                 requires_grad=True)
        return list(self)


def gate_grad(gate: torch.Tensor) -> torch.Tensor:
    """A gate's gradient after a backward pass: zeros for a site with no units left, whose hook has nothing to
    gate, so that the gate never enters the graph and gets no `.grad`."""
    return gate.grad if gate.grad is not None else torch.zeros_like(gate)


def _gate_input(x: torch.Tensor, gate: torch.Tensor, units: int, batch_dim: int) -> torch.Tensor:
    # Each unit owns a contiguous block of the last dim: head_dim wide for heads, 1 for neurons.
    width = x.shape[-1] // units
    blocks = x.view(*x.shape[:-1], units, width)
    if gate.dim() == 1:
        scale = gate.view(units, 1)
    elif gate.dim() == 3:  # [batch, positions, units]: a batch-first input [batch, positions, units * width]
        if batch_dim != 0:
            raise ValueError("per-position gates need a batch-first site (batch_dim 0)")
        scale = gate.view(*gate.shape, 1)
    else:
        # [batch, units] -> [batch, 1, ..., 1, units, 1] (batch at `batch_dim`) to broadcast over the sequence dims.
        shape = [1] * (x.dim() - 1) + [units, 1]
        shape[batch_dim] = gate.shape[0]
        scale = gate.view(shape)
    # A sharded model's layers run on several devices, its gates live on the input device: the copy is part of the
    # graph, so the gradient still reaches the gate leaf.
    scale = scale.to(x.device)
    # The product in the gate's precision (fp32), so that under half-precision autocast the gate's gradient, a sum
    # over batch and positions, is accumulated in fp32 too; for an fp32 model this is the plain product.
    if scale.dtype != x.dtype:
        return (blocks.to(scale.dtype) * scale).to(x.dtype).view_as(x)
    return (blocks * scale).view_as(x)


@contextmanager
def _gate_inputs(model: nn.Module, targets: Sequence[tuple[nn.Linear, int, int]], requires_grad: bool
                 ) -> Iterator[Gates]:
    """Gate the input of each `(linear, units, batch_dim)` target for the duration of the block."""
    param = next(model.parameters())
    # Gates are at least float32 so their gradients stay precise under a half-precision model. They live where the
    # inputs go (a sharded model's first parameter may be on the "meta" device, its weights offloaded).
    dtype = torch.promote_types(param.dtype, torch.float32)
    device = input_device(model)
    gates = Gates(
        torch.ones(units, dtype=dtype, device=device, requires_grad=requires_grad) for _, units, _ in targets
    )
    handles = []
    for index, (linear, units, batch_dim) in enumerate(targets):

        def hook(_module: nn.Module, args: tuple, index: int = index, units: int = units,
                 batch_dim: int = batch_dim) -> tuple:
            if units == 0:  # a fully pruned site: nothing left to gate
                return args
            return (_gate_input(args[0], gates[index], units, batch_dim), *args[1:])

        handles.append(linear.register_forward_pre_hook(hook))
    try:
        yield gates
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def head_gates(model: nn.Module, requires_grad: bool = False, sites: Sequence[AttentionSite] | None = None
               ) -> Iterator[Gates]:
    """Attach a gate to every head of `model` for the duration of the block.

    Yields a `Gates` list with one all-ones 1-D float tensor per site (in `attention_sites`
    order). With every gate at 1 the outputs are bit-identical to the ungated model; 0 masks a head.
    Leaving the block removes every hook. `sites`: gate only these, which lie inside `model` (one decoder layer
    run on its own, pipeline/core/layerwise.py; the gates take `model`'s device and dtype).
    """
    sites = attention_sites(model) if sites is None else sites
    targets = [(site.out_proj, site.num_heads, site.layout.batch_dim) for site in sites]
    with _gate_inputs(model, targets, requires_grad) as gates:
        yield gates


@contextmanager
def neuron_gates(model: nn.Module, requires_grad: bool = False) -> Iterator[Gates]:
    """Attach a gate to every FFN neuron of `model` for the duration of the block.

    Yields a `Gates` list with one all-ones 1-D float tensor `[num_neurons]` per FFN site (in
    `ffn_sites` order), multiplying the activations that enter the block's second linear. With every
    gate at 1 the outputs are bit-identical to the ungated model; 0 has the effect of removing the
    neuron. Leaving the block removes every hook. Combine with `head_gates` freely.
    """
    targets = [(site.fc_out, site.num_neurons, site.batch_dim) for site in ffn_sites(model)]
    with _gate_inputs(model, targets, requires_grad) as gates:
        yield gates
