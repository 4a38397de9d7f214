"""Which heads and MLP channels go, given each unit's score and cost and the share of the cost to remove.

The costs are the budgeted machinery's `UnitCosts` (pipeline/methods/budgeted_costs.py), in one of three currencies
(`unit_costs`): the non-embedding parameters, the FLOPs of a forward pass (`flop_costs`), or the KV-cache bytes per
token. A query head's cost includes its share of its key/value head, which goes with the group's last query head.

Three allocations, each a published method's:

- `kwon_search`: global (each layer its own width), Kwon et al.'s search over every split of the budget between
  attention and MLP, the most important units that fit (`pipeline.methods.budgeted_search.search`);
- `global_threshold`: global, FLAP's single threshold over attention and MLP scores together ("AL-AM"), keeping
  the best units, cost-weighted, until the budget is spent;
- `uniform`: every layer (of `layers`) loses the same share r of its attention units, rounded down, and of its MLP
  channels (Wanda-sp's and LLM-Pruner's `pruning_ratio`, Minitron's and Torch-Pruning's one target width), r the
  smallest that removes the budget. Its result is one shape in every layer: a stock Hugging Face folder.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from pipeline.core.flops import non_embedding_parameters
from pipeline.core.sites import attention_sites, ffn_sites
from pipeline.files.schema import WIDTH_BUDGETS
from pipeline.methods.budgeted_costs import UnitCosts, _unit_costs, flop_costs
from pipeline.methods.budgeted_search import BudgetError, Selection, head_units, search
from pipeline.methods.width.criteria import UnitScores

PARAMETERS, FLOPS, KV_BYTES = WIDTH_BUDGETS
KWON, THRESHOLD, UNIFORM = "kwon-search", "threshold", "uniform"
ALLOCATIONS = (KWON, THRESHOLD, UNIFORM)


def unit_costs(model: nn.Module, budget: str, unit: str, probe: Mapping[str, torch.Tensor] | None = None,
               kv_bytes: int = 2) -> UnitCosts:
    """What one query head and one MLP channel cost in `budget`. A head removed in whole key/value groups (`unit`
    "group", or multi-head attention) costs its share of its key/value head too; removed in query slices, it costs
    only its own weights, and the key/value head that goes with a group's last slice is removed on top, so a
    selection never removes less than its budget."""
    sites, ffns = attention_sites(model), ffn_sites(model)
    heads, neurons = [s.num_heads for s in sites], [f.num_neurons for f in ffns]
    with_kv = [unit == "group" or s.original_group_size == 1 for s in sites]
    if budget == FLOPS:
        if probe is None:
            raise ValueError("a FLOPs budget needs a probe batch to count them on")
        costs = flop_costs(model, probe)
        # Query slices leave the key/value projections running: their share (by weights) is not counted, which
        # undercounts a head's attention scores too, so a selection still never removes less than its budget.
        share = [1.0 if kv else (s.projections[0].weight.numel() + s.out_proj.weight.numel()) / sum(
            lin.weight.numel() for lin in (*s.projections, s.out_proj)) for s, kv in zip(sites, with_kv, strict=True)]
        return UnitCosts([c * f for c, f in zip(costs.head, share, strict=True)], costs.neuron, costs.head_counts,
                         costs.neuron_counts, costs.total, costs.unit)
    if budget == KV_BYTES:
        if not all(with_kv):
            raise BudgetError("a KV-cache budget removes key/value heads, which query slices keep: prune whole "
                              "groups (prune.unit: group)")
        per_head = [2 * s.head_dim * kv_bytes * s.num_kv_heads / s.num_heads for s in sites]
        total = sum(c * n for c, n in zip(per_head, heads, strict=True))
        return UnitCosts(per_head, [0.0] * len(ffns), heads, neurons, total, "KV-cache bytes per token")
    if budget != PARAMETERS:
        raise ValueError(f"unknown budget {budget!r}; choose one of {', '.join(WIDTH_BUDGETS)}")
    per_head = []
    for s, kv in zip(sites, with_kv, strict=True):
        q, k, v = s.projections
        query = (q.weight.numel() + s.out_proj.weight.numel()) / s.num_heads
        per_head.append(query + (k.weight.numel() + v.weight.numel()) / s.num_heads * kv)
    per_neuron = [sum(lin.weight.numel() for lin in (*f.inputs, f.fc_out)) / f.num_neurons for f in ffns]
    return UnitCosts(per_head, per_neuron, heads, neurons, float(non_embedding_parameters(model)), "parameters")


def _unit_scores(scores: UnitScores, units: Sequence[Sequence[Sequence[int]]]) -> list[torch.Tensor]:
    reduce = torch.sum if scores.unit_reduce == "sum" else torch.mean
    return [torch.stack([reduce(s[u]) for u in site_units]) if site_units else s[:0]
            for s, site_units in zip(scores.heads, units, strict=True)]


def _heads_of(kept_units: Sequence[Sequence[int]], units: Sequence[Sequence[Sequence[int]]]) -> list[list[int]]:
    return [sorted(h for u in kept for h in site_units[u]) for kept, site_units in zip(kept_units, units, strict=True)]


def allocate(model: nn.Module, scores: UnitScores, costs: UnitCosts, remove: float, unit: str, allocation: str,
             layers: range | None = None) -> Selection:
    """The heads (in `unit`s: query slices or whole key/value groups) and MLP channels that stay when `remove` of
    `costs.total` goes, by `allocation`. `layers` limits a uniform allocation to those layers (LLM-Pruner's)."""
    if not 0 < remove < 1:
        raise BudgetError(f"the share to remove must be in (0, 1), got {remove}")
    units = head_units(model, scores.heads, unit)
    unit_scores, per_unit = _unit_scores(scores, units), _unit_costs(costs, units)
    if allocation == KWON:
        chosen = search(unit_scores, scores.neurons, per_unit, 1 - remove)
        return Selection(_heads_of(chosen.heads, units), chosen.neurons)
    if allocation == THRESHOLD:
        return _threshold(unit_scores, scores.neurons, per_unit, remove, units)
    if allocation == UNIFORM:
        return _uniform(unit_scores, scores.neurons, per_unit, remove, units, layers)
    raise ValueError(f"unknown allocation {allocation!r}; choose one of {', '.join(ALLOCATIONS)}")


def _threshold(unit_scores: list[torch.Tensor], neuron_scores: list[torch.Tensor], costs: UnitCosts, remove: float,
               units: Sequence[Sequence[Sequence[int]]]) -> Selection:
    """FLAP's one threshold: all units ranked together by score; the least important go, cost-weighted, until at
    least `remove` of the total is gone (FLAP stops nearest the target, either side; here never short of it, so
    every method removes at least as much)."""
    ranked = sorted([(float(s), 0, site, u) for site, t in enumerate(unit_scores) for u, s in enumerate(t)]
                    + [(float(s), 1, site, n) for site, t in enumerate(neuron_scores) for n, s in enumerate(t)])
    target, removed = remove * costs.total, 0.0
    gone: set[tuple[int, int, int]] = set()
    for _, kind, site, index in ranked:
        if removed >= target:
            break
        cost = costs.head[site] if kind == 0 else costs.neuron[site]
        if cost:  # a unit the budget does not count (an MLP channel under a KV-cache budget) stays
            gone.add((kind, site, index))
            removed += cost
    if removed < target:
        raise BudgetError(f"removing {remove:.0%} of the {costs.unit} is out of reach: every unit gone removes "
                          f"{removed / costs.total:.1%}")
    kept_units = [[u for u in range(len(t)) if (0, site, u) not in gone] for site, t in enumerate(unit_scores)]
    kept_neurons = [[n for n in range(len(t)) if (1, site, n) not in gone] for site, t in enumerate(neuron_scores)]
    return Selection(_heads_of(kept_units, units), kept_neurons)


def _uniform(unit_scores: list[torch.Tensor], neuron_scores: list[torch.Tensor], costs: UnitCosts, remove: float,
             units: Sequence[Sequence[Sequence[int]]], layers: range | None) -> Selection:
    """Every layer of `layers` loses the same number of attention units and of MLP channels; within a layer the
    lowest-scoring go. The attention loses the layers' share r of its units, rounded down, r being what the budget
    is of those layers' units; the MLP then loses the fewest channels that complete the budget, as FLAP's
    `cal_remove_neuron` counts them for its uniform structures (so the rounding of heads never overshoots)."""
    pruned_layers = range(len(unit_scores)) if layers is None else layers
    target = remove * costs.total
    head_cost = sum(costs.head[i] for i in pruned_layers)  # one unit from every pruned layer
    neuron_cost = sum(costs.neuron[i] for i in pruned_layers)
    num_units, num_neurons = len(unit_scores[0]), len(neuron_scores[0])
    share = target / (head_cost * num_units + neuron_cost * num_neurons)
    heads = math.floor(share * num_units + 1e-9) if neuron_cost else math.ceil(target / head_cost - 1e-9)
    while True:
        neurons = math.ceil((target - heads * head_cost) / neuron_cost - 1e-9) if neuron_cost else 0
        if neurons <= num_neurons or heads >= num_units - 1:
            break
        heads += 1
    neurons = max(neurons, 0)
    # Every layer keeps one attention unit: a stock config cannot say a layer has no heads.
    if heads > num_units - 1 or neurons > num_neurons or (not neuron_cost and heads * head_cost < target):
        removable = (head_cost * num_units + neuron_cost * num_neurons) / costs.total
        raise BudgetError(f"removing {remove:.0%} of the {costs.unit} uniformly is out of reach: every unit of "
                          f"layers {pruned_layers.start}-{pruned_layers.stop - 1} removes {removable:.1%}")

    def keep_top(scores: torch.Tensor, drop: int) -> list[int]:
        order = sorted(range(len(scores)), key=lambda i: (float(scores[i]), i))
        return sorted(order[drop:])

    kept_units = [keep_top(t, heads if i in pruned_layers else 0) for i, t in enumerate(unit_scores)]
    kept_neurons = [keep_top(t, neurons if i in pruned_layers else 0) for i, t in enumerate(neuron_scores)]
    return Selection(_heads_of(kept_units, units), kept_neurons)
