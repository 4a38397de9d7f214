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
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats
from torch import nn
from tqdm.auto import tqdm

from pipeline.core.flops import module_flops
from pipeline.core.gates import gate_grad, head_gates, neuron_gates
from pipeline.core.importance import PAPER_CHOICE, HeadChoice, frozen_for_gate_gradients, per_example_loss
from pipeline.core.sites import attention_sites, family_of, ffn_sites, is_decoder_only, pre_norms
from pipeline.core.surgery import prune_heads, prune_neurons
from pipeline.core.timer import median_times
from pipeline.files.schema import BUDGETED_HEADS, BUDGETED_METHODS, BUDGETED_TUNED, ENCODER

Batches = Sequence[Mapping[str, torch.Tensor]]


# --- 1. Fisher information --------------------------------------------------------------------------------

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


def _unit_costs(costs: UnitCosts, units: Sequence[Sequence[Sequence[int]]]) -> UnitCosts:
    """`costs` with each site's attention units in place of its heads (a unit of n heads costs n heads)."""
    size = [len(site_units[0]) if site_units else 0 for site_units in units]
    return UnitCosts([c * n for c, n in zip(costs.head, size, strict=True)], costs.neuron,
                     [len(site_units) for site_units in units], costs.neuron_counts, costs.total, costs.unit)


# --- costs ------------------------------------------------------------------------------------------------

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


# --- 2. search and rearrangement ----------------------------------------------------------------------------

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


# --- 3. tuning ----------------------------------------------------------------------------------------------

class _Stop(Exception):
    """Raised from a hook to end a forward pass once the layer being tuned has run."""


def _tokens(x: torch.Tensor, mask: torch.Tensor, first_only: bool) -> torch.Tensor:
    """`[batch, seq, d]` -> the `[tokens, d]` rows of real (unpadded) tokens, or of each first token. OPT runs its
    FFN on the flattened `[batch * seq, d]`."""
    x = x.view(*mask.shape, x.shape[-1]) if x.dim() == 2 else x
    return x[:, 0] if first_only else x[mask.bool()]


def _query_input(layout, args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs[layout.query_arg]


def _solve_scales(ata: torch.Tensor, atb: torch.Tensor, damping: float) -> torch.Tensor | None:
    """argmin_m ||A m - b||^2 + lambda ||m - 1||^2 from the normal equations, or None when the system is
    degenerate or the scales come out wild (|m| > 10, as Kwon's code bounds them): then the units keep 1."""
    ata, atb = ata.cpu(), atb.cpu()  # a small fp64 system: solved on the CPU, the same on every device
    ones = torch.ones_like(atb)
    lam = damping * ata.diagonal().mean().clamp(min=1e-12)
    delta = torch.linalg.solve(ata + lam * torch.eye(len(atb), dtype=ata.dtype), atb - ata @ ones)
    scales = ones + delta
    if not torch.isfinite(scales).all() or scales.abs().max() > 10:
        return None
    return scales


@torch.no_grad()
def tune(student: nn.Module, teacher: nn.Module, batches: Batches, first_token_last_layer: bool = False,
         damping: float = 1e-3, progress: bool = True) -> dict[str, int]:
    """Rescale the kept heads and neurons of `student` (a physically pruned copy of `teacher`) in place, layer
    by layer, so that each sublayer's output plus its residual input matches the teacher's on `batches`.

    Sublayers are tuned in model order, each on the inputs the already-tuned student gives it, so later
    layers also correct earlier layers' errors. `first_token_last_layer`: a sequence classifier reads only the
    first token of the last layer, so only that token is matched there. Encoder-only post-norm models (every
    supported classification family: the residual is the sublayer's input) and decoder-only language models
    (pre-norm: the residual is the input of the norm in front of the sublayer). Gemma 3 also normalises each
    sublayer's output before the residual adds it, so its layers' outputs are not linear in the scales: there each
    sublayer's output before that norm is matched to the teacher's, residual left out (matched exactly, the norm
    gives the teacher's contribution); the fit on the student's own inputs still corrects earlier layers' errors
    in part. Returns how many sublayers were tuned and how many kept their scales at 1.
    """
    s_sites, t_sites = attention_sites(student), attention_sites(teacher)
    s_ffn, t_ffn = ffn_sites(student), ffn_sites(teacher)
    one_stack = all(site.kind == ENCODER for site in s_sites) or is_decoder_only(student)
    if not one_stack or len(s_sites) != len(s_ffn):
        raise ValueError("tuning supports encoder-only and decoder-only models (one attention and one FFN "
                         f"sublayer per layer); {type(student).__name__} has {len(s_sites)} attention and "
                         f"{len(s_ffn)} FFN sites")
    s_norms, t_norms = pre_norms(student), pre_norms(teacher)
    # Adding the residual to the target where the output is normalised first would ask the output projection for the
    # residual stream's difference, in units the norm then rescales: scales far from 1 even for an unpruned copy.
    adds_residual = not family_of(student).normed_outputs
    device = next(student.parameters()).device
    batches = [{k: v.to(device) for k, v in batch.items()} for batch in batches]
    masks = [batch["attention_mask"] for batch in batches]
    inputs = [{k: v for k, v in batch.items() if k != "labels"} for batch in batches]
    last = len(s_sites) - 1
    # Each sublayer is (kind, site index): its residual input comes from `entry`, its output from `exit`.
    sublayers = [(kind, i) for i in range(len(s_sites)) for kind in ("attention", "ffn")]

    def entry_exit(sites_, ffn_, norms, kind: str, i: int) -> tuple[nn.Module, nn.Module]:
        """Where the sublayer's residual is read (its input, or its pre-norm's) and the module it ends with."""
        attention = kind == "attention"
        exit_ = sites_[i].out_proj if attention else ffn_[i].fc_out
        if norms is not None:
            return norms[i][0 if attention else 1], exit_
        return (sites_[i].module if attention else ffn_[i].fc_in), exit_

    def residual_of(layout, kind: str, pre_norm: bool, args: tuple, kwargs: dict) -> torch.Tensor:
        return _query_input(layout, args, kwargs) if kind == "attention" and not pre_norm else args[0]

    # The teacher's target for every sublayer, in one pass: output (bias included) + residual input.
    targets: dict[tuple[str, int], list[torch.Tensor]] = {key: [] for key in sublayers}
    handles, current = [], {}
    for kind, i in sublayers:
        first_only = first_token_last_layer and kind == "ffn" and i == last
        entry, exit_ = entry_exit(t_sites, t_ffn, t_norms, kind, i)
        layout = t_sites[i].layout

        def grab_residual(_m, args, kwargs, key=(kind, i), layout=layout):
            current[key] = residual_of(layout, key[0], t_norms is not None, args, kwargs)

        def grab_target(_m, _args, output, key=(kind, i), first_only=first_only):
            target = output + current.pop(key) if adds_residual else output
            targets[key].append(_tokens(target, current["mask"], first_only).double())

        if adds_residual:
            handles.append(entry.register_forward_pre_hook(grab_residual, with_kwargs=True))
        handles.append(exit_.register_forward_hook(grab_target))
    try:
        for mask, batch in zip(masks, inputs, strict=True):
            current["mask"] = mask
            teacher(**batch)
    finally:
        for handle in handles:
            handle.remove()

    outcome = {"tuned": 0, "kept_at_one": 0}
    captured: dict[str, torch.Tensor] = {}  # the student's tensors of the sublayer being tuned, batch by batch
    with head_gates(student) as h_gates, neuron_gates(student) as n_gates:
        for kind, i in tqdm(sublayers, desc="tune", disable=not progress, leave=False):
            units = s_sites[i].num_heads if kind == "attention" else s_ffn[i].num_neurons
            if units == 0:
                continue
            first_only = first_token_last_layer and kind == "ffn" and i == last
            entry, exit_ = entry_exit(s_sites, s_ffn, s_norms, kind, i)
            weight = _weight_out_in(exit_).double()  # [hidden, units * width]
            bias = exit_.bias.double() if exit_.bias is not None else 0.0
            ata = torch.zeros(units, units, dtype=torch.float64, device=weight.device)
            atb = torch.zeros(units, dtype=torch.float64, device=weight.device)

            def grab_residual(_m, args, kwargs, layout=s_sites[i].layout, kind=kind):
                captured["residual"] = residual_of(layout, kind, s_norms is not None, args, kwargs)

            def grab_parts(_m, args):
                captured["parts"] = args[0]
                raise _Stop

            handles = [exit_.register_forward_pre_hook(grab_parts)]
            if adds_residual:
                handles.append(entry.register_forward_pre_hook(grab_residual, with_kwargs=True))
            try:
                for mask, batch, target in zip(masks, inputs, targets[(kind, i)], strict=True):
                    try:
                        student(**batch)
                    except _Stop:
                        pass
                    parts = _tokens(captured["parts"], mask, first_only).double()
                    residual = _tokens(captured["residual"], mask, first_only).double() if adds_residual else 0.0
                    b = target - bias - residual  # what the units' weighted sum must produce
                    if kind == "attention":
                        # Each head's own contribution to the output: its slice of the context times its columns.
                        width = parts.shape[1] // units
                        per_unit = torch.einsum("tuw,duw->tud", parts.view(-1, units, width),
                                                weight.view(-1, units, width))
                        ata += torch.einsum("tud,tvd->uv", per_unit, per_unit)
                        atb += torch.einsum("tud,td->u", per_unit, b)
                    else:
                        # Neuron u contributes parts[:, u] * weight[:, u]: the Gram matrix factorises.
                        ata += (parts.T @ parts) * (weight.T @ weight)
                        atb += (parts * (b @ weight)).sum(dim=0)
            finally:
                for handle in handles:
                    handle.remove()
            scales = _solve_scales(ata, atb, damping)
            if scales is None:
                outcome["kept_at_one"] += 1
                continue
            gates = h_gates if kind == "attention" else n_gates
            gates[i] = scales.to(device=gates[i].device, dtype=gates[i].dtype)
            outcome["tuned"] += 1
        # Fold the scales into the output projections' columns, so no gate is needed at inference.
        for gate, site in zip(h_gates, s_sites, strict=True):
            if site.num_heads:
                _weight_out_in(site.out_proj).mul_(gate.repeat_interleave(site.head_dim).to(site.out_proj.weight.dtype))
        for gate, site in zip(n_gates, s_ffn, strict=True):
            if site.num_neurons:
                _weight_out_in(site.fc_out).mul_(gate.to(site.fc_out.weight.dtype))
    return outcome


def _weight_out_in(layer: nn.Module) -> torch.Tensor:
    """A linear's weight as `[out, in]`: GPT-2's Conv1D stores it transposed (a view, so writes go through)."""
    return layer.weight if isinstance(layer, nn.Linear) else layer.weight.T


# --- the method -----------------------------------------------------------------------------------------------

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
