"""Head importance (Michel et al., 2019): I_h = E_x |dL(x)/d(xi_h)|, and rankings built on it.

Each batch gets per-example gates, so one forward and one backward pass give every example's gate
gradient; the parameters' gradients are never computed. The absolute value is taken per example,
before averaging (accumulating signed gradients across a batch first, as Hugging Face's bertology
script does, lets opposite-signed examples cancel and ranks heads worse).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from pipeline.core.gates import gate_grad, head_gates
from pipeline.core.levels import AttentionShape, heads_to_save
from pipeline.core.placement import input_device
from pipeline.core.sites import AttentionSite, is_decoder_only
from pipeline.files.schema import HEAD_UNITS

LABEL_PAD = -100


def per_example_loss(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """L(x) for each example of the batch, shape `[batch]`.

    Classification: cross-entropy of the label. Sequence-to-sequence: token-level NLL of the target,
    padding (label -100) masked, averaged over each example's own target tokens, so every example
    weighs the same whatever its length. Decoder-only language models: the same NLL of each next token,
    with the Hugging Face convention that `labels` are the inputs (the position t predicts label t + 1).
    """
    labels = batch["labels"]
    logits = model(**batch).logits
    # Half-precision logits are upcast for the loss; float64 (the gradient checks) stays float64.
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if logits.dim() == 2:
        return F.cross_entropy(logits, labels, reduction="none")
    if is_decoder_only(model):
        logits, labels = logits[:, :-1], labels[:, 1:]
    nll = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=LABEL_PAD, reduction="none")
    tokens = (labels != LABEL_PAD).sum(dim=1).clamp(min=1)
    return nll.sum(dim=1) / tokens


@contextmanager
def frozen_for_gate_gradients(model: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout, as the paper's code scores) and no parameter gradients, so a backward pass
    computes only the gates' gradients; restores both on exit."""
    was_training = model.training
    model.eval()
    frozen = [p for p in model.parameters() if p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    try:
        with torch.enable_grad():
            yield
    finally:
        for p in frozen:
            p.requires_grad_(True)
        model.train(was_training)


def example_gate_sums(leaves: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Per site, sum_x |dL(x)/d(xi_h)| over a batch, from its per-example gates (`Gates.per_example`) after the
    backward pass: `head_importance`'s terms, and layer by layer the same (pipeline/core/layerwise.py)."""
    return [gate_grad(leaf).abs().sum(dim=0) for leaf in leaves]


def token_gate_sums(leaves: Sequence[torch.Tensor], real: torch.Tensor) -> tuple[list[torch.Tensor],
                                                                                 list[torch.Tensor]]:
    """Per site, from a batch's per-position gates (`Gates.per_position`) after the backward pass and its
    `[batch, positions]` float mask of real tokens: (sum over real tokens of |dL(x)/d(xi_{h,t})|, sum over examples
    of |sum_t dL(x)/d(xi_{h,t})|), `token_head_importance`'s terms."""
    grads = [gate_grad(leaf) * real.unsqueeze(-1) for leaf in leaves]
    return [g.abs().sum(dim=(0, 1)) for g in grads], [g.sum(dim=1).abs().sum(dim=0) for g in grads]


def head_importance(
    model: nn.Module,
    batches: Iterable[Mapping[str, torch.Tensor]],
    progress: bool = True,
) -> list[torch.Tensor]:
    """The paper's estimator, one `[num_heads]` float tensor per attention site.

    `batches` yields model inputs with `labels`. Returns E_x |dL(x)/d(xi_h)| averaged over all examples seen.
    """
    device = input_device(model)  # a sharded model's first layer's device
    totals: list[torch.Tensor] | None = None
    examples = 0
    with frozen_for_gate_gradients(model), head_gates(model) as gates:
        for batch in tqdm(batches, desc="importance", disable=not progress, leave=False):
            batch = {k: v.to(device) for k, v in batch.items()}
            size = batch["labels"].shape[0]
            leaves = gates.per_example(size)
            per_example_loss(model, batch).sum().backward()
            grads = example_gate_sums(leaves)
            totals = grads if totals is None else [t + g for t, g in zip(totals, grads, strict=True)]
            examples += size
    if totals is None:
        raise ValueError("head_importance got no batches: the scoring data is empty")
    return [t.detach().cpu() / examples for t in totals]


def token_head_importance(
    model: nn.Module,
    batches: Iterable[Mapping[str, torch.Tensor]],
    progress: bool = True,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Two estimators from one backward pass of per-position gates (batch-first models): per token,
    E_{x,t} |dL(x)/d(xi_{h,t})| over every example's real positions (`attention_mask`), and the paper's
    E_x |dL(x)/d(xi_h)|, whose per-example gradient is the sum of that example's per-position ones.

    A head can matter at a few positions and push the loss the other way at others; the per-example sum lets those
    cancel, the per-token mean does not. Returns (per-token, per-example), each one `[num_heads]` float tensor per
    attention site.
    """
    device = input_device(model)  # a sharded model's first layer's device
    per_token: list[torch.Tensor] | None = None
    per_example: list[torch.Tensor] | None = None
    examples = tokens = 0
    with frozen_for_gate_gradients(model), head_gates(model) as gates:
        for batch in tqdm(batches, desc="importance", disable=not progress, leave=False):
            batch = {k: v.to(device) for k, v in batch.items()}
            size, length = batch["input_ids"].shape
            real = batch.get("attention_mask", torch.ones(size, length, device=device)).to(torch.float32)
            leaves = gates.per_position(size, length)
            per_example_loss(model, batch).sum().backward()
            token_sums, example_sums = token_gate_sums(leaves, real)
            per_token = token_sums if per_token is None else [t + g for t, g in zip(per_token, token_sums,
                                                                                    strict=True)]
            per_example = example_sums if per_example is None else [t + g for t, g in zip(per_example, example_sums,
                                                                                          strict=True)]
            examples += size
            tokens += int(real.sum())
    if per_token is None or per_example is None:
        raise ValueError("token_head_importance got no batches: the scoring data is empty")
    return [t.detach().cpu() / tokens for t in per_token], [t.detach().cpu() / examples for t in per_example]


def normalize_per_layer(importance: Sequence[torch.Tensor], p: float | None = 2.0) -> list[torch.Tensor]:
    """Divide each site's scores by their L_p norm within the site (the paper: p=2). None: unchanged."""
    if p is None:
        return [t.clone() for t in importance]
    if p <= 0:
        raise ValueError(f"normalisation exponent must be > 0 (or None to switch it off), got {p}")
    return [t / t.norm(p=p).clamp(min=1e-20) if t.numel() else t.clone() for t in importance]


Head = tuple[int, int]  # (site index, head index)
# Per site, the positions of the query heads each key/value head serves (`AttentionSite.head_groups`).
Groups = Sequence[Sequence[Sequence[int]]]


def _singletons(num_heads: Sequence[int]) -> list[list[list[int]]]:
    """Multi-head attention: every head is a group of its own."""
    return [[[h] for h in range(n)] for n in num_heads]


def rank_heads(importance: Sequence[torch.Tensor], groups: Groups | None = None, unit: str = "query") -> list[Head]:
    """All heads, least important first. Ties keep model order, so the ranking is deterministic.

    Under grouped-query attention (`groups`) heads go in units that keep every key/value group equal, and the
    order lists each unit's heads together, units by the sum of their heads' scores:
    - unit "query": a layer's k-th unit is the k-th least important head of every group (the same number
      of query heads leaves each group), so the key/value heads stay until their last query head goes;
    - unit "group": a whole group, its key/value head with it.
    Multi-head attention (`groups` None: every head a group of its own) is the plain ranking of heads.
    """
    if unit not in HEAD_UNITS:
        raise ValueError(f"unit must be one of {', '.join(HEAD_UNITS)}, got {unit!r}")
    if groups is None:
        groups, unit = _singletons([len(t) for t in importance]), "group"
    units = []  # (score, site, position of the unit within its site, heads)
    for site, (scores, site_groups) in enumerate(zip(importance, groups, strict=True)):
        score = [float(x) for x in scores]
        if unit == "group":
            units += [(sum(score[h] for h in group), site, g, list(group)) for g, group in enumerate(site_groups)]
            continue
        # Each group's heads, least important first; the k-th slice takes the k-th of every group.
        by_group = [sorted(group, key=lambda h: (score[h], h)) for group in site_groups]
        for k in range(min((len(g) for g in by_group), default=0)):
            members = [g[k] for g in by_group]
            units.append((sum(score[h] for h in members), site, k, members))
    units.sort(key=lambda item: item[0])  # stable sort: ties stay in (site, unit) order
    return [(site, head) for _, site, _, heads in units for head in heads]


def random_order(num_heads: Sequence[int], seed: int, groups: Groups | None = None, unit: str = "query") -> list[Head]:
    """A seeded random ranking, the baseline every importance ranking must beat; under grouped-query attention,
    in whole units as `rank_heads` makes them."""
    heads = [(site, head) for site, n in enumerate(num_heads) for head in range(n)]
    generator = torch.Generator().manual_seed(seed)
    position = torch.empty(len(heads))
    position[torch.randperm(len(heads), generator=generator)] = torch.arange(len(heads), dtype=torch.float)
    scores, start = [], 0
    for n in num_heads:  # a head's score is its place in the permutation: with one head per group, that order
        scores.append(position[start : start + n])
        start += n
    return rank_heads(scores, groups, unit)


def _whole_units(groups: Sequence[Sequence[int]], gone: set[int], unit: str) -> bool:
    """Whether removing `gone` leaves a site in whole units: for unit "query", every key/value group the same
    size, emptied ones included (the same number of query heads left each group); for unit "group", every group
    whole or gone. (A grouped site down to one query head per group still goes a whole slice at a time under
    unit "query": it is not multi-head attention, whose heads each have a key/value head of their own.)"""
    left = [len([h for h in group if h not in gone]) for group in groups]
    if unit == "group":
        return all(n in (0, len(group)) for n, group in zip(left, groups, strict=True))
    return len(set(left)) <= 1


def select_heads(
    order: Sequence[Head], num_heads: Sequence[int], count: int, min_heads_per_site: int = 0,
    groups: Groups | None = None, uniform: bool = False, unit: str = "query",
) -> dict[int, list[int]]:
    """The first `count` heads of `order` whose removal leaves every site `min_heads_per_site` heads.

    Under grouped-query attention (`groups`), a site's heads are taken in the order's sequence but count as
    removed only once the site is in whole `unit`s again (every key/value group keeping as many query heads as
    the others), so that every plan can be pruned physically; orders from `rank_heads` and `random_order` list
    whole units, so this takes them unit by unit, and removes the most whole units that fit in `count` (possibly
    a few heads fewer).
    `uniform` removes the same number of heads from every site (count / sites, in whole units), keeping the
    layers alike, as a stock config needs.

    Returns `{site: [head, ...]}`, the form `prune_heads` and gate masks take.
    """
    grouped = groups is not None
    if groups is None:  # multi-head attention: every head a whole group of its own
        groups, unit = _singletons(num_heads), "group"
    if uniform:
        per_site = count // len(num_heads) if num_heads else 0
        budget = [per_site] * len(num_heads)
    else:
        budget = [count] * len(num_heads)  # only the total binds
    remaining = list(num_heads)
    chosen: dict[int, list[int]] = {}
    pending: dict[int, list[int]] = {}
    closed: set[int] = set()
    taken = 0
    for site, head in order:
        if taken == count:
            break
        if site in closed:
            continue
        pending.setdefault(site, []).append(head)
        if not _whole_units(groups[site], set(chosen.get(site, [])) | set(pending[site]), unit):
            continue
        members = pending.pop(site)
        removed_here = num_heads[site] - remaining[site]
        if remaining[site] - len(members) < min_heads_per_site or removed_here + len(members) > budget[site]:
            closed.add(site)  # later units of this site are no smaller, and its units come in order
            continue
        if taken + len(members) > count:
            continue  # a smaller unit of another site may still fit
        chosen.setdefault(site, []).extend(members)
        remaining[site] -= len(members)
        taken += len(members)
    if taken < count and not grouped and not uniform:
        raise ValueError(f"cannot prune {count} heads while keeping {min_heads_per_site} per layer: "
                         f"at most {taken} can go")
    return {site: sorted(heads) for site, heads in sorted(chosen.items())}


@dataclass(frozen=True)
class HeadChoice:
    """How heads are chosen for removal, the same for every method that ranks them (`prune.unit`,
    `prune.uniform`, `prune.min_heads_per_layer`): in which units under grouped-query attention, whether every
    layer loses the same number, and how many each must keep. For multi-head attention and the defaults, the
    paper's global ranking."""

    unit: str = "query"
    uniform: bool = False
    min_heads_per_site: int = 0

    def rank(self, importance: Sequence[torch.Tensor], sites: Sequence[AttentionSite]) -> list[Head]:
        return rank_heads(importance, _groups(sites), self.unit)

    def random(self, sites: Sequence[AttentionSite], seed: int) -> list[Head]:
        return random_order([site.num_heads for site in sites], seed, _groups(sites), self.unit)

    def select(self, order: Sequence[Head], sites: Sequence[AttentionSite], count: int) -> dict[int, list[int]]:
        return select_heads(order, [site.num_heads for site in sites], count, self.min_heads_per_site,
                            _groups(sites), self.uniform, self.unit)

    def saved_count(self, fraction: float, sites: Sequence[AttentionSite], key: str) -> int:
        """The heads a saved model at `fraction` loses, at a level these sites take in this choice's units
        (pipeline/core/levels.py); raises LevelError naming `key` and the levels they take. `select` at this count
        removes exactly that many when uniform (the curves' counts it may round down)."""
        shape = AttentionShape(tuple(s.num_heads for s in sites), tuple(s.num_kv_heads for s in sites))
        return heads_to_save(fraction, shape, self.unit, self.uniform, self.min_heads_per_site, key)


def _groups(sites: Sequence[AttentionSite]) -> list[list[list[int]]] | None:
    """The sites' key/value groups under grouped-query attention (as it was before any pruning); None for
    multi-head attention."""
    return [site.head_groups for site in sites] if any(site.original_group_size > 1 for site in sites) else None


PAPER_CHOICE = HeadChoice()  # the paper's: heads one by one in the global ranking, no layer kept
