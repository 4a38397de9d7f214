"""Steps 1 and 2 of budgeted pruning (pipeline/methods/budgeted.py): choose which heads and FFN neurons stay.

1. Choose (`search`): every example's gradient of its loss with respect to every unit's gate (`gate_gradients`)
   gives the Fisher information of each unit, F_u = sum_x (dL(x)/dm_u)^2; the most important heads and neurons
   whose cost (pipeline/methods/budgeted_costs.py) fits the budget stay, trying every split of the budget between
   heads and neurons (Kwon's Algorithm 1, for any per-unit costs).
2. Rearrange (`rearrange`): removing two units together can cost more, or less, than the sum of removing each;
   with per-example gradients a greedy pass keeps each layer's count and picks the set that shrinks the estimated
   loss increase.

With held-out batches, `held_out_choice` picks between candidate selections (rankings, as searched and as
rearranged) by their losses on them (`calibration_losses`). Under grouped-query attention a unit is what
`HeadChoice.unit` removes together (`head_units`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats
from torch import nn
from tqdm.auto import tqdm

from pipeline.core.gates import gate_grad, head_gates, neuron_gates
from pipeline.core.importance import frozen_for_gate_gradients, per_example_loss
from pipeline.core.sites import attention_sites, ffn_sites
from pipeline.methods.budgeted_costs import UnitCosts

Batches = Sequence[Mapping[str, torch.Tensor]]


# --- Fisher information -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class UnitGradients:
    """Per-example gate gradients dL(x)/dm_u: one `[examples, units]` tensor per attention site (heads)
    and per FFN site (neurons), in `attention_sites` / `ffn_sites` order."""

    heads: list[torch.Tensor]
    neurons: list[torch.Tensor]

    def fisher(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The empirical Fisher information's diagonal: the sum over examples of the squared gradients."""
        return [g.pow(2).sum(0) for g in self.heads], [g.pow(2).sum(0) for g in self.neurons]


def gate_gradients(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]], progress: bool = True
                   ) -> UnitGradients:
    """Every example's gradient of its loss with respect to every head's and neuron's gate, from one forward
    and one backward pass per batch (per-example gates; the parameters' gradients are never computed)."""
    device = next(model.parameters()).device
    heads: list[list[torch.Tensor]] = []
    neurons: list[list[torch.Tensor]] = []
    with frozen_for_gate_gradients(model), head_gates(model) as h_gates, neuron_gates(model) as n_gates:
        for batch in tqdm(batches, desc="fisher", disable=not progress, leave=False):
            batch = {k: v.to(device) for k, v in batch.items()}
            size = batch["labels"].shape[0]
            h_leaves, n_leaves = h_gates.per_example(size), n_gates.per_example(size)
            per_example_loss(model, batch).sum().backward()
            heads.append([gate_grad(leaf).detach().cpu() for leaf in h_leaves])
            neurons.append([gate_grad(leaf).detach().cpu() for leaf in n_leaves])
    if not heads:
        raise ValueError("gate_gradients got no batches: the Fisher sample is empty")
    return UnitGradients([torch.cat(site) for site in zip(*heads, strict=True)],
                         [torch.cat(site) for site in zip(*neurons, strict=True)])


def head_units(model: nn.Module, head_fisher: Sequence[torch.Tensor], unit: str) -> list[list[list[int]]]:
    """Per attention site, the sets of head positions that go together: single heads under multi-head
    attention; under grouped-query attention whole groups (unit "group") or, for unit "query", slices made of
    the k-th least important head (by `head_fisher`) of every group, so that any number of slices leaves the
    groups equal."""
    units = []
    for site, fisher in zip(attention_sites(model), head_fisher, strict=True):
        groups = site.head_groups
        if unit == "group" or site.original_group_size == 1:  # whole groups; multi-head: single heads
            units.append(groups)
            continue
        by_group = [sorted(group, key=lambda h: (float(fisher[h]), h)) for group in groups]
        units.append([sorted(g[k] for g in by_group) for k in range(len(by_group[0]))])
    return units


def _unit_gradients(gradients: UnitGradients, units: Sequence[Sequence[Sequence[int]]]) -> UnitGradients:
    """The per-example gradient of one gate shared by each unit's heads: the sum of theirs."""
    heads = [torch.stack([g[:, unit].sum(1) for unit in site_units], dim=1) if site_units else g[:, :0]
             for g, site_units in zip(gradients.heads, units, strict=True)]
    return UnitGradients(heads, gradients.neurons)


# --- search and rearrangement ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Selection:
    """The units a pruned model keeps: positions of the present heads per attention site, and of the
    present neurons per FFN site."""

    heads: list[list[int]]
    neurons: list[list[int]]

    def plans(self, model: nn.Module) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
        """The `prune_heads` and `prune_neurons` plans (original indices of the units that go)."""
        head_plan = {i: [h for p, h in enumerate(site.kept_heads) if p not in set(keep)]
                     for i, (site, keep) in enumerate(zip(attention_sites(model), self.heads, strict=True))}
        neuron_plan = {i: [n for p, n in enumerate(site.kept_neurons) if p not in set(keep)]
                       for i, (site, keep) in enumerate(zip(ffn_sites(model), self.neurons, strict=True))}
        return head_plan, neuron_plan

    @property
    def counts(self) -> tuple[list[int], list[int]]:
        return [len(h) for h in self.heads], [len(n) for n in self.neurons]


class BudgetError(ValueError):
    pass


def _ranked(scores: Sequence[torch.Tensor], costs: Sequence[float]) -> tuple[list[tuple[int, int]], np.ndarray,
                                                                             np.ndarray]:
    """Units most important first (ties in model order), with the running sums of importance and cost."""
    units = [(float(s), site, u) for site, t in enumerate(scores) for u, s in enumerate(t)]
    units.sort(key=lambda item: -item[0])
    importance = np.concatenate([[0.0], np.cumsum([s for s, _, _ in units])])
    cost = np.concatenate([[0.0], np.cumsum([costs[site] for _, site, _ in units])])
    return [(site, u) for _, site, u in units], importance, cost


def _group(chosen: Iterable[tuple[int, int]], sizes: Sequence[int]) -> list[list[int]]:
    grouped: list[list[int]] = [[] for _ in sizes]
    for site, unit in chosen:
        grouped[site].append(unit)
    return [sorted(g) for g in grouped]


def per_layer_normalised(scores: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Each site's scores divided by their L2 norm, as the paper normalises its head importance per layer. Fisher
    information shrinks by orders of magnitude from the first layers to the last (the gradients reaching a gate
    are smaller the nearer the loss), so ranked raw across layers it empties the last layers first."""
    return [t / norm if (norm := t.norm()) > 0 else t for t in scores]


def neuron_blocks(neuron_fisher: Sequence[torch.Tensor], multiple: int) -> list[list[list[int]]]:
    """Per FFN site, its neurons most important first (ties in index order), cut into blocks of `multiple`: the
    units the search keeps or drops whole, so that every kept width is a multiple of `multiple` or the full width
    (`pipeline.methods.widths`). Blocks of one are single neurons."""
    blocks = []
    for fisher in neuron_fisher:
        order = sorted(range(len(fisher)), key=lambda n: (-float(fisher[n]), n))
        blocks.append([order[start:start + multiple] for start in range(0, len(order), multiple)])
    return blocks


def search(head_fisher: Sequence[torch.Tensor], neuron_fisher: Sequence[torch.Tensor], costs: UnitCosts,
           keep: float, prune_neurons: bool = True, neuron_multiple: int = 1) -> Selection:
    """The most important heads and neurons whose cost is at most `keep` times the unpruned model's.

    For every number k of heads kept (the k most important), the rest of the budget takes the most important
    neurons that fit; the k with the largest total importance wins. Neurons go in each layer's blocks of
    `neuron_multiple` (`neuron_blocks`), a block's importance the sum of its neurons'. With `prune_neurons=False`
    every neuron stays and the heads get what is left. Raises `BudgetError` when no selection fits.
    """
    if not 0 < keep <= 1:
        raise BudgetError(f"the fraction of the cost to keep must be in (0, 1], got {keep}")
    head_sizes, neuron_sizes = [len(t) for t in head_fisher], [len(t) for t in neuron_fisher]
    all_neurons = [list(range(n)) for n in neuron_sizes]
    # What the units may cost: the budget minus the part of the model no unit accounts for.
    budget = keep * costs.total - costs.fixed
    heads, head_importance, head_cost = _ranked(head_fisher, costs.head)
    slack = 1e-9 * costs.total  # float noise in the costs must not drop a unit at an exactly met budget
    if not prune_neurons:
        room = budget - sum(c * n for c, n in zip(costs.neuron, neuron_sizes, strict=True))
        if room < -slack:
            floor = costs.cost([0] * len(head_sizes), neuron_sizes) / costs.total
            raise BudgetError(f"keeping {keep:.0%} of the {costs.unit} is out of reach by pruning heads alone: "
                              f"with every head gone the model still costs {floor:.1%}")
        k = int(np.searchsorted(head_cost, room + slack, side="right")) - 1
        return Selection(_group(heads[:k], head_sizes), all_neurons)
    # Blocks in ranked order: a layer's blocks fall in importance, so a sort keeps each layer's in its order.
    site_blocks = neuron_blocks(neuron_fisher, neuron_multiple)
    blocks = sorted(((float(neuron_fisher[site][block].sum()), site, index, block)
                     for site, layer in enumerate(site_blocks) for index, block in enumerate(layer)),
                    key=lambda item: (-item[0], item[1], item[2]))
    neuron_importance = np.concatenate([[0.0], np.cumsum([score for score, *_ in blocks])])
    neuron_cost = np.concatenate([[0.0], np.cumsum([costs.neuron[site] * len(block) for _, site, _, block in blocks])])
    best = None
    for k in range(len(heads) + 1):
        room = budget - head_cost[k]
        if room < -slack:
            break
        j = int(np.searchsorted(neuron_cost, room + slack, side="right")) - 1
        total = head_importance[k] + neuron_importance[j]
        if best is None or total > best[0]:
            best = (total, k, j)
    if best is None:
        raise BudgetError(f"keeping {keep:.0%} of the {costs.unit} is out of reach: the units no pruning "
                          f"removes already cost more")
    _, k, j = best
    kept_neurons = [(site, n) for _, site, _, block in blocks[:j] for n in block]
    return Selection(_group(heads[:k], head_sizes), _group(kept_neurons, neuron_sizes))


def rearrange_site(kept: Sequence[int], gradients: torch.Tensor) -> list[int]:
    """Re-pick which of one site's units to keep, keeping their number, so that the removed units'
    summed per-example gradients are as small as possible (Kwon's greedy mask rearrangement).

    `gradients` is `[examples, units]`. Starting from the units with the smallest Fisher diagonal, each
    remaining unit in turn joins the removed set, and the member whose departure leaves the smallest
    ||sum of the removed gradients||^2 leaves it. Works on the Gram matrix, O(units) per step.
    """
    units = gradients.shape[1]
    removed_count = units - len(kept)
    if removed_count == 0 or len(kept) == 0:
        return sorted(kept)
    g = gradients.to(torch.float64)
    gram = g.T @ g
    diag = gram.diagonal().clone()
    order = torch.argsort(diag, stable=True).tolist()
    removed = order[:removed_count]
    # inner[i] = g_i . (sum of the removed gradients), summed over examples.
    inner = gram[:, removed].sum(dim=1)
    for unit in order[removed_count:]:
        removed.append(unit)
        inner += gram[:, unit]
        candidates = torch.tensor(removed)
        # ||S - g_i||^2 = ||S||^2 - 2 g_i.S + ||g_i||^2: the best to let go maximises 2 g_i.S - ||g_i||^2.
        leaving = removed.pop(int(torch.argmax(2 * inner[candidates] - diag[candidates])))
        inner -= gram[:, leaving]
    return sorted(set(range(units)) - set(removed))


def rearrange(selection: Selection, gradients: UnitGradients) -> Selection:
    return Selection([rearrange_site(k, g) for k, g in zip(selection.heads, gradients.heads, strict=True)],
                     [rearrange_site(k, g) for k, g in zip(selection.neurons, gradients.neurons, strict=True)])


def calibration_losses(model: nn.Module, batches: Batches) -> torch.Tensor:
    """The loss of `model` on each example of `batches`, as one float64 vector."""
    device = next(model.parameters()).device
    with torch.inference_mode():
        return torch.cat([per_example_loss(model, {k: v.to(device) for k, v in batch.items()}).double().cpu()
                          for batch in batches])


def calibration_loss(model: nn.Module, batches: Batches) -> float:
    """The mean loss of `model` on `batches`, every example weighing the same."""
    return float(calibration_losses(model, batches).mean())


# A head ranking other than the reference replaces it only when a one-sided paired t-test over the held-out
# examples' losses says it is better at this family-wise level (Bonferroni over the alternatives). On the
# classification tasks the rankings' held-out losses differ by one or two examples' worth, and following the
# lowest loss fell below the paper's order on 4 of 9 levels; on the language model a Fisher ranking is better
# by hundreds of standard errors (README).
SWITCH_SIGNIFICANCE = 0.05


@dataclass(frozen=True)
class Candidate:
    """A selection of heads, named by how it was made (the ranking, and whether it was rearranged)."""

    name: str
    selection: Selection


def held_out_choice(reference: Sequence[Candidate], alternatives: Sequence[Candidate],
                    losses: Callable[[Selection], torch.Tensor],
                    significance: float = SWITCH_SIGNIFICANCE) -> Candidate:
    """The reference candidate with the lowest mean of `losses` (per held-out example), unless some
    alternatives' are significantly lower (`SWITCH_SIGNIFICANCE`): then the lowest of those. Ties go to the
    earlier candidate; equal selections are measured once."""
    measured: dict[str, torch.Tensor] = {}

    def loss_of(candidate: Candidate) -> torch.Tensor:
        key = repr((candidate.selection.heads, candidate.selection.neurons))
        if key not in measured:
            measured[key] = losses(candidate.selection)
        return measured[key]

    def significantly_lower(losses: torch.Tensor, base: torch.Tensor) -> bool:
        difference = losses - base
        if not bool((difference != difference[0]).any()):  # no spread, so no t statistic: the sign decides
            return bool(difference[0] < 0)
        return stats.ttest_rel(losses.numpy(), base.numpy(), alternative="less").pvalue < significance / len(
            alternatives)

    best = min(reference, key=lambda c: float(loss_of(c).mean()))
    better = [c for c in alternatives if significantly_lower(loss_of(c), loss_of(best))]
    return min(better, key=lambda c: float(loss_of(c).mean())) if better else best
