"""The cost model of budgeted pruning (pipeline/methods/budgeted.py): what a model costs, split into what each
attention head and FFN neuron adds to a fixed part no unit accounts for (`UnitCosts`), in FLOPs counted on a probe
input (`flop_costs`, exact: FLOPs are linear in the units) or in seconds fitted to a latency table measured on this
machine (`latency_table`, timed by pipeline/core/timer.py, and `latency_costs`, Kwon's lookup tables). The budget
the search keeps to is a fraction of this cost.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from pipeline.core.flops import module_flops
from pipeline.core.sites import attention_sites, ffn_sites
from pipeline.core.surgery import prune_heads, prune_neurons
from pipeline.core.timer import median_times


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


def _evenly_pruned(model: nn.Module, heads_per_site: int | None, neurons_per_site: int | None) -> nn.Module:
    """A copy keeping the first `heads_per_site` heads and `neurons_per_site` neurons of every site."""
    pruned = copy.deepcopy(model)
    if heads_per_site is not None:
        prune_heads(pruned, {i: s.kept_heads[heads_per_site:] for i, s in enumerate(attention_sites(pruned))})
    if neurons_per_site is not None:
        prune_neurons(pruned, {i: s.kept_neurons[neurons_per_site:] for i, s in enumerate(ffn_sites(pruned))})
    return pruned


def latency_table(model: nn.Module, inputs: Mapping[str, torch.Tensor], repeats: int = 7, points: int = 5,
                  timer: Callable[[Mapping[str, Callable[[], object]], int], Mapping[str, float]] | None = None
                  ) -> list[dict]:
    """Forward latency on `inputs` with every layer cut to n heads (neurons kept) and to n neurons (heads
    kept), for `points` values of n from the full count down to a quarter of it: one row per measurement,
    with the per-layer counts and the median seconds. Measured on this machine, as Kwon's lookup tables; the
    cut models take turns for `repeats` rounds (`median_times`), so the slope is not the machine's drift."""
    timer = timer or median_times
    device = next(model.parameters()).device  # timed where the model runs, at the caller's autocast precision
    inputs = {k: v.to(device) for k, v in inputs.items()}
    full_heads = attention_sites(model)[0].num_heads
    full_neurons = ffn_sites(model)[0].num_neurons
    cuts: dict[tuple[str, int], nn.Module] = {}
    for kind, full in (("heads", full_heads), ("neurons", full_neurons)):
        for count in np.unique(np.linspace(full, max(1, full // 4), points).round().astype(int))[::-1]:
            count = int(count)
            cuts[kind, count] = _evenly_pruned(model, count if kind == "heads" else None,
                                               count if kind == "neurons" else None)
    with torch.inference_mode():
        seconds = timer({key: (lambda m=cut: m(**inputs)) for key, cut in cuts.items()}, repeats)
    return [dict(units=kind, per_layer=count, seconds=seconds[kind, count]) for kind, count in cuts]


def latency_costs(model: nn.Module, table: Sequence[Mapping]) -> UnitCosts:
    """Per-unit seconds from a `latency_table`: the least-squares slope of latency against the units per layer,
    shared out over the layers. Latency is not quite linear in the units (kernels run in tiles), so the
    budget holds on the fitted line; the benchmark stage measures what it really gives."""
    heads = [site.num_heads for site in attention_sites(model)]
    neurons = [site.num_neurons for site in ffn_sites(model)]
    slopes, totals = {}, []
    for kind in ("heads", "neurons"):
        rows = [r for r in table if r["units"] == kind]
        x = np.array([r["per_layer"] for r in rows], dtype=float)
        y = np.array([r["seconds"] for r in rows], dtype=float)
        if len(rows) < 2 or np.ptp(x) == 0:
            raise ValueError(f"the latency table needs at least two distinct {kind} counts to fit a slope")
        slopes[kind] = max(float(np.polyfit(x, y, 1)[0]), 0.0)
        totals.append(float(y[x.argmax()]))
    return UnitCosts([slopes["heads"] / len(heads)] * len(heads), [slopes["neurons"] / len(neurons)] * len(neurons),
                     heads, neurons, float(np.mean(totals)), "s")
