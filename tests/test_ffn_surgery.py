"""Specification of FFN neurons as prunable units beside heads: sites, gates, physical pruning, save/load.

Each feed-forward block is `fc_out(act(fc_in(x)))`; neuron i is row i of `fc_in` and column i of `fc_out`.
The guarantees are those of heads (tests/test_head_surgery.py), checked on the same tiny models of every family.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from pipeline.core.checkpoint import apply_pruning_record, load_model, pruning_record, save_model
from pipeline.core.flops import forward_flops, parameter_count
from pipeline.core.gates import Gates, head_gates, neuron_gates
from pipeline.core.importance import per_example_loss
from pipeline.core.sites import UnsupportedModelError, attention_sites, ffn_sites
from pipeline.core.surgery import prune_heads, prune_neurons
from pipeline.files.schema import PRUNING_FILE
from tests.tiny_models import (
    FAMILIES,
    FAMILY_IMPLS,
    SEQ2SEQ,
    impl_for,
    logits,
    non_uniform_plan,
    randomize_biases,
    tiny_batch,
    tiny_model,
)

NEURONS, HIDDEN = 37, 32  # the tiny models' FFN width and hidden size


def neuron_plan(model) -> dict[int, list[int]]:
    """Different counts per FFN site and one block emptied per stack. The emptied blocks (encoder layer 0,
    decoder layer 1) are not the layers `non_uniform_plan` empties of heads (encoder layer 1, decoder layer
    0's self-attention), so together the plans give a layer without heads and a layer without neurons."""
    plan = {0: list(range(NEURONS)), 1: list(range(0, NEURONS, 3))}
    if len(ffn_sites(model)) > 2:
        plan.update({2: [5, 6, 36], 3: list(range(NEURONS))})
    return plan


def mask(gates, plan) -> None:
    for site, units in plan.items():
        gates[site][units] = 0.0


def pruned_both_ways(family: str, impl: str | None = None):
    model = randomize_biases(tiny_model(family, impl or impl_for(family)))
    prune_heads(model, non_uniform_plan(model))
    return prune_neurons(model, neuron_plan(model))


def central_difference(loss, gate: torch.Tensor, index: tuple, eps: float = 1e-4) -> torch.Tensor:
    # eps 1e-4, not the heads' 1e-6: these tiny models' neuron gradients are ~1e-7, below the rounding that
    # 1e-6 leaves in a float64 loss of ~10 (~1e-9), while the loss is nearly linear in one gate.
    with torch.no_grad():
        gate[index] += eps
        up = loss()
        gate[index] -= 2 * eps
        down = loss()
        gate[index] += eps
    return (up - down) / (2 * eps)


# --- sites -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_ffn_sites_list_every_feed_forward_block_in_model_order(family):
    sites = ffn_sites(tiny_model(family, impl_for(family)))
    expected = [("encoder", 0), ("encoder", 1)] + ([("decoder", 0), ("decoder", 1)] if family in SEQ2SEQ else [])
    assert [(s.kind, s.layer) for s in sites] == expected
    assert [s.name for s in sites][:2] == ["encoder layer 0 FFN", "encoder layer 1 FFN"]
    for s in sites:
        assert (s.num_neurons, s.original_num_neurons, s.kept_neurons, s.batch_dim) == (
            NEURONS, NEURONS, list(range(NEURONS)), 0)
        assert (s.fc_in.in_features, s.fc_in.out_features, s.fc_out.in_features, s.fc_out.out_features) == (
            HIDDEN, NEURONS, NEURONS, HIDDEN)
    assert len({id(s.fc_in) for s in sites} | {id(s.fc_out) for s in sites}) == 2 * len(sites)


def test_ffn_sites_of_an_unsupported_model_name_its_class_and_the_supported_families():
    model = transformers.GPTNeoXModel(transformers.GPTNeoXConfig(num_hidden_layers=1, hidden_size=16,
                                                                 num_attention_heads=2, intermediate_size=16,
                                                                 vocab_size=50))
    with pytest.raises(UnsupportedModelError, match=r"GPTNeoXModel .*gpt_neox.*supported families: bart, bert"):
        ffn_sites(model)
    with pytest.raises(UnsupportedModelError), neuron_gates(model):
        pass


# --- gates -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family,impl", FAMILY_IMPLS)
def test_neuron_gates_at_one_are_bit_identical_and_a_zero_gate_changes_every_sites_output(family, impl):
    model, batch = tiny_model(family, impl), tiny_batch(family)
    reference = logits(model, batch)
    with neuron_gates(model) as gates:
        assert isinstance(gates, Gates)
        assert [(g.shape, g.dtype) for g in gates] == [((NEURONS,), torch.float32)] * len(ffn_sites(model))
        assert torch.equal(logits(model, batch), reference)
        for site in range(len(gates)):
            gates[site][5] = 0.0
            assert not torch.allclose(logits(model, batch), reference), f"site {site}"
            gates[site][5] = 1.0
    assert torch.equal(logits(model, batch), reference)
    assert all(not s.fc_out._forward_pre_hooks for s in ffn_sites(model))


def test_neuron_gates_stay_float32_under_a_bfloat16_model():
    model, batch = tiny_model("bert").to(torch.bfloat16), tiny_batch("bert")
    reference = logits(model, batch)
    with neuron_gates(model) as gates:
        assert all(g.dtype == torch.float32 for g in gates)
        assert torch.equal(logits(model, batch), reference)


@pytest.mark.parametrize("family", FAMILIES)
def test_neuron_gate_gradient_matches_float64_central_finite_difference(family):
    model, batch = randomize_biases(tiny_model(family, impl_for(family)).double()), tiny_batch(family)
    with neuron_gates(model, requires_grad=True) as gates:
        per_example_loss(model, batch).sum().backward()
        analytic = torch.cat([g.grad for g in gates])
        numeric = torch.stack([
            central_difference(lambda: per_example_loss(model, batch).sum(), gate, (n,))
            for gate in gates for n in range(gate.shape[0])
        ])
    assert analytic.abs().max() > 0
    assert (analytic - numeric).norm() / numeric.norm() <= 1e-5


@pytest.mark.parametrize("family", ["bert", "marian"])
def test_per_example_neuron_gates_match_finite_differences_and_each_examples_own_run(family):
    model, batch = randomize_biases(tiny_model(family).double()), tiny_batch(family, batch_size=3)
    with neuron_gates(model) as gates:
        leaves = gates.per_example(3)
        per_example_loss(model, batch).sum().backward()
        batched = [leaf.grad.clone() for leaf in leaves]  # [batch, neurons] per site
        # The total loss's derivative in example b's gate is example b's own: the gates never leak across examples.
        indices = [(b, n) for b in range(3) for n in (0, 17, 36)]
        for leaf, grad in zip(leaves, batched, strict=True):
            numeric = torch.stack([central_difference(lambda: per_example_loss(model, batch).sum(), leaf, index)
                                   for index in indices])
            analytic = torch.stack([grad[index] for index in indices])
            assert (analytic - numeric).norm() / numeric.norm() <= 1e-5
        for i in range(3):
            ones = gates.per_example(1)
            per_example_loss(model, {k: v[i : i + 1] for k, v in batch.items()}).sum().backward()
            for grad, one in zip(batched, ones, strict=True):
                assert torch.allclose(grad[i], one.grad[0], atol=1e-10)


# --- physical pruning --------------------------------------------------------------------------------


@pytest.mark.parametrize("family,impl", FAMILY_IMPLS)
def test_pruned_outputs_equal_gated_outputs_with_heads_and_neurons_pruned_together(family, impl):
    model, batch = randomize_biases(tiny_model(family, impl)), tiny_batch(family)
    heads, neurons = non_uniform_plan(model), neuron_plan(model)
    with head_gates(model) as h_gates, neuron_gates(model) as n_gates:
        mask(h_gates, heads)
        mask(n_gates, neurons)
        gated = logits(model, batch)
    prune_heads(model, heads)
    params, flops = parameter_count(model), forward_flops(model, batch)
    prune_neurons(model, neurons)
    assert (logits(model, batch) - gated).abs().max() <= 1e-5
    sites = ffn_sites(model)
    assert [s.kept_neurons for s in sites] == [
        [n for n in range(NEURONS) if n not in neurons.get(i, [])] for i in range(len(sites))]
    assert [s.fc_out.weight.shape[1] for s in sites] == [s.num_neurons for s in sites]
    # A neuron is HIDDEN weights and a bias in fc_in, HIDDEN weights in fc_out, and 2 * 2 * HIDDEN FLOPs per token.
    assert params - parameter_count(model) == sum(map(len, neurons.values())) * (2 * HIDDEN + 1)
    tokens = {"encoder": batch["input_ids"].numel(), "decoder": batch["labels"].numel()}
    assert flops - forward_flops(model, batch) == sum(
        4 * HIDDEN * len(neurons.get(i, [])) * tokens[s.kind] for i, s in enumerate(sites))


@pytest.mark.parametrize("family", sorted(SEQ2SEQ))
def test_pruned_generate_equals_gated_generate(family):
    model, batch = randomize_biases(tiny_model(family)), tiny_batch(family)
    heads, neurons = non_uniform_plan(model), neuron_plan(model)
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "max_new_tokens": 8}
    with head_gates(model) as h_gates, neuron_gates(model) as n_gates:
        mask(h_gates, heads)
        mask(n_gates, neurons)
        greedy = model.generate(**inputs, output_scores=True, return_dict_in_generate=True)
        beam = model.generate(**inputs, num_beams=3)
    prune_neurons(prune_heads(model, heads), neurons)
    pruned = model.generate(**inputs, output_scores=True, return_dict_in_generate=True)
    assert torch.equal(pruned.sequences, greedy.sequences)
    assert max((a - b).abs().max() for a, b in zip(pruned.scores, greedy.scores, strict=True)) <= 1e-5
    assert torch.equal(model.generate(**inputs, num_beams=3), beam)


@pytest.mark.parametrize("family", FAMILIES)
def test_an_emptied_ffn_block_outputs_its_second_linears_bias_and_still_backpropagates_and_gates(family):
    model, batch = randomize_biases(tiny_model(family, impl_for(family))), tiny_batch(family)
    prune_neurons(model, {0: range(NEURONS)})
    site = ffn_sites(model)[0]
    assert (site.fc_in.weight.shape, site.fc_out.weight.shape) == ((0, HIDDEN), (HIDDEN, 0))
    outputs = []
    handle = site.fc_out.register_forward_hook(lambda _m, _args, out: outputs.append(out))
    try:
        per_example_loss(model, batch).sum().backward()
    finally:
        handle.remove()
    assert site.fc_out.bias.abs().min() > 0
    assert torch.equal(outputs[0], site.fc_out.bias.expand_as(outputs[0]))
    assert site.fc_out.bias.grad.abs().max() > 0 and site.fc_in.weight.grad.shape == (0, HIDDEN)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    # Gates on a model with an emptied block: an empty gate there, the others' per-example gradients as ever.
    with neuron_gates(model) as gates:
        leaves = gates.per_example(batch["labels"].shape[0])
        per_example_loss(model, batch).sum().backward()
    assert leaves[0].shape == (3, 0) and leaves[1].grad.abs().max() > 0


def test_successive_neuron_prunings_use_original_indices():
    once, twice, batch = tiny_model("bert"), tiny_model("bert"), tiny_batch("bert")
    prune_neurons(once, {0: [3, 30]})
    prune_neurons(twice, {0: [30]})
    prune_neurons(twice, {0: [3]})
    assert ffn_sites(twice)[0].kept_neurons == [n for n in range(NEURONS) if n not in (3, 30)]
    assert ffn_sites(twice)[0].original_num_neurons == NEURONS
    assert torch.equal(logits(once, batch), logits(twice, batch))


@pytest.mark.parametrize(
    "plan,error,message",
    [
        ({7: [0]}, IndexError, r"site index 7 out of range: the model has 2 FFN sites \(0..1\)"),
        ({"0": [0]}, IndexError, r"site index '0' out of range"),
        ({1: [37]}, IndexError, r"site 1 \(encoder layer 1 FFN\): neuron 37 out of range; valid neurons are 0..36"),
        ({1: [-1]}, IndexError, r"site 1 \(encoder layer 1 FFN\): neuron -1 out of range"),
        ({0: [2]}, ValueError,
         r"site 0 \(encoder layer 0 FFN\): neuron 2 was already pruned; 34 neurons still present"),
    ],
)
def test_bad_neuron_plans_name_the_site_and_change_nothing(plan, error, message):
    model, batch = tiny_model("bert"), tiny_batch("bert")
    prune_neurons(model, {0: [1, 2, 3]})
    before = logits(model, batch)
    with pytest.raises(error, match=message):
        prune_neurons(model, {1: [0], **plan})
    assert [s.num_neurons for s in ffn_sites(model)] == [34, 37]
    assert torch.equal(logits(model, batch), before)


# --- save and load -----------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_a_model_pruned_in_heads_and_neurons_reloads_exactly(family, tmp_path):
    model, batch = pruned_both_ways(family), tiny_batch(family)
    save_model(model, tmp_path / "pruned")
    record = json.loads((tmp_path / "pruned" / PRUNING_FILE).read_text())
    assert record["format_version"] == 2
    assert record["ffn_sites"][0] == {"kind": "encoder", "layer": 0, "original_num_neurons": NEURONS,
                                      "kept_neurons": []}
    loaded = load_model(tmp_path / "pruned", attn_implementation=impl_for(family))
    assert pruning_record(loaded) == pruning_record(model)
    assert torch.equal(logits(loaded, batch), logits(model, batch))
    state = model.state_dict()
    assert all(torch.equal(v, state[k]) for k, v in loaded.state_dict().items())


def test_a_version_1_record_loads_with_every_neuron(tmp_path):
    model, batch = tiny_model("bert"), tiny_batch("bert")
    prune_heads(model, {0: [1]})
    save_model(model, tmp_path / "m")
    record_file = tmp_path / "m" / PRUNING_FILE
    record = json.loads(record_file.read_text())
    del record["ffn_sites"]
    record_file.write_text(json.dumps({**record, "format_version": 1}))
    loaded = load_model(tmp_path / "m")
    assert [s.kept_heads for s in attention_sites(loaded)] == [[0, 2, 3], [0, 1, 2, 3]]
    assert [s.num_neurons for s in ffn_sites(loaded)] == [NEURONS, NEURONS]
    assert torch.equal(logits(loaded, batch), logits(model, batch))


def _set(key, index, field, value):
    def edit(record):
        record[key][index][field] = value
    return edit


@pytest.mark.parametrize(
    "edit,message",
    [
        (_set("ffn_sites", 1, "kept_neurons", list(range(1, 29))),
         r"FFN site 1 \(encoder layer 1 FFN\) records 28 neurons \(a \[28, 32\] weight\), "
         r"but the weights hold a \[27, 32\] tensor for "
         r"bert\.encoder\.layer\.1\.intermediate\.dense\.weight"),
        (_set("ffn_sites", 1, "kind", "decoder"),
         r"'ffn_sites' entry 1 is recorded as decoder layer 1 but the model has encoder layer 1 FFN there"),
        (_set("ffn_sites", 0, "original_num_neurons", 40),
         r"'ffn_sites' entry 0 \(encoder layer 0 FFN\) records 40 neurons originally but the model has 37"),
        (_set("ffn_sites", 1, "kept_neurons", [5, 3]), r"kept_neurons must be ascending original indices"),
        (_set("ffn_sites", 1, "kept_neurons", [3, 99]), r"kept_neurons must be ascending original indices"),
        (_set("sites", 0, "original_num_heads", 8),
         r"'sites' entry 0 \(encoder layer 0\) records 8 heads originally but the model has 4"),
        (lambda r: r["ffn_sites"][1].pop("layer"), r"'ffn_sites' entry 1 lacks kind, layer"),
        (lambda r: r["ffn_sites"].pop(), r"records 1 entries in 'ffn_sites' but the model has 2"),
        (lambda r: r.pop("ffn_sites"), r"the pruning record has no 'ffn_sites' list"),
        (lambda r: r.update(format_version=3), r"unsupported format_version 3; this version reads 1, 2"),
    ],
)
def test_a_corrupt_or_mismatched_record_is_refused_with_the_site_it_disagrees_on(edit, message, tmp_path):
    model = tiny_model("bert")
    prune_heads(model, {1: [0, 1]})
    prune_neurons(model, {1: range(10)})
    save_model(model, tmp_path / "m")
    record_file = tmp_path / "m" / PRUNING_FILE
    record = json.loads(record_file.read_text())
    edit(record)
    record_file.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=rf"{PRUNING_FILE}:? .*{message}"):
        load_model(tmp_path / "m")


def test_a_record_that_is_not_json_is_refused_with_its_path(tmp_path):
    save_model(tiny_model("bert"), tmp_path / "m")
    (tmp_path / "m" / PRUNING_FILE).write_text('{"format_version": 2, "sites": [')
    with pytest.raises(ValueError, match=rf"{PRUNING_FILE}: not a valid pruning record \(bad JSON"):
        load_model(tmp_path / "m")


def test_apply_pruning_record_takes_a_fresh_or_partly_pruned_model_to_the_record():
    pruned, batch = pruned_both_ways("marian"), tiny_batch("marian")
    record = pruning_record(pruned)
    fresh = tiny_model("marian", seed=1)
    assert apply_pruning_record(fresh, record, "record") is fresh
    assert pruning_record(fresh) == record
    fresh.load_state_dict(pruned.state_dict())
    assert torch.equal(logits(fresh, batch), logits(pruned, batch))

    partly = tiny_model("marian")
    prune_heads(partly, {0: [1]})
    prune_neurons(partly, {1: [0, 3]})
    assert pruning_record(apply_pruning_record(partly, record, "record")) == record


def test_a_record_that_keeps_what_the_model_no_longer_has_changes_nothing():
    model, batch = tiny_model("marian"), tiny_batch("marian")
    prune_neurons(model, {2: [4]})
    before = pruning_record(model)
    record = pruning_record(tiny_model("marian"))  # heads fine, but keeps neuron 4 of decoder layer 0
    record["sites"][0]["kept_heads"] = [0, 1]
    with pytest.raises(ValueError, match=r"record: 'ffn_sites' entry 2 \(decoder layer 0 FFN\): kept_neurons"):
        apply_pruning_record(model, record, "record")
    assert pruning_record(model) == before  # the heads, valid alone, were not pruned either
    assert torch.equal(logits(model, batch), logits(prune_neurons(tiny_model("marian"), {2: [4]}), batch))
