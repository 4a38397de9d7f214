"""The cost model of budgeted pruning (pipeline/methods/budgeted.py): what a model costs, split into what each
attention head and FFN neuron adds to a fixed part no unit accounts for (`UnitCosts`), in FLOPs counted on a probe
input (`flop_costs`, exact: FLOPs are linear in the units) or in seconds fitted to a latency table measured on this
machine (pipeline/methods/budgeted_latency.py, the one part that runs the timer). The budget the search keeps to is
a fraction of this cost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from pipeline.core.flops import module_flops
from pipeline.core.sites import attention_sites, ffn_sites


@dataclass(frozen=True)
class UnitCosts:
    """What the model costs, split into its units: total = fixed + the cost of every present unit.

    `head[i]` is the cost of one head of attention site i and `neuron[j]` of one neuron of FFN site j, in
    `unit` (FLOPs, or seconds); `head_counts` and `neuron_counts` are the units present when measured.
    FLOPs are linear in the units, so for them the split is exact.
    """

    head: list[float]
    neuron: list[float]
    head_counts: list[int]
    neuron_counts: list[int]
    total: float
    unit: str

    def cost(self, heads_kept: Sequence[int], neurons_kept: Sequence[int]) -> float:
        """The modelled cost of the model keeping `heads_kept[i]` heads and `neurons_kept[j]` neurons."""
        return self.fixed + (sum(c * n for c, n in zip(self.head, heads_kept, strict=True))
                             + sum(c * n for c, n in zip(self.neuron, neurons_kept, strict=True)))

    @property
    def fixed(self) -> float:
        """The part no head or neuron accounts for (embeddings, layer norms, the task head)."""
        return self.total - (sum(c * n for c, n in zip(self.head, self.head_counts, strict=True))
                             + sum(c * n for c, n in zip(self.neuron, self.neuron_counts, strict=True)))


def _unit_costs(costs: UnitCosts, units: Sequence[Sequence[Sequence[int]]]) -> UnitCosts:
    """`costs` with each site's attention units in place of its heads (a unit of n heads costs n heads)."""
    size = [len(site_units[0]) if site_units else 0 for site_units in units]
    return UnitCosts([c * n for c, n in zip(costs.head, size, strict=True)], costs.neuron,
                     [len(site_units) for site_units in units], costs.neuron_counts, costs.total, costs.unit)


def flop_costs(model: nn.Module, probe: Mapping[str, torch.Tensor]) -> UnitCosts:
    """FLOPs of one forward pass on `probe` (`pipeline.core.flops`, the count behind every FLOP figure in the
    reports), split into units: every product inside an attention site or an FFN grows linearly with its
    heads or neurons, so a site's FLOPs divided by its units is the cost of one unit."""
    flops = module_flops(model, probe)
    names = {id(module): name for name, module in model.named_modules()}

    def inside(*modules: nn.Module) -> int:
        # Count each module once: the output projection may sit inside the attention module or beside it.
        outer = [names[id(m)] for m in modules]
        kept = [n for n in outer if not any(n.startswith(o + ".") for o in outer if o != n)]
        return sum(flops.get(n, 0) for n in kept)

    sites, ffns = attention_sites(model), ffn_sites(model)
    head = [inside(s.module, s.out_proj) / s.num_heads if s.num_heads else 0.0 for s in sites]
    neuron = [inside(f.fc_in, f.fc_out) / f.num_neurons if f.num_neurons else 0.0 for f in ffns]
    return UnitCosts(head, neuron, [s.num_heads for s in sites], [f.num_neurons for f in ffns],
                     float(flops[""]), "FLOPs")
