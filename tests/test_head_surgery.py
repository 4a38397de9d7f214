"""Specification of the head-surgery core: sites, gates, importance, physical pruning, save/load."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from pipeline.core.checkpoint import load_model, save_model
from pipeline.core.flops import forward_flops, parameter_count
from pipeline.core.gates import head_gates
from pipeline.core.importance import (
    head_importance,
    normalize_per_layer,
    per_example_loss,
    random_order,
    rank_heads,
    select_heads,
)
from pipeline.core.sites import UnsupportedModelError, attention_sites
from pipeline.core.surgery import prune_heads
from pipeline.files.schema import PRUNING_FILE
from tests.tiny_models import (
    FAMILIES,
    FAMILY_IMPLS,
    SEQ2SEQ,
    assert_per_example_gradients_are_each_examples_own,
    impl_for,
    logits,
    non_uniform_plan,
    tiny_batch,
    tiny_model,
)

# --- sites -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_sites_list_every_attention_module_in_model_order(family):
    sites = attention_sites(tiny_model(family, impl_for(family)))
    if family in SEQ2SEQ:
        assert [(s.kind, s.layer) for s in sites] == [
            ("encoder", 0), ("encoder", 1), ("decoder", 0), ("cross", 0), ("decoder", 1), ("cross", 1)]
    else:
        assert [(s.kind, s.layer) for s in sites] == [("encoder", 0), ("encoder", 1)]
    assert all(s.num_heads == 4 and s.head_dim == 8 for s in sites)


def test_unsupported_model_names_its_class_and_the_supported_families():
    model = transformers.GPTNeoXModel(transformers.GPTNeoXConfig(num_hidden_layers=1, hidden_size=16,
                                                                 num_attention_heads=2, intermediate_size=16,
                                                                 vocab_size=50))
    with pytest.raises(UnsupportedModelError, match=r"GPTNeoXModel .*gpt_neox.*supported families: bart, bert"):
        attention_sites(model)


# --- gates -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family,impl", FAMILY_IMPLS)
def test_gates_at_one_leave_outputs_unchanged_and_hooks_go_on_exit(family, impl):
    model, batch = tiny_model(family, impl), tiny_batch(family)
    reference = logits(model, batch)
    with head_gates(model) as gates:
        assert [g.shape[0] for g in gates] == [s.num_heads for s in attention_sites(model)]
        assert (logits(model, batch) - reference).abs().max() <= 1e-6
        gates[0][1] = 0.0
        assert not torch.allclose(logits(model, batch), reference)
    assert torch.equal(logits(model, batch), reference)
    assert all(not s.out_proj._forward_pre_hooks for s in attention_sites(model))


@pytest.mark.parametrize("family", FAMILIES)
def test_gate_gradient_matches_float64_central_finite_difference(family):
    model, batch = tiny_model(family, impl_for(family)).double(), tiny_batch(family)
    with head_gates(model, requires_grad=True) as gates:
        per_example_loss(model, batch).sum().backward()
        analytic = torch.cat([g.grad for g in gates])
        numeric = []
        eps = 1e-6
        with torch.no_grad():
            for gate in gates:
                for h in range(gate.shape[0]):
                    gate[h] += eps
                    up = per_example_loss(model, batch).sum()
                    gate[h] -= 2 * eps
                    down = per_example_loss(model, batch).sum()
                    gate[h] += eps
                    numeric.append((up - down) / (2 * eps))
    numeric = torch.stack(numeric).to(analytic.dtype)
    assert analytic.abs().max() > 0
    assert (analytic - numeric).norm() / numeric.norm() <= 1e-4


@pytest.mark.parametrize("family", ["bert", "marian"])
def test_per_example_gates_give_each_examples_own_gradient_in_one_backward(family):
    model, batch = tiny_model(family).double(), tiny_batch(family, batch_size=3, padded=False)
    assert_per_example_gradients_are_each_examples_own(model, batch)


# --- importance --------------------------------------------------------------------------------------


def test_importance_is_mean_over_examples_of_absolute_per_example_gradient():
    model, batch = tiny_model("bert").double(), tiny_batch("bert", batch_size=4, padded=False)
    scores = head_importance(model, [batch], progress=False)
    assert all(p.requires_grad and p.grad is None for p in model.parameters())
    expected = torch.zeros(2, 4, dtype=torch.float64)
    for i in range(4):
        with head_gates(model, requires_grad=True) as gates:
            per_example_loss(model, {k: v[i : i + 1] for k, v in batch.items()}).sum().backward()
            expected += torch.stack([g.grad for g in gates]).abs()
    assert torch.allclose(torch.stack(scores), expected / 4)


def test_importance_is_independent_of_batching_and_deterministic():
    model, batch = tiny_model("marian"), tiny_batch("marian", batch_size=4)
    whole = head_importance(model, [batch], progress=False)
    halves = head_importance(model, [{k: v[:2] for k, v in batch.items()}, {k: v[2:] for k, v in batch.items()}],
                             progress=False)
    again = head_importance(model, [batch], progress=False)
    for a, b, c in zip(whole, halves, again, strict=True):
        assert torch.allclose(a, b, atol=1e-6) and torch.equal(a, c)


def test_importance_of_no_data_is_an_error():
    with pytest.raises(ValueError, match="no batches"):
        head_importance(tiny_model("bert"), [], progress=False)


def test_per_layer_normalisation_uses_the_lp_norm_within_each_site():
    scores = [torch.tensor([3.0, 4.0]), torch.tensor([1.0, 1.0, 1.0, 1.0]), torch.tensor([])]
    l2 = normalize_per_layer(scores)
    assert torch.allclose(l2[0], torch.tensor([0.6, 0.8])) and torch.allclose(l2[1], torch.full((4,), 0.5))
    assert torch.allclose(normalize_per_layer(scores, p=1)[0], torch.tensor([3 / 7, 4 / 7]))
    assert torch.equal(normalize_per_layer(scores, p=None)[0], scores[0])
    with pytest.raises(ValueError, match="exponent must be > 0"):
        normalize_per_layer(scores, p=0)


def test_global_ranking_is_ascending_with_ties_in_model_order():
    order = rank_heads([torch.tensor([0.5, 0.1]), torch.tensor([0.1, 0.9])])
    assert order == [(0, 1), (1, 0), (0, 0), (1, 1)]


def test_random_order_is_a_seeded_permutation():
    a, b, c = random_order([4, 4, 2], seed=1), random_order([4, 4, 2], seed=1), random_order([4, 4, 2], seed=2)
    assert a == b and a != c and sorted(a) == [(s, h) for s, n in enumerate([4, 4, 2]) for h in range(n)]


def test_select_heads_respects_a_minimum_per_site():
    order = [(0, 0), (0, 1), (0, 2), (1, 3), (0, 3)]
    assert select_heads(order, [4, 4], 3) == {0: [0, 1, 2]}
    assert select_heads(order, [4, 4], 3, min_heads_per_site=2) == {0: [0, 1], 1: [3]}
    with pytest.raises(ValueError, match="at most 3 can go"):
        select_heads(order, [4, 4], 4, min_heads_per_site=2)


# --- physical pruning --------------------------------------------------------------------------------


@pytest.mark.parametrize("family,impl", FAMILY_IMPLS)
def test_pruned_outputs_equal_gated_outputs(family, impl):
    model, batch = tiny_model(family, impl), tiny_batch(family)
    plan = non_uniform_plan(model)
    with head_gates(model) as gates:
        for site, heads in plan.items():
            gates[site][heads] = 0.0
        gated = logits(model, batch)
    params, flops = parameter_count(model), forward_flops(model, batch)
    prune_heads(model, plan)
    assert (logits(model, batch) - gated).abs().max() <= 1e-5
    sites = attention_sites(model)
    assert [s.num_heads for s in sites] == [4 - len(plan.get(i, [])) for i in range(len(sites))]
    removed_heads = sum(len(h) for h in plan.values())
    d_model, head_dim = sites[0].out_proj.out_features, 8
    assert params - parameter_count(model) == removed_heads * head_dim * (4 * d_model + 3)
    assert forward_flops(model, batch) < flops


@pytest.mark.parametrize("family", sorted(SEQ2SEQ))
def test_pruned_generate_equals_gated_generate(family):
    model, batch = tiny_model(family), tiny_batch(family)
    plan = non_uniform_plan(model)
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "max_new_tokens": 8}
    with head_gates(model) as gates:
        for site, heads in plan.items():
            gates[site][heads] = 0.0
        greedy = model.generate(**inputs, output_scores=True, return_dict_in_generate=True)
        beam = model.generate(**inputs, num_beams=3)
    prune_heads(model, plan)
    pruned = model.generate(**inputs, output_scores=True, return_dict_in_generate=True)
    assert torch.equal(pruned.sequences, greedy.sequences)
    assert max((a - b).abs().max() for a, b in zip(pruned.scores, greedy.scores, strict=True)) <= 1e-5
    assert torch.equal(model.generate(**inputs, num_beams=3), beam)


def test_successive_prunings_use_original_head_indices():
    once, twice, batch = tiny_model("bert"), tiny_model("bert"), tiny_batch("bert")
    prune_heads(once, {0: [1, 3]})
    prune_heads(twice, {0: [3]})
    prune_heads(twice, {0: [1]})
    assert attention_sites(twice)[0].kept_heads == [0, 2]
    assert torch.equal(logits(once, batch), logits(twice, batch))


@pytest.mark.parametrize(
    "plan,error,message",
    [
        ({7: [0]}, IndexError, r"site index 7 out of range: the model has 2 attention sites \(0..1\)"),
        ({1: [4]}, IndexError, r"site 1 \(encoder layer 1\): head 4 out of range; valid heads are 0..3"),
        ({0: [1]}, ValueError, r"site 0 \(encoder layer 0\): head 1 was already pruned; heads still present"),
    ],
)
def test_bad_pruning_plans_name_the_site_and_change_nothing(plan, error, message):
    model, batch = tiny_model("bert"), tiny_batch("bert")
    prune_heads(model, {0: [1]})
    before = logits(model, batch)
    with pytest.raises(error, match=message):
        prune_heads(model, {1: [0], **plan})
    assert [s.num_heads for s in attention_sites(model)] == [3, 4]
    assert torch.equal(logits(model, batch), before)


# --- save and load -----------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_pruned_model_round_trips_with_non_uniform_counts_and_an_empty_layer(family, tmp_path):
    impl = impl_for(family)
    model, batch = tiny_model(family, impl), tiny_batch(family)
    prune_heads(model, non_uniform_plan(model))
    save_model(model, tmp_path / "pruned")
    loaded = load_model(tmp_path / "pruned", attn_implementation=impl)
    assert [s.kept_heads for s in attention_sites(loaded)] == [s.kept_heads for s in attention_sites(model)]
    assert torch.equal(logits(loaded, batch), logits(model, batch))


def test_load_model_reads_an_ordinary_hugging_face_folder(tmp_path):
    model, batch = tiny_model("bert"), tiny_batch("bert")
    model.save_pretrained(tmp_path / "plain")
    loaded = load_model(tmp_path / "plain")
    assert type(loaded) is type(model) and torch.equal(logits(loaded, batch), logits(model, batch))


def test_saving_over_an_existing_folder_replaces_it(tmp_path):
    model, batch = tiny_model("bert"), tiny_batch("bert")
    save_model(model, tmp_path / "m")
    prune_heads(model, {0: [0]})
    save_model(model, tmp_path / "m")
    assert torch.equal(logits(load_model(tmp_path / "m"), batch), logits(model, batch))
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_a_record_that_does_not_match_the_weights_names_the_site(tmp_path):
    model = tiny_model("bert")
    prune_heads(model, {1: [0, 1]})
    save_model(model, tmp_path / "m")
    record = json.loads((tmp_path / "m" / PRUNING_FILE).read_text())
    record["sites"][1]["kept_heads"] = [1, 2, 3]
    (tmp_path / "m" / PRUNING_FILE).write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"site 1 \(encoder layer 1\) records 3 heads \(a \[24, 32\] query weight\), "
                                         r"but the weights hold a \[16, 32\] tensor"):
        load_model(tmp_path / "m")
