"""Specification of the head-surgery core on decoder-only language models: Llama, Qwen2, Qwen3, Mistral and
Gemma 3 (grouped-query attention, head_dim != hidden / heads; Gemma 3 with sliding-window layers shorter than the
sequences), OPT and GPT-2 (multi-head attention; GPT-2's fused Conv1D projections)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F

from pipeline.core.checkpoint import load_model, save_model, stock_config
from pipeline.core.gates import head_gates, neuron_gates
from pipeline.core.importance import (
    HeadChoice,
    head_importance,
    per_example_loss,
    random_order,
    rank_heads,
    select_heads,
    token_head_importance,
)
from pipeline.core.sites import attention_sites, family_of, ffn_sites, is_decoder_only, layer_stack, pre_norms
from pipeline.core.surgery import prune_heads, prune_neurons
from pipeline.files.schema import PRUNING_FILE
from pipeline.methods.budgeted_search import gate_gradients
from pipeline.methods.pruning import reestimated_plans
from tests.tiny_models import (
    GQA,
    LM_FAMILIES,
    assert_per_example_gradients_are_each_examples_own,
    logits,
    randomize_biases,
    tiny_batch,
    tiny_model,
)

IMPLS = [(family, impl) for family in LM_FAMILIES for impl in ("sdpa", "eager")]


def lm(family: str, impl: str = "sdpa"):
    return randomize_biases(tiny_model(family, impl))


def grouped_plan(model) -> dict[int, list[int]]:
    """Layers pruned unequally and layer 1 emptied; every key/value group keeps as many query heads as the others:
    layer 0 loses one query head from each group, layer 2 its first whole group."""
    sites = attention_sites(model)
    first_of_each = [site_groups[0] for site_groups in sites[0].head_groups]
    return {0: first_of_each, 1: list(range(sites[1].num_heads)), 2: sites[2].head_groups[0]}


@contextmanager
def masked(model, plan: dict[int, list[int]]) -> Iterator[None]:
    """A context in which the heads of `plan` are gated to zero."""
    with head_gates(model) as gates:
        for site, heads in plan.items():
            gates[site][heads] = 0.0
        yield


# --- sites -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", LM_FAMILIES)
def test_sites_are_the_decoder_self_attentions_with_their_key_value_groups(family):
    model = tiny_model(family)
    sites = attention_sites(model)
    assert [(s.kind, s.layer) for s in sites] == [("decoder", 0), ("decoder", 1), ("decoder", 2)]
    assert is_decoder_only(model) and not is_decoder_only(tiny_model("marian"))
    if family in GQA:
        kv = 4 if family == "mistral" else 2
        assert [(s.num_heads, s.num_kv_heads, s.head_dim) for s in sites] == [(8, kv, 6)] * 3
        assert sites[0].head_groups == [list(range(g * 8 // kv, (g + 1) * 8 // kv)) for g in range(kv)]
    else:
        assert [(s.num_heads, s.num_kv_heads, s.head_dim) for s in sites] == [(4, 4, 8)] * 3
        assert sites[0].head_groups == [[0], [1], [2], [3]]
    assert [f.num_neurons for f in ffn_sites(model)] == [37] * 3
    assert (ffn_sites(model)[0].fc_gate is not None) == (family in GQA)  # SwiGLU's gate_proj


def added_to_the_residual(model, layer: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The modules whose outputs the residual adds: the output projections, or Gemma 3's norms on them."""
    if family_of(model).normed_outputs:
        block = layer_stack(model, "decoder")[layer]
        return block.post_attention_layernorm, block.post_feedforward_layernorm
    return attention_sites(model)[layer].out_proj, ffn_sites(model)[layer].fc_out


@pytest.mark.parametrize("family", LM_FAMILIES)
def test_pre_norms_read_the_residual_stream_that_each_sublayer_adds_its_output_to(family):
    # What budgeted tuning relies on (pipeline.methods.budgeted_tuning.tune): layer input + attention's contribution
    # is the FFN pre-norm's input, and that + the FFN's contribution is the next layer's input.
    model, batch = lm(family), tiny_batch(family)
    seen: dict[torch.nn.Module, torch.Tensor] = {}
    watched = [m for i, norms in enumerate(pre_norms(model)) for m in (*norms, *added_to_the_residual(model, i))]
    handles = [m.register_forward_hook(lambda m, args, out: seen.update({m: (args[0], out)})) for m in watched]
    with torch.no_grad():
        layer_inputs = model(input_ids=batch["input_ids"], output_hidden_states=True).hidden_states
    for handle in handles:
        handle.remove()
    tokens = [t.reshape(-1, t.shape[-1]) for t in layer_inputs]  # OPT runs its FFN on `[batch * seq, hidden]`
    for i, (attention_norm, ffn_norm) in enumerate(pre_norms(model)):
        attention_out, ffn_out = (seen[m][1].reshape(tokens[i].shape) for m in added_to_the_residual(model, i))
        ffn_input = seen[ffn_norm][0].reshape(tokens[i].shape)
        assert torch.equal(seen[attention_norm][0].reshape(tokens[i].shape), tokens[i])
        torch.testing.assert_close(ffn_input, tokens[i] + attention_out)
        if i + 1 < len(tokens) - 1:  # the last entry is after the final norm
            torch.testing.assert_close(tokens[i + 1], ffn_input + ffn_out)


# --- gates and their gradients ----------------------------------------------------------------------------


@pytest.mark.parametrize("family,impl", IMPLS)
def test_gates_at_one_are_bit_identical_to_no_gates(family, impl):
    model, batch = lm(family, impl), tiny_batch(family)
    reference = logits(model, batch)
    with head_gates(model), neuron_gates(model):
        assert torch.equal(logits(model, batch), reference)
    with head_gates(model) as gates:
        gates[0][1] = 0.0
        assert not torch.allclose(logits(model, batch), reference)
    assert torch.equal(logits(model, batch), reference)


def _rms_norm_in_float64(m, x):
    if hasattr(m, "variance_epsilon"):  # Llama's RMSNorm and its copies scale by the weight
        return m.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.variance_epsilon)
    return (1 + m.weight) * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.eps)  # Gemma's by 1 + the weight


def in_float64(model):
    """`model` in float64 throughout: RMSNorm (and eager attention's softmax) compute in float32 by design, which
    would put float32 noise into the finite differences; these modules' float64 forwards are the same formula."""
    model = model.double()
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = types.MethodType(_rms_norm_in_float64, module)
    return model


def _finite_difference(model, batch, gates, eps: float = 1e-6) -> torch.Tensor:
    numeric = []
    with torch.no_grad():
        for gate in gates:
            for h in range(gate.shape[-1]):
                gate[..., h] += eps
                up = per_example_loss(model, batch).sum()
                gate[..., h] -= 2 * eps
                down = per_example_loss(model, batch).sum()
                gate[..., h] += eps
                numeric.append((up - down) / (2 * eps))
    return torch.stack(numeric)


@pytest.mark.parametrize("family", LM_FAMILIES)
def test_head_and_neuron_gate_gradients_match_float64_central_finite_differences(family):
    model, batch = in_float64(lm(family, "sdpa")), tiny_batch(family)
    with head_gates(model, requires_grad=True) as heads, neuron_gates(model, requires_grad=True) as neurons:
        per_example_loss(model, batch).sum().backward()
        analytic = torch.cat([g.grad for g in [*heads, *neurons]])
        numeric = _finite_difference(model, batch, [*heads, *neurons]).to(analytic.dtype)
    assert analytic.abs().max() > 0
    assert (analytic - numeric).norm() / numeric.norm() <= 1e-4


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_per_example_gates_give_each_examples_own_gradient_in_one_backward(family):
    assert_per_example_gradients_are_each_examples_own(in_float64(lm(family, "sdpa")), tiny_batch(family, batch_size=3))


def test_the_loss_of_a_causal_lm_is_each_examples_mean_next_token_nll_with_padding_masked():
    model, batch = lm("llama"), tiny_batch("llama", batch_size=3)
    losses = per_example_loss(model, batch)
    for i in range(3):
        tokens = int(batch["attention_mask"][i].sum())
        single = {"input_ids": batch["input_ids"][i : i + 1, :tokens], "labels": batch["input_ids"][i : i + 1, :tokens]}
        assert torch.allclose(losses[i], model(**single).loss, atol=1e-6)  # Hugging Face's own shifted loss
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    first = F.cross_entropy(out[0, :-1], batch["input_ids"][0, 1:])
    assert torch.allclose(losses[0], first, atol=1e-6)


# --- physical pruning ----------------------------------------------------------------------------------


@pytest.mark.parametrize("family,impl", IMPLS)
def test_pruned_equals_gated_for_logits_greedy_and_beam_generation_with_the_kv_cache(family, impl):
    model, batch = lm(family, impl), tiny_batch(family)
    plan = grouped_plan(model)
    prompt = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "max_new_tokens": 6,
              "do_sample": False, "pad_token_id": 0}
    with masked(model, plan):
        gated = logits(model, batch)
        greedy = model.generate(**prompt, output_scores=True, return_dict_in_generate=True)
        beam = model.generate(**prompt, num_beams=3)
    prune_heads(model, plan)
    assert (logits(model, batch) - gated).abs().max() <= 1e-5
    pruned = model.generate(**prompt, output_scores=True, return_dict_in_generate=True)
    assert torch.equal(pruned.sequences, greedy.sequences)
    assert max((a - b).abs().max() for a, b in zip(pruned.scores, greedy.scores, strict=True)) <= 1e-5
    assert torch.equal(model.generate(**prompt, num_beams=3), beam)


@pytest.mark.parametrize("family", sorted(GQA))
def test_a_key_value_head_goes_with_the_last_query_head_of_its_group(family):
    model = lm(family)
    site = attention_sites(model)[2]
    kv_before, rows = site.num_kv_heads, site.projections[1].out_features
    prune_heads(model, {2: site.head_groups[0]})
    site = attention_sites(model)[2]
    assert site.num_kv_heads == kv_before - 1 == len(site.kept_kv_heads)
    assert site.kept_kv_heads == list(range(1, kv_before))
    assert site.projections[1].out_features == site.projections[2].out_features == rows - site.head_dim
    # The attention repeats each key/value head as often as the kept query heads need.
    assert site.module.num_key_value_groups == site.num_heads // site.num_kv_heads


@pytest.mark.parametrize("family", sorted(GQA))
def test_a_plan_that_leaves_unequal_groups_is_refused_naming_the_layer_and_sizes_and_changes_nothing(family):
    model, batch = lm(family), tiny_batch(family)
    before = logits(model, batch)
    group = attention_sites(model)[1].head_groups[0]
    sizes = [len(group) - 1] + [len(group)] * (attention_sites(model)[1].num_kv_heads - 1)
    with pytest.raises(ValueError, match=re.escape(f"site 1 (decoder layer 1): grouped-query attention needs every "
                                                   f"key/value head to keep the same number of query heads, but this "
                                                   f"plan leaves groups of {sizes}")):
        prune_heads(model, {0: attention_sites(model)[0].head_groups[0], 1: [group[0]]})
    assert [s.num_heads for s in attention_sites(model)] == [8, 8, 8]
    assert torch.equal(logits(model, batch), before)


@pytest.mark.parametrize("family", LM_FAMILIES)
def test_pruning_gated_mlp_neurons_removes_their_rows_of_both_input_linears_and_columns_of_the_output(family):
    model, batch = lm(family), tiny_batch(family)
    plan = {0: [0, 5, 36], 1: list(range(37))}
    with neuron_gates(model) as gates:
        for site, neurons in plan.items():
            gates[site][neurons] = 0.0
        gated = logits(model, batch)
    prune_neurons(model, plan)
    assert (logits(model, batch) - gated).abs().max() <= 1e-5
    site = ffn_sites(model)[0]
    assert site.num_neurons == 34 and all(
        (fc.weight.shape[0] if isinstance(fc, torch.nn.Linear) else fc.weight.shape[1]) == 34 for fc in site.inputs)


# --- choosing heads in whole units -------------------------------------------------------------------------


def test_unit_query_takes_the_same_number_of_query_heads_from_every_group_and_unit_group_whole_groups():
    scores = [torch.tensor([0.1, 0.5, 0.2, 0.9, 0.3, 0.4, 0.8, 0.05]), torch.tensor([0.6, 0.7, 0.1, 0.2, 0.3, 0.9,
                                                                                     0.4, 0.5])]
    groups = [[[0, 1, 2, 3], [4, 5, 6, 7]]] * 2
    query = rank_heads(scores, groups, "query")
    # Layer 0's first unit: its lowest head of each group (0 and 7), 0.15 together; layer 1's: 2 and 4, 0.4.
    assert query[:4] == [(0, 0), (0, 7), (1, 2), (1, 4)]
    assert select_heads(query, [8, 8], 3, groups=groups) == {0: [0, 7]}  # whole units only: 2 of the 3
    assert select_heads(query, [8, 8], 8, groups=groups) == {0: [0, 2, 4, 7], 1: [2, 3, 4, 6]}
    group = rank_heads(scores, groups, "group")
    # Group sums: layer 0 [1.7, 1.55], layer 1 [1.6, 2.1]: layer 0's second group goes first.
    assert group[:4] == [(0, 4), (0, 5), (0, 6), (0, 7)]
    assert select_heads(group, [8, 8], 8, groups=groups, unit="group") == {0: [4, 5, 6, 7], 1: [0, 1, 2, 3]}
    # uniform: the same count from every layer, so that every layer keeps one shape.
    assert select_heads(query, [8, 8], 4, groups=groups, uniform=True) == {0: [0, 7], 1: [2, 4]}
    assert select_heads(group, [8, 8], 4, groups=groups, uniform=True, unit="group") == {}


def test_multi_head_attention_ranks_and_selects_as_before_units_existed():
    scores = [torch.tensor([0.3, 0.1, 0.2]), torch.tensor([0.05, 0.4, 0.25])]
    assert rank_heads(scores) == [(1, 0), (0, 1), (0, 2), (1, 2), (0, 0), (1, 1)]
    assert rank_heads(scores, [[[0], [1], [2]]] * 2, "group") == rank_heads(scores)
    # Multi-head attention is heads as whole groups of one.
    assert random_order([3, 3], seed=4) == random_order([3, 3], seed=4, groups=[[[0], [1], [2]]] * 2, unit="group")


@pytest.mark.parametrize("unit", ["query", "group"])
@pytest.mark.parametrize("uniform", [False, True])
def test_every_selection_of_importance_or_random_order_prunes_physically(unit, uniform):
    model = lm("llama")
    sites = attention_sites(model)
    groups, num_heads = [s.head_groups for s in sites], [s.num_heads for s in sites]
    scores = [torch.rand(n, generator=torch.Generator().manual_seed(i)) for i, n in enumerate(num_heads)]
    for order in (rank_heads(scores, groups, unit), random_order(num_heads, 0, groups, unit)):
        for count in range(0, sum(num_heads) + 1, 3):
            plan = select_heads(order, num_heads, count, groups=groups, uniform=uniform, unit=unit)
            assert count - sum(map(len, plan.values())) < (4 if unit == "group" else 2) * (3 if uniform else 1)
            pruned = prune_heads(lm("llama"), plan)
            if uniform:
                assert len({s.num_heads for s in attention_sites(pruned)}) == 1
            for site in attention_sites(pruned):  # whole units: equal groups, or groups whole or gone
                sizes = [len(group) for group in site.head_groups]
                assert len(set(sizes)) <= 1 and (unit == "query" or set(sizes) <= {4})
                assert unit == "group" or site.num_kv_heads in (0, 2)


@pytest.mark.parametrize("unit", ["query", "group"])
def test_every_random_seed_removes_the_same_number_of_heads_at_every_count(unit):
    sites = attention_sites(lm("llama"))
    choice = HeadChoice(unit)
    for count in range(sum(s.num_heads for s in sites) + 1):
        removed = {sum(map(len, choice.select(choice.random(sites, seed), sites, count).values()))
                   for seed in range(4)}
        assert len(removed) == 1 and count - removed.pop() < (4 if unit == "group" else 2)


# --- save and load -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", LM_FAMILIES)
def test_a_non_uniformly_pruned_model_round_trips_exactly_in_the_projects_format(family, tmp_path):
    model, batch = lm(family), tiny_batch(family)
    prune_neurons(prune_heads(model, grouped_plan(model)), {0: [1, 2], 2: [0]})
    save_model(model, tmp_path / "m")
    record = json.loads((tmp_path / "m" / PRUNING_FILE).read_text())
    assert record["stock"] is False and "layers differ" in record["not_stock_because"]
    loaded = load_model(tmp_path / "m")
    assert [s.kept_heads for s in attention_sites(loaded)] == [s.kept_heads for s in attention_sites(model)]
    assert torch.equal(logits(loaded, batch), logits(model, batch))


UNIFORM = {  # per family, a uniform plan whose shape the family's own config describes
    "llama": [0, 1, 4, 5],  # 4 of 8 query heads (4 divides hidden_size 32, as LlamaConfig demands), 2 KV heads
    "qwen2": [0, 4],  # 6 query heads on 2 KV heads: Qwen2Config takes head_dim as given
    "qwen3": [0, 1, 2, 3],  # one whole group: 4 query heads on 1 KV head
    "mistral": [0, 1, 2, 3],  # two whole groups of 2: 4 query heads on 2 KV heads
    "gemma3_text": [0, 1, 4, 5],  # as Llama: Gemma3TextConfig also demands that the heads divide hidden_size
}


@pytest.mark.slow  # a fresh Python process per family
@pytest.mark.parametrize("family", sorted(UNIFORM))
def test_a_uniformly_pruned_gqa_model_loads_with_stock_from_pretrained_in_a_fresh_process(family, tmp_path):
    model, batch = lm(family), tiny_batch(family)
    prune_neurons(prune_heads(model, {s: UNIFORM[family] for s in range(3)}), {s: [3, 7] for s in range(3)})
    save_model(model, tmp_path / "m")
    assert json.loads((tmp_path / "m" / PRUNING_FILE).read_text())["stock"] is True
    torch.save({"batch": batch, "logits": logits(model, batch)}, tmp_path / "expected.pt")
    # No project code: a plain Python in another directory, transformers alone.
    script = ("import sys, torch, transformers\n"
              "model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()\n"
              "expected = torch.load(sys.argv[2])\n"
              "batch = {k: v for k, v in expected['batch'].items() if k != 'labels'}\n"
              "with torch.no_grad():\n"
              "    assert torch.equal(model(**batch).logits, expected['logits'])\n"
              "print(type(model).__name__, model.config.num_attention_heads, model.config.num_key_value_heads)\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "m"), str(tmp_path / "expected.pt")],
                          cwd=tmp_path, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin",
                                                                               "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[1:] == [str(8 - len(UNIFORM[family])), str(attention_sites(model)[0].num_kv_heads)]
    # And this project reads it back with the original indices, so later plans still name original heads.
    loaded = load_model(tmp_path / "m")
    assert [s.kept_heads for s in attention_sites(loaded)] == [s.kept_heads for s in attention_sites(model)]
    assert [f.kept_neurons for f in ffn_sites(loaded)] == [f.kept_neurons for f in ffn_sites(model)]
    site = attention_sites(loaded)[0]
    later = {0: [site.kept_heads[group[0]] for group in site.head_groups]}
    assert torch.equal(logits(prune_heads(loaded, later), batch), logits(prune_heads(model, later), batch))


@pytest.mark.parametrize("family,why", [
    ("llama", r"LlamaConfig refuses .*'num_attention_heads': 6.*not a multiple of the number of attention heads"),
    ("gemma3_text", r"Gemma3TextConfig refuses .*'num_attention_heads': 6.*not a multiple of the number of attention"),
    ("gpt2", r"GPT2Config refuses .*'n_head': 3"),
    ("opt", r"OPTConfig refuses .*'num_attention_heads': 3"),
])
def test_a_shape_the_family_config_cannot_say_is_saved_in_the_projects_format_with_the_reason(family, why, tmp_path):
    model, batch = lm(family), tiny_batch(family)
    plan = {s: [0, 4] for s in range(3)} if family in ("llama", "gemma3_text") else {s: [0] for s in range(3)}
    prune_heads(model, plan)
    config, reason = stock_config(model)
    assert config is None and re.search(why, reason), reason
    save_model(model, tmp_path / "m")
    assert json.loads((tmp_path / "m" / PRUNING_FILE).read_text())["not_stock_because"] == reason
    assert torch.equal(logits(load_model(tmp_path / "m"), batch), logits(model, batch))


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_importance_of_a_model_with_an_emptied_layer_scores_that_layer_as_empty(family):
    model = prune_heads(lm(family) if family == "llama" else tiny_model(family), {1: list(range(
        attention_sites(tiny_model(family))[1].num_heads))})
    scores = head_importance(model, [tiny_batch(family)], progress=False)
    assert [len(s) for s in scores] == [site.num_heads for site in attention_sites(model)]
    assert len(scores[1]) == 0 and scores[0].abs().sum() > 0
    gradients = gate_gradients(model, [tiny_batch(family)], progress=False)
    assert gradients.heads[1].shape[1] == 0


def test_re_estimated_pruning_of_a_gqa_model_goes_in_whole_slices_down_to_one_head_per_group():
    model, batch = lm("llama"), tiny_batch("llama", batch_size=4)
    plans = list(reestimated_plans(model, [batch], [0, 5, 9, 13, 17, 21, 24], normalize_p=2.0,
                                   choice=HeadChoice("query")))
    assert [sum(map(len, plan.values())) for plan in plans] == [0, 4, 8, 12, 16, 20, 24]
    for plan in plans:  # each layer in whole slices: as many heads from each of its two groups
        for heads in plan.values():
            assert sum(h < 4 for h in heads) == sum(h >= 4 for h in heads)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_per_token_importance_comes_with_the_papers_per_example_estimate_from_the_same_backward(family):
    model, batch = in_float64(lm(family)), tiny_batch(family, batch_size=3)
    per_token, per_example = token_head_importance(model, [batch], progress=False)
    paper = head_importance(model, [batch], progress=False)
    assert all(torch.allclose(a, b) for a, b in zip(per_example, paper, strict=True))
    # Per token, no example's positions cancel: the mean of |g_t| over real tokens bounds |sum_t g_t| / tokens.
    tokens = int(batch["attention_mask"].sum())
    for token_scores, example_scores in zip(per_token, per_example, strict=True):
        assert (token_scores * tokens >= example_scores * 3 - 1e-12).all() and token_scores.abs().sum() > 0


def test_per_position_gates_at_one_change_nothing_and_at_zero_mask_a_head_at_that_position_only():
    model, batch = lm("llama"), tiny_batch("llama", batch_size=2)
    size, length = batch["input_ids"].shape
    with head_gates(model) as gates:
        gates.per_position(size, length)
        assert torch.equal(logits(model, batch), logits(lm("llama"), batch))
        with torch.no_grad():
            gates[0][:, length - 1, 0] = 0.0  # head 0 of layer 0 at the last position: nothing earlier may move
        masked_logits = logits(model, batch)
    assert torch.equal(masked_logits[:, : length - 1], logits(lm("llama"), batch)[:, : length - 1])
    assert not torch.equal(masked_logits[:, length - 1], logits(lm("llama"), batch)[:, length - 1])
