"""Specification of the head criteria beside gradient importance (pipeline/methods/criteria.py): Torch-Pruning's
weight magnitude and Minitron's activation norm, on tiny decoder-only models."""

from __future__ import annotations

import pytest
import torch

from pipeline.core.importance import HeadChoice, head_importance, per_example_loss, rank_heads
from pipeline.core.sites import attention_sites
from pipeline.core.surgery import prune_heads
from pipeline.methods.criteria import activation_norm, weight_magnitude
from pipeline.methods.pruning import CurveEvaluator, criterion_curves, criterion_scores, plans_from_order
from tests.tiny_models import PAD, logits, randomize_biases, tiny_batch, tiny_model

FAMILIES = ["llama", "opt", "gpt2"]  # grouped-query, multi-head, GPT-2's fused Conv1D


def lm(family: str):
    return randomize_biases(tiny_model(family))


def head_columns(site, head: int, part: int = 0) -> slice:
    """The output channels of `head` in a query (part 0) or value (part 2) projection; fused c_attn holds all three."""
    start = head * site.head_dim + (part * site.num_heads * site.head_dim if site.layout.fused_qkv else 0)
    return slice(start, start + site.head_dim)


def scale_head_weights(site, head: int, factor: float) -> None:
    query, out = site.projections[0], site.out_proj
    rows = head_columns(site, head)
    with torch.no_grad():
        if site.layout.fused_qkv:  # Conv1D: weight [in, out]
            query.weight[:, rows] *= factor
            out.weight[rows, :] *= factor
        else:
            query.weight[rows, :] *= factor
            out.weight[:, rows] *= factor


def zero_value(site, kv_head: int) -> None:
    """Zero the value projection of one key/value head (with its bias), so the heads reading it output zero."""
    value = site.projections[2]
    channels = head_columns(site, kv_head, part=2)
    with torch.no_grad():
        if site.layout.fused_qkv:
            value.weight[:, channels] = 0.0
        else:
            value.weight[channels, :] = 0.0
        if value.bias is not None:
            value.bias[channels] = 0.0


def calibration(family: str, seed: int = 0) -> list[dict]:
    return [tiny_batch(family, batch_size=3, length=9, seed=seed + i) for i in range(2)]


@pytest.mark.parametrize("family", FAMILIES)
def test_every_criterion_gives_one_nonnegative_score_per_head_per_site(family):
    model = lm(family)
    heads = [site.num_heads for site in attention_sites(model)]
    for scores in (weight_magnitude(model), activation_norm(model, calibration(family), progress=False)):
        assert [s.shape for s in scores] == [torch.Size([n]) for n in heads]
        assert all(s.dtype == torch.float32 and (s > 0).all() for s in scores)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_head_whose_weights_are_scaled_up_ranks_last_by_magnitude(family):
    model = lm(family)
    scale_head_weights(attention_sites(model)[1], head=2, factor=10.0)
    assert rank_heads(weight_magnitude(model))[-1] == (1, 2)


def test_magnitude_is_tp_formula_the_mean_over_head_channels_of_squared_norms_of_query_rows_and_out_columns():
    model = lm("llama")
    site = attention_sites(model)[0]
    d, q, o = site.head_dim, site.projections[0].weight, site.out_proj.weight
    head = 3
    expected = (q[head * d : (head + 1) * d].pow(2).sum(1) + o[:, head * d : (head + 1) * d].pow(2).sum(0)).mean() / 2
    assert torch.allclose(weight_magnitude(model)[0][head], expected)
    l1 = (q[head * d : (head + 1) * d].abs().sum(1) + o[:, head * d : (head + 1) * d].abs().sum(0)).mean() / 2
    assert torch.allclose(weight_magnitude(model, p=1)[0][head], l1)


@pytest.mark.parametrize("family", ["opt", "gpt2"])
def test_a_head_whose_output_is_zeroed_ranks_first_by_activation(family):
    model = lm(family)
    zero_value(attention_sites(model)[2], kv_head=1)
    scores = activation_norm(model, calibration(family), progress=False)
    assert scores[2][1] == 0.0
    assert rank_heads(scores)[0] == (2, 1)


def test_a_key_value_group_whose_output_is_zeroed_ranks_first_by_activation_as_a_whole_group():
    model = lm("llama")
    site = attention_sites(model)[1]
    zero_value(site, kv_head=1)
    scores = activation_norm(model, calibration("llama"), progress=False)
    group = site.head_groups[1]
    assert (scores[1][group] == 0.0).all()
    assert rank_heads(scores, [s.head_groups for s in attention_sites(model)], unit="group")[: len(group)] == [
        (1, h) for h in group]


@pytest.mark.parametrize("family", FAMILIES)
def test_padding_does_not_change_the_activation_criterion(family):
    model = lm(family)
    unpadded = tiny_batch(family, batch_size=3, length=7, padded=False)
    # The same sequences with 4 padding tokens after them (masked), and one shortened by padding in a longer batch.
    ids = torch.cat([unpadded["input_ids"], torch.full((3, 4), PAD)], dim=1)
    mask = torch.cat([unpadded["attention_mask"], torch.zeros(3, 4, dtype=torch.long)], dim=1)
    padded = {"input_ids": ids, "attention_mask": mask}
    plain = activation_norm(model, [unpadded], progress=False)
    for a, b in zip(plain, activation_norm(model, [padded], progress=False), strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    # Without the mask the padding tokens would count: the criterion really reads it.
    unmasked = activation_norm(model, [{"input_ids": ids}], progress=False)
    assert not all(torch.allclose(a, b, rtol=1e-5) for a, b in zip(plain, unmasked, strict=True))


@pytest.mark.parametrize("family", FAMILIES)
def test_criteria_are_deterministic_and_leave_the_model_as_it_was(family):
    model, batch = lm(family), tiny_batch(family)
    before = logits(model, batch)
    assert all(torch.equal(a, b) for a, b in zip(weight_magnitude(model), weight_magnitude(model), strict=True))
    first = activation_norm(model, calibration(family), progress=False)
    second = activation_norm(model, calibration(family), progress=False)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert torch.equal(logits(model, batch), before)  # no hook left behind
    assert not model.training


@pytest.mark.parametrize("family", FAMILIES)
def test_a_pruned_model_scores_its_remaining_heads_as_the_unpruned_one_scored_them(family):
    model = lm(family)
    sites = attention_sites(model)
    plan = {0: sites[0].head_groups[0], 2: list(range(sites[2].num_heads))}  # site 2 emptied
    magnitude, activation = weight_magnitude(model), activation_norm(model, calibration(family), progress=False)
    prune_heads(model, plan)
    kept = [site.kept_heads for site in attention_sites(model)]
    for before, after, heads in zip(magnitude, weight_magnitude(model), kept, strict=True):
        assert torch.allclose(before[heads], after)
    # Site 0 lost heads, so what later layers read changes: only the first site's remaining heads score the same.
    assert torch.allclose(activation[0][kept[0]], activation_norm(model, calibration(family), progress=False)[0],
                          rtol=1e-5, atol=1e-6)
    assert activation_norm(model, calibration(family), progress=False)[2].shape == (0,)


class _NegativeLoss:
    """A TaskEval of a language model on one batch: minus its mean next-token loss (higher is better)."""

    def __init__(self, batch: dict):
        self.batch = batch

    def __len__(self) -> int:
        return len(self.batch["input_ids"])

    def __call__(self, model) -> tuple[float, None]:
        with torch.no_grad():
            return -float(per_example_loss(model, self.batch).mean()), None


@pytest.mark.parametrize("unit", ["query", "group"])
def test_each_criterion_curve_removes_as_many_heads_as_importance_at_every_level(unit):
    model, batch = lm("llama"), tiny_batch("llama", batch_size=4)
    evaluator = CurveEvaluator(model, {"dev": _NegativeLoss(batch)},
                               {k: v for k, v in batch.items() if k != "labels"})
    sites, choice, counts = attention_sites(model), HeadChoice(unit), [0, 4, 8, 12]
    importance = plans_from_order(choice.rank(head_importance(model, [batch], progress=False), sites), sites,
                                  counts, choice)
    reference = evaluator.curve("importance", importance, progress=False)
    curves = criterion_curves(evaluator, criterion_scores(model, ["magnitude", "activation"], [batch]), counts, choice)
    assert [c.method.iloc[0] for c in curves] == ["magnitude", "activation"]
    for curve in curves:
        assert curve.heads_pruned.tolist() == reference.heads_pruned.tolist()
    assert len({tuple(c.metric) for c in curves}) == 2  # the criteria choose differently


def test_every_criterion_is_normalised_per_layer_for_norms_carry_their_layers_scale():
    """Ranked raw across layers, a layer whose activations are small would lose all its heads first."""
    model, batch = lm("llama"), tiny_batch("llama", batch_size=4)
    for criterion, by_site in criterion_scores(model, ["magnitude", "activation", "paper-importance"], [batch]).items():
        norms = torch.stack([scores.norm() for scores in by_site])
        assert torch.allclose(norms, torch.ones_like(norms)), criterion
