"""Head importance (Michel et al., 2019): I_h = E_x |dL(x)/d(xi_h)|, and rankings built on it.

Each batch gets per-example gates, so one forward and one backward pass give every example's gate
gradient; the parameters' gradients are never computed. The absolute value is taken per example,
before averaging (accumulating signed gradients across a batch first, as Hugging Face's bertology
script does, lets opposite-signed examples cancel and ranks heads worse).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from pipeline.core.gates import head_gates

LABEL_PAD = -100


def per_example_loss(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """L(x) for each example of the batch, shape `[batch]`.

    Classification: cross-entropy of the label. Sequence-to-sequence: token-level NLL of the target,
    padding (label -100) masked, averaged over each example's own target tokens, so every example
    weighs the same whatever its length. Causal language models: the same, with the logits at position t
    scored against label t + 1 (Hugging Face's convention: labels are the input ids, shifted in the loss).
    A model is causal when its logits are per token and it has no encoder (`config.is_encoder_decoder`
    false): the flag Hugging Face itself reads to choose between the two losses and decoding modes.
    """
    labels = batch["labels"]
    logits = model(**batch).logits
    # Half-precision logits are upcast for the loss; float64 (the gradient checks) stays float64.
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if logits.dim() == 2:
        return F.cross_entropy(logits, labels, reduction="none")
    if not getattr(model.config, "is_encoder_decoder", False):
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


def head_importance(
    model: nn.Module,
    batches: Iterable[Mapping[str, torch.Tensor]],
    progress: bool = True,
) -> list[torch.Tensor]:
    """The paper's estimator, one `[num_heads]` float tensor per attention site.

    `batches` yields model inputs with `labels`. Returns E_x |dL(x)/d(xi_h)| averaged over all examples seen.
    """
    device = next(model.parameters()).device
    totals: list[torch.Tensor] | None = None
    examples = 0
    with frozen_for_gate_gradients(model), head_gates(model) as gates:
        for batch in tqdm(batches, desc="importance", disable=not progress, leave=False):
            batch = {k: v.to(device) for k, v in batch.items()}
            size = batch["labels"].shape[0]
            leaves = gates.per_example(size)
            per_example_loss(model, batch).sum().backward()
            grads = [leaf.grad.abs().sum(dim=0) for leaf in leaves]
            totals = grads if totals is None else [t + g for t, g in zip(totals, grads, strict=True)]
            examples += size
    if totals is None:
        raise ValueError("head_importance got no batches: the scoring data is empty")
    return [t.detach().cpu() / examples for t in totals]


def normalize_per_layer(importance: Sequence[torch.Tensor], p: float | None = 2.0) -> list[torch.Tensor]:
    """Divide each site's scores by their L_p norm within the site (the paper: p=2). None: unchanged."""
    if p is None:
        return [t.clone() for t in importance]
    if p <= 0:
        raise ValueError(f"normalisation exponent must be > 0 (or None to switch it off), got {p}")
    return [t / t.norm(p=p).clamp(min=1e-20) if t.numel() else t.clone() for t in importance]


Head = tuple[int, int]  # (site index, head index)


def rank_heads(importance: Sequence[torch.Tensor]) -> list[Head]:
    """All heads, least important first. Ties keep model order, so the ranking is deterministic."""
    scored = [(float(score), site, head) for site, t in enumerate(importance) for head, score in enumerate(t)]
    scored.sort(key=lambda item: item[0])  # stable sort: ties stay in (site, head) order
    return [(site, head) for _, site, head in scored]


def random_order(num_heads: Sequence[int], seed: int) -> list[Head]:
    """A seeded random ranking, the baseline every importance ranking must beat."""
    heads = [(site, head) for site, n in enumerate(num_heads) for head in range(n)]
    generator = torch.Generator().manual_seed(seed)
    return [heads[i] for i in torch.randperm(len(heads), generator=generator).tolist()]


def select_heads(
    order: Sequence[Head], num_heads: Sequence[int], count: int, min_heads_per_site: int = 0
) -> dict[int, list[int]]:
    """The first `count` heads of `order` whose removal leaves every site `min_heads_per_site` heads.

    Returns `{site: [head, ...]}`, the form `prune_heads` and gate masks take.
    """
    remaining = list(num_heads)
    chosen: dict[int, list[int]] = {}
    taken = 0
    for site, head in order:
        if taken == count:
            break
        if remaining[site] <= min_heads_per_site:
            continue
        chosen.setdefault(site, []).append(head)
        remaining[site] -= 1
        taken += 1
    if taken < count:
        raise ValueError(f"cannot prune {count} heads while keeping {min_heads_per_site} per layer: "
                         f"at most {taken} can go")
    return {site: sorted(heads) for site, heads in sorted(chosen.items())}
