"""Budgeted pruning of attention heads and FFN neurons with no retraining (Kwon et al., 2022, "A Fast
Post-Training Pruning Framework for Transformers"), on the project's own gates instead of `head_mask`.

Given a budget, the fraction of the model's cost to keep (FLOPs, or seconds from a latency table measured
on this machine), three steps decide what stays, each far cheaper than retraining:

1. **Choose** (`search`): the Fisher importance of each unit's gate, F_u = sum_x (dL(x)/dm_u)^2 over a sample
   of training data. Keep the most important heads and neurons whose cost fits the budget, trying every
   split of the budget between heads and neurons (Kwon's Algorithm 1, for any per-unit costs).
2. **Rearrange** (`rearrange`): the Fisher diagonal ignores that removing two units together can cost more,
   or less, than the sum of removing each. With per-example gradients the loss increase of removing a set
   S is about 1/2 sum_x (sum_{u in S} g_u(x))^2; a greedy pass keeps each layer's count and picks the set
   that shrinks it.
3. **Tune** (`tune`): layer by layer, rescale the kept units so that the pruned layer reproduces the
   unpruned layer's output, residual included, on the sample: a linear least-squares problem per layer.
   The scales are folded into the output projections, so the result is an ordinary physically pruned
   model that `pipeline.core.checkpoint.save_model` writes like every other.

Under grouped-query attention the attention's units are not single heads but what `HeadChoice.unit` removes
together (`head_units`): whole key/value groups, or slices of one query head from every group. A unit's
gradient is the sum of its heads' (the gradient of one gate shared by the unit), so its Fisher information,
the rearrangement and the costs all follow; every selection is then a valid GQA shape.

This module runs the steps (`budgeted_prune`); each lives in a module of its own:

    budgeted_costs.py    the cost model: per-unit FLOPs, or seconds fitted to a latency table (`UnitCosts`)
    budgeted_search.py   steps 1 and 2: Fisher gradients, the search, the rearrangement, the held-out choice
    budgeted_tuning.py   step 3: the least-squares tuning
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from pipeline.core.importance import PAPER_CHOICE, HeadChoice
from pipeline.core.surgery import prune_heads, prune_neurons
from pipeline.files.schema import BUDGETED_HEADS, BUDGETED_METHODS, BUDGETED_TUNED
from pipeline.methods.budgeted_costs import UnitCosts, _unit_costs
from pipeline.methods.budgeted_search import (
    Batches,
    Candidate,
    Selection,
    UnitGradients,
    _unit_gradients,
    calibration_loss,
    calibration_losses,
    head_units,
    held_out_choice,
    per_layer_normalised,
    rearrange,
    search,
)
from pipeline.methods.budgeted_tuning import tune


@dataclass
class BudgetedPrune:
    """One budgeted prune: the pruned model, what it keeps, and the seconds each step took."""

    model: nn.Module
    selection: Selection
    seconds: dict[str, float]
    tuned: bool = False  # budgeted-tuned: whether the model kept its least-squares scales
    heads_from: str = "fisher, rearranged"  # the candidate the heads came from (`held_out_choice`)


def pruned_model(model: nn.Module, selection: Selection) -> nn.Module:
    """A physically pruned copy of `model` that keeps `selection`'s heads and neurons."""
    head_plan, neuron_plan = selection.plans(model)
    return prune_neurons(prune_heads(copy.deepcopy(model), head_plan), neuron_plan).eval()


def budgeted_prune(model: nn.Module, gradients: UnitGradients, costs: UnitCosts, keep: float, method: str,
                   tune_batches: Batches | None = None, first_token_last_layer: bool = False,
                   progress: bool = False, choice: HeadChoice = PAPER_CHOICE, calibration: Batches = (),
                   head_importance: Sequence[torch.Tensor] | None = None, neuron_multiple: int = 1) -> BudgetedPrune:
    """Prune a copy of `model` to `keep` of its cost with one of `BUDGETED_METHODS`:

    - `budgeted-heads`: heads only, ranked and rearranged;
    - `budgeted`: heads and FFN neurons jointly, chosen by Fisher information (Kwon's search) and rearranged;
    - `budgeted-tuned`: as `budgeted`, then tuned on `tune_batches`; with `calibration` batches the tuning is
      dropped when it raises the mean loss on them (on the disaster tweets it did at 10-50% removed: README).

    `budgeted-heads` with `calibration` batches (held out from the Fisher sample) chooses between candidates
    with `held_out_choice`. The reference is the ranking by `head_importance` (per site: the paper's importance;
    without it, the Fisher information normalised per layer), as searched or as rearranged, whichever loses less
    on them: Kwon's rearrangement minimises a first-order estimate of the loss, which at some levels is worse than
    the ranking it starts from. The alternatives are the Fisher rankings (normalised per layer, and raw), each
    as searched and as rearranged; one replaces the reference only when it is significantly better. Without
    calibration, and always for the joint methods, Kwon's search on the raw Fisher information, rearranged:
    choosing the joint selection on 256 held-out training examples did worse on the default task at 40-60%.
    Under grouped-query attention heads go in the units of `choice.unit` (`head_units`). The joint methods keep
    each layer's neurons in blocks of `neuron_multiple` (`neuron_blocks`; `pipeline.methods.widths` measures it).
    """
    if method not in BUDGETED_METHODS:
        raise ValueError(f"unknown budgeted method {method!r}; choose one of {', '.join(BUDGETED_METHODS)}")
    if method == BUDGETED_TUNED and not tune_batches:
        raise ValueError(f"{BUDGETED_TUNED} needs tune_batches: the sample its least squares fit on")
    seconds = {}
    start = time.perf_counter()
    units = head_units(model, gradients.fisher()[0], choice.unit)
    unit_gradients = _unit_gradients(gradients, units)
    head_fisher, neuron_fisher = unit_gradients.fisher()
    unit_costs, prunes_neurons = _unit_costs(costs, units), method != BUDGETED_HEADS

    def heads_of(selection: Selection) -> Selection:
        """From kept units to kept heads."""
        return Selection([sorted(h for u in kept for h in site_units[u])
                          for kept, site_units in zip(selection.heads, units, strict=True)], selection.neurons)

    def candidates(name: str, scores: Sequence[torch.Tensor]) -> list[Candidate]:
        """A ranking's selection at this budget, as searched and as rearranged."""
        ranked = search(scores, neuron_fisher, unit_costs, keep, prune_neurons=prunes_neurons,
                        neuron_multiple=neuron_multiple)
        return [Candidate(name, heads_of(ranked)),
                Candidate(f"{name}, rearranged", heads_of(rearrange(ranked, unit_gradients)))]

    if calibration and not prunes_neurons:
        fisher = candidates("fisher", head_fisher)
        normalised = candidates("fisher normalised", per_layer_normalised(head_fisher))
        if head_importance is None:
            reference, alternatives = normalised, fisher
        else:  # a unit's importance is the sum of its heads'
            paper = [torch.stack([scores[unit].sum() for unit in site_units]) if site_units else scores[:0]
                     for scores, site_units in zip(head_importance, units, strict=True)]
            reference, alternatives = candidates("paper's importance", paper), normalised + fisher
        seconds["search"] = time.perf_counter() - start
        start = time.perf_counter()
        chosen = held_out_choice(reference, alternatives,
                                 lambda selection: calibration_losses(pruned_model(model, selection), calibration))
        seconds["rearrange"] = time.perf_counter() - start
    else:
        ranked = search(head_fisher, neuron_fisher, unit_costs, keep, prune_neurons=prunes_neurons,
                        neuron_multiple=neuron_multiple)
        seconds["search"] = time.perf_counter() - start
        start = time.perf_counter()
        chosen = Candidate("fisher, rearranged", heads_of(rearrange(ranked, unit_gradients)))
        seconds["rearrange"] = time.perf_counter() - start
    pruned, tuned = pruned_model(model, chosen.selection), False
    if method == BUDGETED_TUNED:
        start = time.perf_counter()
        untuned = copy.deepcopy(pruned) if calibration else None
        tune(pruned, model, tune_batches, first_token_last_layer, progress=progress)
        tuned = True
        # The fit matches layer outputs, which the loss follows only loosely: keep it where held-out data agree.
        if untuned is not None and calibration_loss(untuned, calibration) < calibration_loss(pruned, calibration):
            pruned, tuned = untuned, False
        seconds["tune"] = time.perf_counter() - start
    return BudgetedPrune(pruned.eval(), chosen.selection, seconds, tuned, chosen.name)
