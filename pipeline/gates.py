"""Per-head gates xi_h: a multiplier on each head's output, before the attention output projection.

The gate sits on the input of the output projection, where the heads are still separate
(`[..., num_heads * head_dim]`, head-major), so it is the same for every attention implementation
(sdpa, eager, ...) and every family in `pipeline.sites`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from pipeline.sites import attention_sites


class HeadGates(list):
    """One gate tensor per attention site, read by the hooks at every forward.

    Each entry is either 1-D `[num_heads]` (shared by the batch) or 2-D `[batch, num_heads]`
    (one gate per example, so a single backward pass gives per-example gate gradients).
    Replace entries freely (`gates[i] = ...`) or write into them (`gates[i][h] = 0`).
    """

    def per_example(self, batch_size: int) -> list[torch.Tensor]:
        """Swap in fresh `[batch_size, num_heads]` leaf gates of ones that require grad; returns them."""
        for i, gate in enumerate(self):
            self[i] = torch.ones(batch_size, gate.shape[-1], dtype=gate.dtype, device=gate.device, requires_grad=True)
        return list(self)


def _gate_input(x: torch.Tensor, gate: torch.Tensor, num_heads: int, batch_dim: int) -> torch.Tensor:
    head_dim = x.shape[-1] // num_heads
    heads = x.view(*x.shape[:-1], num_heads, head_dim)
    if gate.dim() == 1:
        scale = gate.view(num_heads, 1)
    else:
        # [batch, heads] -> [batch, 1, ..., 1, heads, 1] (batch at `batch_dim`) to broadcast over the sequence dims.
        shape = [1] * (x.dim() - 1) + [num_heads, 1]
        shape[batch_dim] = gate.shape[0]
        scale = gate.view(shape)
    return (heads * scale.to(x.dtype)).view_as(x)


@contextmanager
def head_gates(model: nn.Module, requires_grad: bool = False) -> Iterator[HeadGates]:
    """Attach a gate to every head of `model` for the duration of the block.

    Yields a `HeadGates` list with one all-ones 1-D float tensor per site (in `attention_sites`
    order). With every gate at 1 the outputs are bit-identical to the ungated model; 0 masks a head.
    Leaving the block removes every hook.
    """
    sites = attention_sites(model)
    param = next(model.parameters())
    # Gates are at least float32 so their gradients stay precise under a half-precision model.
    dtype = torch.promote_types(param.dtype, torch.float32)
    gates = HeadGates(
        torch.ones(site.num_heads, dtype=dtype, device=param.device, requires_grad=requires_grad) for site in sites
    )
    handles = []
    for index, site in enumerate(sites):
        num_heads, batch_dim = site.num_heads, site.layout.batch_dim

        def hook(_module: nn.Module, args: tuple, index: int = index, num_heads: int = num_heads,
                 batch_dim: int = batch_dim) -> tuple:
            if num_heads == 0:
                return args
            return (_gate_input(args[0], gates[index], num_heads, batch_dim), *args[1:])

        handles.append(site.out_proj.register_forward_pre_hook(hook))
    try:
        yield gates
    finally:
        for handle in handles:
            handle.remove()
