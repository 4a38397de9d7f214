"""Costs in seconds for budgeted pruning (pipeline/methods/budgeted_costs.py's `UnitCosts`): a latency table
measured on this machine (`latency_table`, timed by pipeline/core/timer.py) and the per-unit seconds fitted to it
(`latency_costs`, Kwon's lookup tables). Apart from the FLOP costs so that only the stages that time something run
the timer.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from pipeline.core.sites import attention_sites, ffn_sites
from pipeline.core.surgery import prune_heads, prune_neurons
from pipeline.core.timer import median_times
from pipeline.methods.budgeted_costs import UnitCosts


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
