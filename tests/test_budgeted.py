"""Specification of budgeted pruning (Kwon et al., 2022; pipeline/methods/budgeted*.py) on tiny random models:
Fisher gradients, unit costs, the budgeted search, the greedy rearrangement, least-squares tuning, and the whole
method."""

from __future__ import annotations

import copy

import pytest
import torch
from scipy import stats

from pipeline.core.checkpoint import load_model, save_model
from pipeline.core.flops import forward_flops
from pipeline.core.importance import PAPER_CHOICE, HeadChoice, per_example_loss
from pipeline.core.sites import attention_sites, ffn_sites
from pipeline.core.surgery import prune_heads, prune_neurons
from pipeline.files.schema import BUDGETED, BUDGETED_HEADS, BUDGETED_METHODS, BUDGETED_TUNED
from pipeline.methods.budgeted import budgeted_prune, pruned_model
from pipeline.methods.budgeted_costs import UnitCosts, flop_costs
from pipeline.methods.budgeted_latency import latency_costs, latency_table
from pipeline.methods.budgeted_search import (
    SWITCH_SIGNIFICANCE,
    BudgetError,
    Candidate,
    Selection,
    calibration_loss,
    calibration_losses,
    gate_gradients,
    held_out_choice,
    per_layer_normalised,
    rearrange,
    rearrange_site,
    search,
)
from pipeline.methods.budgeted_tuning import tune
from pipeline.methods.comparison import paper_plan_at_cost
from pipeline.methods.pruning import pruned_copy
from tests.tiny_models import SEQ2SEQ, tiny_batch, tiny_model

ENCODERS = ["bert", "distilbert", "mpnet", "roberta"]


def batches(family: str, count: int = 3, size: int = 4) -> list[dict]:
    return [tiny_batch(family, batch_size=size, length=9, seed=seed) for seed in range(count)]


def probe(family: str) -> dict:
    """Forward inputs; a translation model gets its labels too, from which it builds the decoder's inputs."""
    batch = tiny_batch(family, batch_size=2, length=9)
    return batch if family in SEQ2SEQ else {k: v for k, v in batch.items() if k != "labels"}


def removed_objective(gradients: torch.Tensor, kept: list[int]) -> float:
    """Kwon's loss model for removing the other units: sum over examples of (sum of their gradients)^2."""
    removed = sorted(set(range(gradients.shape[1])) - set(kept))
    return float(gradients[:, removed].sum(dim=1).pow(2).sum())


@pytest.mark.parametrize("family", ["bert", "marian"])
def test_gate_gradients_are_each_examples_own_gradient(family):
    model = tiny_model(family, attn_implementation="eager")
    batch = tiny_batch(family, batch_size=3, length=7)
    trainable = [p.requires_grad for p in model.parameters()]
    gradients = gate_gradients(model, [batch], progress=False)
    assert [g.shape for g in gradients.heads] == [(3, s.num_heads) for s in attention_sites(model)]
    assert [g.shape for g in gradients.neurons] == [(3, s.num_neurons) for s in ffn_sites(model)]
    # Example 1 alone, through the same gates: its row of the batched per-example gradients.
    from pipeline.core.gates import head_gates, neuron_gates

    alone = {k: v[1:2] for k, v in batch.items()}
    with head_gates(model, requires_grad=True) as h, neuron_gates(model, requires_grad=True) as n:
        per_example_loss(model, alone).sum().backward()
        for site, gate in enumerate(h):
            torch.testing.assert_close(gradients.heads[site][1], gate.grad, rtol=1e-4, atol=1e-6)
        for site, gate in enumerate(n):
            torch.testing.assert_close(gradients.neurons[site][1], gate.grad, rtol=1e-4, atol=1e-6)
    fisher_heads, fisher_neurons = gradients.fisher()
    torch.testing.assert_close(fisher_heads[0], gradients.heads[0].pow(2).sum(0))
    assert [p.requires_grad for p in model.parameters()] == trainable, "parameters are unfrozen afterwards"


@pytest.mark.parametrize("family", ["bert", "distilbert", "marian"])
def test_flop_costs_add_up_to_the_pruned_models_flops(family):
    model = tiny_model(family, attn_implementation="eager")
    inputs = probe(family)
    costs = flop_costs(model, inputs)
    assert costs.cost(costs.head_counts, costs.neuron_counts) == pytest.approx(costs.total)
    head_plan = {0: [0, 2], len(costs.head) - 1: [0, 1, 2, 3]}
    neuron_plan = {0: list(range(10)), len(costs.neuron) - 1: list(range(37))}
    pruned = prune_neurons(prune_heads(copy.deepcopy(model), head_plan), neuron_plan)
    heads = [s.num_heads for s in attention_sites(pruned)]
    neurons = [s.num_neurons for s in ffn_sites(pruned)]
    assert costs.cost(heads, neurons) == pytest.approx(forward_flops(pruned, inputs), rel=1e-9)


def _costs(heads: list[int], neurons: list[int], head_cost: float = 10.0, neuron_cost: float = 1.0,
           fixed: float = 50.0) -> UnitCosts:
    total = fixed + head_cost * sum(heads) + neuron_cost * sum(neurons)
    return UnitCosts([head_cost] * len(heads), [neuron_cost] * len(neurons), heads, neurons, total, "FLOPs")


def test_search_fits_the_budget_and_keeps_the_most_important_units_of_each_kind():
    g = torch.Generator().manual_seed(0)
    head_fisher = [torch.rand(4, generator=g) for _ in range(3)]
    neuron_fisher = [torch.rand(20, generator=g) * 0.3 for _ in range(3)]
    costs = _costs([4] * 3, [20] * 3)
    for keep in (0.9, 0.6, 0.35):
        chosen = search(head_fisher, neuron_fisher, costs, keep)
        heads, neurons = chosen.counts
        assert costs.cost(heads, neurons) <= keep * costs.total + 1e-9
        for fisher, kept in ((head_fisher, chosen.heads), (neuron_fisher, chosen.neurons)):
            kept_scores = [float(fisher[s][u]) for s in range(3) for u in kept[s]]
            dropped = [float(fisher[s][u]) for s in range(3) for u in range(len(fisher[s])) if u not in kept[s]]
            if kept_scores and dropped:
                assert min(kept_scores) >= max(dropped)
    assert search(head_fisher, neuron_fisher, costs, 1.0).counts == ([4] * 3, [20] * 3)


def test_search_without_neurons_keeps_every_neuron_and_says_when_heads_alone_cannot_reach_the_budget():
    head_fisher = [torch.arange(4.0) for _ in range(2)]
    neuron_fisher = [torch.ones(10) for _ in range(2)]
    costs = _costs([4, 4], [10, 10])  # 50 fixed + 80 heads + 20 neurons = 150
    chosen = search(head_fisher, neuron_fisher, costs, keep=120 / 150, prune_neurons=False)
    assert chosen.neurons == [list(range(10))] * 2
    assert chosen.counts[0] == [3, 2]  # five heads fit: the most important, ties in model order
    with pytest.raises(BudgetError, match="heads alone.*46.7%"):
        search(head_fisher, neuron_fisher, costs, keep=0.3, prune_neurons=False)
    with pytest.raises(BudgetError, match="out of reach"):
        search(head_fisher, neuron_fisher, costs, keep=0.2)
    with pytest.raises(BudgetError, match=r"\(0, 1\]"):
        search(head_fisher, neuron_fisher, costs, keep=1.5)


def test_rearrange_lets_units_whose_gradients_cancel_go_together():
    # c and d point the same way (removing both costs 4|u|^2); e nearly cancels c (|c + e|^2 = 0.01 |u|^2).
    g = torch.Generator().manual_seed(0)
    u = torch.randn(50, generator=g)
    w = 5 * torch.randn(50, generator=g)
    gradients = torch.stack([u, u, -1.1 * u, w], dim=1)  # units c, d, e, f
    kept_by_fisher = [2, 3]  # the diagonal alone removes c and d
    kept = rearrange_site(kept_by_fisher, gradients)
    assert len(kept) == 2 and 2 not in kept
    assert removed_objective(gradients, kept) < 0.01 * removed_objective(gradients, kept_by_fisher)
    assert rearrange_site([0, 1, 2, 3], gradients) == [0, 1, 2, 3]
    assert rearrange_site([], gradients) == []


def test_rearrange_never_does_worse_than_the_fisher_diagonal():
    g = torch.Generator().manual_seed(1)
    gradients = torch.randn(64, 16, generator=g) @ torch.randn(16, 16, generator=g)  # correlated units
    diagonal_order = torch.argsort(gradients.pow(2).sum(0), stable=True).tolist()
    for kept_count in (4, 8, 12):
        by_fisher = sorted(diagonal_order[16 - kept_count:])
        kept = rearrange_site(by_fisher, gradients)
        assert len(kept) == kept_count
        assert removed_objective(gradients, kept) <= removed_objective(gradients, by_fisher) + 1e-6


@torch.no_grad()
def _last_hidden(model, batch) -> torch.Tensor:
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    return model(**inputs, output_hidden_states=True).hidden_states[-1]


# Post-norm encoders, pre-norm decoders, and Gemma 3's decoder that also normalises its sublayers' outputs.
@pytest.mark.parametrize("family", [*ENCODERS, "llama", "gpt2", "opt", "gemma3_text"])
def test_tune_on_an_unpruned_copy_changes_nothing(family):
    teacher = tiny_model(family, attn_implementation="eager")
    student = copy.deepcopy(teacher)
    outcome = tune(student, teacher, batches(family), progress=False)
    assert outcome["tuned"] == 2 * len(attention_sites(teacher))
    batch = tiny_batch(family, batch_size=3, length=9, seed=7)
    torch.testing.assert_close(_last_hidden(student, batch), _last_hidden(teacher, batch), rtol=1e-4, atol=1e-4)


def sharpened(family: str) -> torch.nn.Module:
    """A tiny model whose sublayers matter: at the usual 0.02 initialisation the residual stream swamps them."""
    model = tiny_model(family, attn_implementation="eager")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0, 0.2, generator=g)
    return model


def pruned_half(model: torch.nn.Module) -> torch.nn.Module:
    return prune_neurons(prune_heads(copy.deepcopy(model), {0: [1, 3], 1: [0]}),
                         {0: list(range(0, 37, 2)), 1: list(range(20))})


@torch.no_grad()
def first_attention_error(student, teacher, data) -> float:
    """Squared error of layer 0's attention output plus residual, student against teacher, over real tokens."""
    def outputs(model):
        site, found = attention_sites(model)[0], []
        handle = site.out_proj.register_forward_hook(lambda _m, _a, out: found.append(out))
        try:
            for batch in data:
                model(**{k: v for k, v in batch.items() if k != "labels"})
        finally:
            handle.remove()
        return torch.cat([out[b["attention_mask"].bool()] for out, b in zip(found, data, strict=True)])

    # Both see the same layer-0 input, so the residuals cancel and the outputs alone are compared.
    return float((outputs(student) - outputs(teacher)).pow(2).sum())


@pytest.mark.parametrize("family", ENCODERS)
def test_tuned_scales_solve_the_least_squares_fit_of_each_layer(family):
    teacher = sharpened(family)
    data = batches(family, count=6, size=8)
    untuned = pruned_half(teacher)
    tuned = copy.deepcopy(untuned)
    tune(tuned, teacher, data, progress=False)
    best = first_attention_error(tuned, teacher, data)
    assert best < first_attention_error(untuned, teacher, data)
    # The fit is a minimum: moving any kept head's scale away from it makes layer 0 worse.
    out_proj, width = attention_sites(tuned)[0].out_proj, 8
    for head in range(attention_sites(tuned)[0].num_heads):
        for factor in (0.95, 1.05):
            nudged = copy.deepcopy(tuned)
            with torch.no_grad():
                attention_sites(nudged)[0].out_proj.weight[:, head * width:(head + 1) * width] *= factor
            assert first_attention_error(nudged, teacher, data) > best
    assert out_proj.in_features == 2 * width

    # And the whole model ends closer to the unpruned one on the data it was tuned on.
    def error(model):
        return sum(float((_last_hidden(model, b) - _last_hidden(teacher, b)).pow(2).mean()) for b in data)

    assert error(tuned) < error(untuned)
    # The scales live in the weights: the tuned model has the pruned shapes and no extra parameters.
    assert [s.num_heads for s in attention_sites(tuned)] == [2, 3]
    assert sum(p.numel() for p in tuned.parameters()) == sum(p.numel() for p in untuned.parameters())


def test_tune_refuses_encoder_decoder_models():
    teacher = tiny_model("marian", attn_implementation="eager")
    with pytest.raises(ValueError, match="encoder-only"):
        tune(copy.deepcopy(teacher), teacher, batches("marian"), progress=False)


@pytest.mark.parametrize("method", BUDGETED_METHODS)
def test_budgeted_prune_meets_the_flop_budget_is_deterministic_and_saves(method, tmp_path):
    model = tiny_model("bert", attn_implementation="eager")
    data = batches("bert")
    gradients = gate_gradients(model, data, progress=False)
    costs = flop_costs(model, probe("bert"))
    keep = 0.8 if method == BUDGETED_HEADS else 0.6
    result = budgeted_prune(model, gradients, costs, keep, method, tune_batches=data)
    assert forward_flops(result.model, probe("bert")) <= keep * costs.total * (1 + 1e-9)
    again = budgeted_prune(model, gradients, costs, keep, method, tune_batches=data)
    assert again.selection == result.selection
    batch = {k: v for k, v in tiny_batch("bert", seed=3).items() if k != "labels"}
    torch.testing.assert_close(again.model(**batch).logits, result.model(**batch).logits, rtol=0, atol=0)
    if method == BUDGETED_HEADS:
        assert [s.num_neurons for s in ffn_sites(result.model)] == [37, 37]
    reloaded = load_model(save_model(result.model, tmp_path / "pruned"), attn_implementation="eager")
    torch.testing.assert_close(reloaded(**batch).logits, result.model(**batch).logits, rtol=0, atol=0)


def test_budgeted_prune_rejects_unknown_methods_and_tuning_without_data():
    model = tiny_model("bert", attn_implementation="eager")
    gradients = gate_gradients(model, batches("bert", count=1), progress=False)
    costs = flop_costs(model, probe("bert"))
    with pytest.raises(ValueError, match="unknown budgeted method 'magnitude'; choose one of budgeted-heads"):
        budgeted_prune(model, gradients, costs, 0.5, "magnitude")
    with pytest.raises(ValueError, match="tune_batches"):
        budgeted_prune(model, gradients, costs, 0.5, BUDGETED_TUNED)


def test_latency_costs_recover_the_slope_of_a_latency_table():
    model = tiny_model("bert", attn_implementation="eager")  # 2 layers of 4 heads and 37 neurons
    table = ([dict(units="heads", per_layer=n, seconds=1.0 + 0.02 * n) for n in (4, 3, 2, 1)]
             + [dict(units="neurons", per_layer=n, seconds=1.08 - 0.001 * (37 - n)) for n in (37, 28, 18, 9)])
    costs = latency_costs(model, table)
    assert costs.unit == "s"
    assert costs.head == pytest.approx([0.01, 0.01]) and costs.neuron == pytest.approx([0.0005, 0.0005])
    assert costs.total == pytest.approx(1.08)
    with pytest.raises(ValueError, match="two distinct heads counts"):
        latency_costs(model, [dict(units="heads", per_layer=4, seconds=1.0)] + table[4:])


def test_latency_table_times_every_layer_cut_to_fewer_units_together_in_one_interleaved_timing():
    model = tiny_model("bert", attn_implementation="eager")
    calls = []

    def count_calls(fns, repeats):
        calls.append((list(fns), repeats))
        return {key: 0.5 for key in fns if fns[key]() is not None}

    rows = latency_table(model, probe("bert"), repeats=2, points=3, timer=count_calls)
    cuts = [("heads", 4), ("heads", 2), ("heads", 1), ("neurons", 37), ("neurons", 23), ("neurons", 9)]
    assert [(r["units"], r["per_layer"]) for r in rows] == cuts
    assert calls == [(cuts, 2)] and all(r["seconds"] == 0.5 for r in rows)


def test_selection_plans_name_original_indices_of_the_units_that_go():
    model = tiny_model("bert", attn_implementation="eager")
    selection = Selection(heads=[[0, 3], [0, 1, 2, 3]], neurons=[list(range(30)), list(range(37))])
    heads, neurons = selection.plans(model)
    assert heads == {0: [1, 2], 1: []} and neurons == {0: list(range(30, 37)), 1: []}


# --- decoder-only language models: pre-norm tuning, grouped-query units ------------------------------------


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3_text"])
def test_tuning_a_pruned_pre_norm_decoder_fits_its_layers_better_than_no_tuning(family):
    teacher = sharpened(family)
    if family == "gpt2":  # Conv1D, not nn.Linear: sharpen its weights too
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, param in teacher.named_parameters():
                if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
                    param.normal_(0, 0.2, generator=g)
    data = batches(family, count=6, size=8)
    groups = attention_sites(teacher)[0].head_groups  # GQA: one query head of each group, then a whole group
    plan = {0: [group[0] for group in groups], 1: groups[0]} if len(groups[0]) > 1 else {0: [0, 2], 1: [1]}
    untuned = prune_neurons(prune_heads(copy.deepcopy(teacher), plan), {0: list(range(0, 37, 2))})
    tuned = copy.deepcopy(untuned)
    tune(tuned, teacher, data, progress=False)
    assert first_attention_error(tuned, teacher, data) < first_attention_error(untuned, teacher, data)

    def error(model):
        return sum(float((_last_hidden(model, b) - _last_hidden(teacher, b)).pow(2).mean()) for b in data)

    assert error(tuned) < error(untuned)


@pytest.mark.parametrize("unit", ["query", "group"])
@pytest.mark.parametrize("method", BUDGETED_METHODS)
def test_budgeted_prune_of_a_gqa_model_removes_whole_units_and_meets_the_flop_budget(unit, method):
    model = tiny_model("llama", attn_implementation="eager")
    data = batches("llama")
    gradients = gate_gradients(model, data, progress=False)
    costs = flop_costs(model, probe("llama"))
    keep = 0.85 if method == BUDGETED_HEADS else 0.6
    result = budgeted_prune(model, gradients, costs, keep, method, tune_batches=data, choice=HeadChoice(unit))
    sites = attention_sites(result.model)
    assert sum(s.num_heads for s in sites) < 24  # heads went, in whole units:
    for site in sites:
        sizes = {len(group) for group in site.head_groups}
        assert len(sizes) <= 1
        if unit == "group":
            assert sizes <= {4}  # groups kept whole
        else:
            assert site.num_kv_heads in (0, 2)  # key/value heads stay until their last query head goes
    assert forward_flops(result.model, probe("llama")) <= keep * costs.total * 1.05  # FLOPs model: k/v shared


# --- robust choice: per-layer normalisation, fixed splits, a held-out calibration sample ---------------------

def test_per_layer_normalisation_gives_every_site_unit_l2_norm_and_leaves_an_all_zero_site_alone():
    normalised = per_layer_normalised([torch.tensor([3.0, 4.0]), torch.zeros(3), torch.tensor([1e-6, 0.0])])
    assert [float(t.norm()) for t in normalised] == pytest.approx([1.0, 0.0, 1.0])
    assert normalised[0].tolist() == pytest.approx([0.6, 0.8])


def test_raw_fisher_empties_a_layer_whose_scale_is_small_and_normalised_fisher_does_not():
    # The last layer's gradients are 1000x smaller, as Fisher information is near the loss; ranked raw, its
    # heads all go first. Normalised per layer, each layer keeps its own best heads.
    head_fisher = [torch.tensor([4.0, 3.0, 2.0, 1.0]), torch.tensor([4.0, 3.0, 2.0, 1.0]) * 1e-3]
    neuron_fisher = [torch.ones(10), torch.ones(10)]
    costs = _costs([4, 4], [10, 10])
    assert search(head_fisher, neuron_fisher, costs, keep=0.75, prune_neurons=False).counts[0] == [4, 0]
    normalised = search(per_layer_normalised(head_fisher), neuron_fisher, costs, keep=0.75, prune_neurons=False)
    assert normalised.counts[0] == [2, 2]


def fixed_losses(table: dict[str, torch.Tensor]):
    """Candidates named by their only head, and a `losses` callable that looks each one's losses up."""
    candidates = {name: Candidate(name, Selection([[index]], [])) for index, name in enumerate(table)}
    return candidates, lambda selection: table[list(table)[selection.heads[0][0]]]


def normal(seed: int) -> torch.Tensor:
    return torch.randn(256, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_an_alternative_replaces_the_reference_only_when_its_held_out_loss_is_significantly_lower():
    base = 2 + normal(0)
    table = {"ranked": base, "rearranged": base + 0.01, "slightly better": base - 0.005 + 0.2 * normal(1),
             "clearly better": base - 0.3 + 0.2 * normal(4), "best by far": base - 0.6 + 0.2 * normal(5),
             "the same": base.clone()}
    c, losses = fixed_losses(table)
    reference = [c["ranked"], c["rearranged"]]
    assert held_out_choice(reference, [c["slightly better"], c["the same"]], losses).name == "ranked"
    assert held_out_choice(reference, [c["slightly better"], c["clearly better"]], losses).name == "clearly better"
    assert held_out_choice(reference, [c["clearly better"], c["best by far"]], losses).name == "best by far"
    assert held_out_choice(reference[::-1], [c["the same"]], losses).name == "ranked"  # the lower of the two


def test_the_significance_level_is_shared_out_over_the_alternatives():
    base, noise = 2 + normal(3), normal(2)
    noise = (noise - noise.mean()) / noise.std()  # so that t = -0.13 * sqrt(256) = -2.08 exactly
    table = {"ranked": base, "marginal": base - 0.13 + noise, "worse": base + 1.0 + noise,
             "worse still": base + 2.0 + noise}
    c, losses = fixed_losses(table)
    p = stats.ttest_rel(table["marginal"].numpy(), base.numpy(), alternative="less").pvalue
    assert SWITCH_SIGNIFICANCE / 3 < p < SWITCH_SIGNIFICANCE  # significant alone, not as one of three
    assert held_out_choice([c["ranked"]], [c["marginal"]], losses).name == "marginal"
    assert held_out_choice([c["ranked"]], [c["marginal"], c["worse"], c["worse still"]], losses).name == "ranked"


def test_held_out_choice_measures_each_distinct_selection_once():
    calls = []
    same = Selection([[0]], [])

    def losses(selection: Selection) -> torch.Tensor:
        calls.append(selection)
        return torch.ones(4, dtype=torch.float64)

    held_out_choice([Candidate("a", same), Candidate("b", Selection([[0]], []))], [Candidate("c", same)], losses)
    assert calls == [same]


@pytest.mark.parametrize("keep", [0.9, 0.75, 0.7])
def test_heads_only_with_calibration_keeps_the_papers_ranking_unless_a_fisher_ranking_is_significantly_better(keep):
    model = tiny_model("bert", attn_implementation="eager")
    data, held_out = batches("bert"), [tiny_batch("bert", batch_size=4, length=9, seed=seed) for seed in (7, 8)]
    gradients = gate_gradients(model, data, progress=False)
    costs = flop_costs(model, probe("bert"))
    head_fisher, neuron_fisher = gradients.fisher()
    importance = [torch.rand(site.num_heads, generator=torch.Generator().manual_seed(i))
                  for i, site in enumerate(attention_sites(model))]
    result = budgeted_prune(model, gradients, costs, keep, BUDGETED_HEADS, calibration=held_out,
                            head_importance=importance)

    def both(name: str, scores: list[torch.Tensor]) -> list[Candidate]:
        ranked = search(scores, neuron_fisher, costs, keep, prune_neurons=False)
        return [Candidate(name, ranked), Candidate(f"{name}, rearranged", rearrange(ranked, gradients))]

    reference = both("paper's importance", importance)
    assert reference[0].selection != reference[1].selection  # at these budgets the two differ, so a choice is made
    alternatives = both("fisher normalised", per_layer_normalised(head_fisher)) + both("fisher", head_fisher)
    losses = {c.name: calibration_losses(pruned_model(model, c.selection), held_out) for c in reference + alternatives}
    best = min(reference, key=lambda c: float(losses[c.name].mean()))
    significant = {c.name for c in alternatives if stats.ttest_rel(
        losses[c.name].numpy(), losses[best.name].numpy(), alternative="less").pvalue < SWITCH_SIGNIFICANCE / 4}
    assert result.heads_from == (min(significant, key=lambda n: float(losses[n].mean())) if significant
                                 else best.name)
    assert result.selection == {c.name: c.selection for c in reference + alternatives}[result.heads_from]
    assert forward_flops(result.model, probe("bert")) <= keep * costs.total * (1 + 1e-9)
    again = budgeted_prune(model, gradients, costs, keep, BUDGETED_HEADS, calibration=held_out,
                           head_importance=importance)
    assert (again.selection, again.heads_from) == (result.selection, result.heads_from)


def test_heads_only_without_the_papers_importance_ranks_by_fisher_normalised_unless_raw_is_significantly_better():
    model = tiny_model("bert", attn_implementation="eager")
    data, held_out = batches("bert"), [tiny_batch("bert", batch_size=4, length=9, seed=7)]
    gradients = gate_gradients(model, data, progress=False)
    costs = flop_costs(model, probe("bert"))
    head_fisher, neuron_fisher = gradients.fisher()
    result = budgeted_prune(model, gradients, costs, 0.75, BUDGETED_HEADS, calibration=held_out)
    normalised = search(per_layer_normalised(head_fisher), neuron_fisher, costs, 0.75, prune_neurons=False)
    assert result.heads_from.startswith("fisher normalised")
    assert result.selection in (normalised, rearrange(normalised, gradients))


def test_heads_only_with_calibration_is_never_worse_on_it_than_the_papers_order_at_the_same_cost():
    model = tiny_model("bert", attn_implementation="eager")
    data, held_out = batches("bert"), [tiny_batch("bert", batch_size=4, length=9, seed=seed) for seed in (7, 8)]
    gradients = gate_gradients(model, data, progress=False)
    costs = flop_costs(model, probe("bert"))
    sites = attention_sites(model)
    importance = [torch.rand(site.num_heads, generator=torch.Generator().manual_seed(10 + i))
                  for i, site in enumerate(sites)]
    for keep in (0.9, 0.8, 0.7):
        paper = pruned_copy(model, paper_plan_at_cost(model, PAPER_CHOICE.rank(importance, sites), costs, keep))
        result = budgeted_prune(model, gradients, costs, keep, BUDGETED_HEADS, calibration=held_out,
                                head_importance=importance)
        assert calibration_loss(result.model, held_out) <= calibration_loss(paper, held_out) + 1e-6


def labelled_by(model: torch.nn.Module, batch: dict, agree: bool) -> dict:
    """`batch` labelled with the class `model` predicts (`agree`) or with the one it ranks last."""
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    return {**batch, "labels": logits.argmax(-1) if agree else logits.argmin(-1)}


def test_budgeted_tuned_drops_its_tuning_where_it_raises_the_held_out_loss_and_keeps_it_elsewhere():
    teacher = tiny_model("bert", attn_implementation="eager").eval()
    with torch.no_grad():  # confident logits, so that the losses below differ by more than float noise
        teacher.classifier.weight.mul_(100)
    data = batches("bert")
    gradients = gate_gradients(teacher, data, progress=False)
    costs = flop_costs(teacher, probe("bert"))
    kept = {}
    # Two labellings of the tuning inputs, the teacher's top class and its last: tuning raises the first's loss
    # here and lowers the second's, so both branches run.
    for agree in (True, False):
        held_out = [labelled_by(teacher, batch, agree) for batch in data]
        result = budgeted_prune(teacher, gradients, costs, 0.6, BUDGETED_TUNED, tune_batches=data,
                                calibration=held_out)
        untuned = pruned_model(teacher, result.selection)
        tuned = copy.deepcopy(untuned)
        tune(tuned, teacher, data, progress=False)
        losses = calibration_loss(tuned, held_out), calibration_loss(untuned, held_out)
        assert result.tuned == (losses[0] <= losses[1])
        assert calibration_loss(result.model, held_out) == pytest.approx(min(losses), rel=1e-6)
        kept[agree] = result.tuned
    assert kept == {True: False, False: True}
    assert budgeted_prune(teacher, gradients, costs, 0.6, BUDGETED_TUNED, tune_batches=data).tuned  # no check


@pytest.mark.parametrize("method", [BUDGETED, BUDGETED_TUNED])
def test_the_joint_methods_keep_kwons_raw_fisher_search_whatever_the_calibration_sample(method):
    model = tiny_model("bert", attn_implementation="eager")
    data, held_out = batches("bert"), [tiny_batch("bert", batch_size=4, length=9, seed=7)]
    gradients = gate_gradients(model, data, progress=False)
    costs = flop_costs(model, probe("bert"))
    importance = [torch.ones(site.num_heads) for site in attention_sites(model)]
    plain = budgeted_prune(model, gradients, costs, 0.6, method, tune_batches=data)
    calibrated = budgeted_prune(model, gradients, costs, 0.6, method, tune_batches=data, calibration=held_out,
                                head_importance=importance)
    assert calibrated.selection == plain.selection



def test_calibration_loss_is_the_mean_over_examples_not_over_batches():
    model = tiny_model("bert", attn_implementation="eager").eval()
    one, three = tiny_batch("bert", batch_size=1, length=9, seed=1), tiny_batch("bert", batch_size=3, length=9, seed=2)
    with torch.no_grad():
        losses = torch.cat([per_example_loss(model, one), per_example_loss(model, three)])
    assert calibration_loss(model, [one, three]) == pytest.approx(float(losses.mean()), rel=1e-6)
