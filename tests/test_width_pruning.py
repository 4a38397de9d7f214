"""Width pruning of decoder LLMs (pipeline/methods/width/): each peer's criterion is what its paper defines, computed
by hand on a tiny Llama; the compensations do what they claim; every method removes at least its share of the
parameters; and a uniform result is a stock folder that plain transformers loads, with the bias and with the refit."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from pipeline.checks.width_plan import width_problems
from pipeline.core.checkpoint import load_model, save_model
from pipeline.core.flops import non_embedding_parameters
from pipeline.core.gguf import convert_gguf
from pipeline.core.sites import attention_sites, ffn_sites
from pipeline.files.schema import BIAS_COMPENSATION, WIDTH_DIR, WIDTH_OURS, WIDTH_OWN_COMPENSATION, width_name
from pipeline.methods.budgeted import pruned_model
from pipeline.methods.budgeted_search import BudgetError, Selection
from pipeline.methods.width import criteria
from pipeline.methods.width.allocation import THRESHOLD, UNIFORM, allocate, unit_costs
from pipeline.methods.width.compensation import add_bias_compensation, least_squares, refit, unsaid_biases
from pipeline.methods.width.methods import WIDTH_METHODS
from pipeline.methods.width.statistics import gather_statistics
from pipeline.methods.width.sweep import WidthSweep
from pipeline.tasks.language_modeling.llama import collate_texts
from pipeline.tasks.language_modeling.perplexity import LanguageModelEval
from tests.tiny_gguf import EOS, tiny_decoder, write_tiny_gguf
from tests.tiny_models import LM_FAMILIES, VOCAB, tiny_model

LENGTH = 12
ROOT = Path(__file__).resolve().parents[1]


def windows(count: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (count, LENGTH), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


@pytest.fixture(scope="module")
def dense():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def calibration():
    return windows(48, seed=1)


@pytest.fixture(scope="module")
def stats(dense, calibration):
    halves = [{k: v[:24] for k, v in calibration.items()}, {k: v[24:] for k, v in calibration.items()}]
    return gather_statistics(dense, halves, progress=False)


def inputs_of(layer: torch.nn.Module, model: torch.nn.Module, batch: dict) -> torch.Tensor:
    """`[tokens, in_features]`: what `layer` reads on `batch`."""
    seen = []
    handle = layer.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach().reshape(-1,
                                                                                                   args[0].shape[-1])))
    with torch.no_grad():
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    handle.remove()
    return seen[0].double()


def test_wanda_sp_scores_a_channel_by_its_weights_times_its_input_norm(dense, stats, calibration):
    ffn, site = ffn_sites(dense)[1], attention_sites(dense)[1]
    scores = criteria.wanda_sp(dense, stats)
    x = inputs_of(ffn.fc_out, dense, calibration)
    by_hand = ffn.fc_out.weight.detach().double().abs().mean(0) * x.norm(dim=0)
    torch.testing.assert_close(scores.neurons[1], by_hand, rtol=1e-4, atol=0)
    heads_in = inputs_of(site.out_proj, dense, calibration)
    per_channel = site.out_proj.weight.detach().double().abs().mean(0) * heads_in.norm(dim=0)
    torch.testing.assert_close(scores.heads[1], per_channel.view(site.num_heads, -1).sum(1), rtol=1e-4, atol=0)


def test_flap_scores_are_the_fluctuation_times_the_squared_column_norm_standardised(dense, stats, calibration):
    ffn = ffn_sites(dense)[0]
    x = inputs_of(ffn.fc_out, dense, calibration)
    wifv = x.var(0) * ffn.fc_out.weight.detach().double().pow(2).sum(0)
    torch.testing.assert_close(criteria.flap(dense, stats).neurons[0], (wifv - wifv.mean()) / wifv.std(), rtol=1e-4,
                               atol=1e-6)


def test_minitron_scores_a_head_by_its_mean_output_norm(dense, stats, calibration):
    site = attention_sites(dense)[2]
    x = inputs_of(site.out_proj, dense, calibration)
    by_hand = x.unflatten(1, (site.num_heads, site.head_dim)).norm(dim=2).mean(0)
    torch.testing.assert_close(criteria.minitron(dense, stats).heads[2], by_hand, rtol=1e-4, atol=0)


def test_llm_pruner_scores_a_channel_by_the_sum_of_weight_times_gradient_over_its_coupled_weights(dense, calibration,
                                                                                                  stats):
    model = copy.deepcopy(dense)
    loss = sum(torch.nn.functional.cross_entropy(model(input_ids=b["input_ids"]).logits[:, :-1].transpose(1, 2),
                                                 b["labels"][:, 1:], reduction="none").mean(1).sum()
               for b in ({k: v[:24] for k, v in calibration.items()}, {k: v[24:] for k, v in calibration.items()}))
    loss.backward()
    ffn = ffn_sites(model)[1]
    rows = sum((lin.weight * lin.weight.grad).abs().sum(1) for lin in ffn.inputs)
    by_hand = rows + (ffn.fc_out.weight * ffn.fc_out.weight.grad).abs().sum(0)
    torch.testing.assert_close(criteria.llm_pruner(dense, stats).neurons[1], by_hand.double().detach(), rtol=1e-3,
                               atol=1e-9)


def test_torch_pruning_magnitude_scores_a_channel_by_the_mean_of_its_layers_squared_weights(dense, stats):
    ffn = ffn_sites(dense)[2]
    gate, up = (lin.weight.detach().double() for lin in ffn.inputs)
    down = ffn.fc_out.weight.detach().double()
    by_hand = (gate.pow(2).sum(1) + up.pow(2).sum(1) + down.pow(2).sum(0)) / 3
    torch.testing.assert_close(criteria.magnitude(dense, stats).neurons[2], by_hand)


def mlp_only_selection(model: torch.nn.Module, layer: int, drop: list[int]) -> Selection:
    heads = [list(range(s.num_heads)) for s in attention_sites(model)]
    neurons = [[n for n in range(f.num_neurons) if not (i == layer and n in drop)]
               for i, f in enumerate(ffn_sites(model))]
    return Selection(heads, neurons)


def test_flap_bias_restores_the_mean_output_of_the_pruned_projection(dense, stats, calibration):
    pruned = pruned_model(dense, mlp_only_selection(dense, 0, list(range(0, 37, 3))))
    biased = copy.deepcopy(pruned)
    add_bias_compensation(biased, dense, stats)
    dense_mean = inputs_of(ffn_sites(dense)[0].fc_out, dense, calibration) @ ffn_sites(dense)[0].fc_out.weight.detach(
    ).double().T
    layer = ffn_sites(biased)[0].fc_out
    out = inputs_of(layer, biased, calibration) @ layer.weight.detach().double().T + layer.bias.detach().double()
    zeroed = inputs_of(ffn_sites(pruned)[0].fc_out, pruned, calibration) @ ffn_sites(pruned)[0].fc_out.weight.detach(
    ).double().T
    biased_gap = (out.mean(0) - dense_mean.mean(0)).abs().max()
    assert biased_gap < 1e-3 * (zeroed.mean(0) - dense_mean.mean(0)).abs().max()


def mean_output(layer: torch.nn.Module, model: torch.nn.Module, batch: dict) -> torch.Tensor:
    """`[out_features]`: what `layer` gives on `batch`, averaged over the tokens."""
    seen = []
    handle = layer.register_forward_hook(lambda _m, _args, out: seen.append(out.detach().reshape(-1, out.shape[-1])))
    with torch.no_grad():
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    handle.remove()
    return seen[0].double().mean(0)


def first_layer_cut(model: torch.nn.Module, part: str) -> tuple[Selection, torch.nn.Module]:
    """A selection that prunes only layer 0's attention (a head of every key/value group) or only its MLP, and the
    output projection it cuts, whose input is then still the unpruned model's."""
    site, ffn = attention_sites(model)[0], ffn_sites(model)[0]
    if part == "mlp":
        return mlp_only_selection(model, 0, list(range(0, ffn.num_neurons, 3))), ffn.fc_out
    group = site.original_group_size
    gone = range(0, site.num_heads, group) if group > 1 else [0, 2]
    heads = [[h for h in range(s.num_heads) if not (s.layer == 0 and h in gone)] for s in attention_sites(model)]
    return Selection(heads, mlp_only_selection(model, 0, []).neurons), site.out_proj


@pytest.mark.parametrize("family", LM_FAMILIES)
def test_flaps_bias_restores_the_mean_output_in_memory_in_every_family_and_says_so_only_where_its_config_can(
        family, calibration):
    dense = tiny_model(family)
    stats = gather_statistics(dense, [calibration], progress=False)
    names = {module: name for name, module in dense.named_modules()}
    for part in ("attention", "mlp"):
        selection, projection = first_layer_cut(dense, part)
        pruned = pruned_model(dense, selection)
        biased = copy.deepcopy(pruned)
        add_bias_compensation(biased, dense, stats)
        target, with_bias, without = (mean_output(m.get_submodule(names[projection]), m, calibration)
                                      for m in (dense, biased, pruned))
        assert (with_bias - target).abs().max() < 1e-3 * (without - target).abs().max()
    # Llama's config says it, so a folder keeps it; GPT-2's and OPT's output projections have biases of their own;
    # any other family's folder would lose every output projection's bias the sweep added.
    assert getattr(biased.config, "mlp_bias", False) == (family == "llama")
    outputs = [f"{names[p]}.bias" for s, f in zip(attention_sites(dense), ffn_sites(dense), strict=True)
               for p in (s.out_proj, f.fc_out)]
    assert unsaid_biases(biased) == ([] if family in ("llama", "gpt2", "opt") else outputs)
    assert unsaid_biases(dense) == []


def test_flap_with_its_bias_runs_in_the_sweep_on_a_tiny_gemma3_gguf_and_the_bias_changes_the_model(tmp_path):
    # Gemma 3 270M's shape in small (every layer's query heads on one key/value head), read from a GGUF file as
    # prepare reads it; its config cannot say that o_proj and down_proj have a bias, which the sweep's models hold.
    source = tiny_decoder("gemma3_text", kv_heads=1)
    folder = convert_gguf(write_tiny_gguf(tmp_path / "gemma.gguf", source), tmp_path / "converted")
    dense = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval().requires_grad_(False)
    ids = torch.randint(3, dense.config.vocab_size, (24, LENGTH), generator=torch.Generator().manual_seed(3))
    calibration, held_out = collate_texts(ids[:16].tolist(), EOS), LanguageModelEval(ids[16:].tolist(), EOS, 8)
    sweep = WidthSweep(dense, gather_statistics(dense, [calibration], progress=False), calibration,
                       unit_costs(dense, "parameters", "query"), {"test": lambda model: held_out(model)[0]}, "query")
    table = sweep.run([("flap", "bias", None), ("flap", "none", None)], [0.2], progress=False)
    perplexity = table[table["level"] == 0.2].set_index("compensation")["perplexity"]
    # A random model's next-token guesses are near uniform, so the bias moves its perplexity by 0.06%: far more than
    # float32 rounding does.
    assert perplexity["bias"] != pytest.approx(perplexity["none"], rel=1e-5)
    biased = sweep.model("flap", 0.2, "bias")
    cut = [(p.out_proj.bias, p.num_heads < d.num_heads)
           for p, d in zip(attention_sites(biased), attention_sites(dense), strict=True)]
    cut += [(p.fc_out.bias, p.num_neurons < d.num_neurons)
            for p, d in zip(ffn_sites(biased), ffn_sites(dense), strict=True)]
    assert any(lost for _, lost in cut)
    assert all(bool(bias.abs().max() > 0) == lost for bias, lost in cut)  # a projection that lost nothing gets 0
    assert not biased.config.attention_bias and len(unsaid_biases(biased)) == len(cut)  # no folder could hold it


def test_the_least_squares_of_an_unchanged_input_give_back_the_weights():
    g = torch.Generator().manual_seed(0)
    x, weight = torch.randn(200, 16, generator=g), torch.randn(8, 16, generator=g)
    torch.testing.assert_close(least_squares(x, x @ weight.T, weight, ridge=0.1).float(), weight, rtol=1e-4,
                               atol=1e-4)
    shrunk = least_squares(x, x @ weight.T, torch.zeros_like(weight), ridge=0.1).float()
    assert (shrunk - weight).abs().max() > 1e-3  # the ridge pulls towards `current`


def test_a_refit_leaves_the_blocks_that_lost_nothing_as_they_were(dense, stats, calibration):
    model = pruned_model(dense, mlp_only_selection(dense, 1, [0, 5, 9]))
    before = copy.deepcopy(model)
    refit(model, dense, calibration)
    changed = {name for (name, a), b in zip(model.named_parameters(), before.parameters(), strict=True)
               if not torch.equal(a, b)}
    assert changed == {"model.layers.1.mlp.down_proj.weight"}


def test_the_refit_brings_a_pruned_model_nearer_the_unpruned_on_held_out_windows(dense, stats, calibration):
    selection = allocate(dense, criteria.wanda_sp(dense, stats), unit_costs(dense, "parameters", "query"), 0.3,
                         "query", UNIFORM)
    zeroed = pruned_model(dense, selection)
    refitted = refit(copy.deepcopy(zeroed), dense, calibration, ridge=1e-2)
    held_out = windows(16, seed=7)
    with torch.no_grad():
        target = dense(input_ids=held_out["input_ids"]).logits
        errors = [(m(input_ids=held_out["input_ids"]).logits - target).pow(2).mean() for m in (zeroed, refitted)]
    assert errors[1] < errors[0]


@pytest.mark.parametrize("method", list(WIDTH_METHODS))
def test_every_method_removes_at_least_its_share_of_the_parameters_and_little_more(dense, stats, method):
    m = WIDTH_METHODS[method]
    costs = unit_costs(dense, "parameters", "query")
    selection = allocate(dense, m.criterion(dense, stats), costs, 0.25, "query", m.allocation,
                         m.layers(len(stats.attention), method))
    removed = 1 - non_embedding_parameters(pruned_model(dense, selection)) / non_embedding_parameters(dense)
    assert 0.25 <= removed < 0.25 + 0.06


def test_the_same_statistics_choose_the_same_units(dense, calibration):
    halves = [{k: v[:24] for k, v in calibration.items()}, {k: v[24:] for k, v in calibration.items()}]
    picks = [allocate(dense, criteria.flap(dense, gather_statistics(dense, halves, progress=False)),
                      unit_costs(dense, "parameters", "group"), 0.3, "group", THRESHOLD) for _ in range(2)]
    assert picks[0] == picks[1]


def test_a_share_a_uniform_cut_cannot_reach_is_refused_in_one_line(dense, stats):
    with pytest.raises(BudgetError, match="out of reach"):
        allocate(dense, criteria.magnitude(dense, stats), unit_costs(dense, "parameters", "query"), 0.99, "query",
                 UNIFORM, range(1, 2))


STOCK_LOAD = textwrap.dedent("""
    import json, sys, torch
    from transformers import AutoModelForCausalLM
    folder, ids = sys.argv[1], torch.tensor(json.loads(sys.argv[2]))
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert not [m for m in sys.modules if m.startswith("pipeline")]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:])
    print(json.dumps({"ppl": float(nll.exp()), "bias": model.model.layers[0].mlp.down_proj.bias is not None}))
""")


@pytest.mark.parametrize("compensation", ["bias", "refit"])
def test_a_uniform_width_pruned_folder_loads_with_plain_transformers_and_gives_the_same_perplexity(
        dense, stats, calibration, compensation, tmp_path):
    selection = allocate(dense, criteria.flap(dense, stats), unit_costs(dense, "parameters", "query"), 0.2, "query",
                         UNIFORM)
    model = pruned_model(dense, selection)
    if compensation == "bias":
        add_bias_compensation(model, dense, stats)
    else:
        refit(model, dense, calibration)
    save_model(model, tmp_path / "width-20")
    assert json.loads((tmp_path / "width-20" / "head_pruning.json").read_text())["stock"]
    ids = windows(4, seed=9)["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, :-1].float()
    ours = float(torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:]).exp())
    out = subprocess.run([sys.executable, "-I", "-c", STOCK_LOAD, str(tmp_path / "width-20"), json.dumps(ids.tolist())],
                         capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded["ppl"] == pytest.approx(ours, rel=1e-3)
    assert loaded["bias"] == (compensation == "bias")


def lm_params(**width: object):
    from pipeline.config.params import load_params

    params = load_params(ROOT / "llm" / "params.yaml")
    return params.model_copy(update={"width": params.width.model_copy(update=width)})


GEMMA3 = {"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
          "num_key_value_heads": 1, "head_dim": 16, "intermediate_size": 128}


def test_flaps_bias_in_the_sweep_passes_the_checks_for_any_family_and_only_a_saved_one_is_refused(monkeypatch):
    sweep = lm_params(methods=["flap", "wanda-sp", "ours"], compensations=["none", "bias"], save_levels=[0.2])
    assert width_problems(sweep, GEMMA3, "gemma3_text") == []
    # The stage saves ours with its own compensation: were that FLAP's bias, a Gemma 3 folder could not carry it.
    monkeypatch.setitem(WIDTH_OWN_COMPENSATION, WIDTH_OURS, BIAS_COMPENSATION)
    assert width_problems(sweep, GEMMA3, "gemma3_text") == [
        "width.save_levels: the saved models (ours) carry FLAP's bias in o_proj and down_proj, which gemma3_text "
        "configs cannot say (only llama), so their folders would load without it; set width.save_levels: []"]
    assert width_problems(lm_params(save_levels=[]), GEMMA3, "gemma3_text") == []
    assert width_problems(sweep, {**GEMMA3, "model_type": "llama"}, "llama") == []


def test_a_level_the_shape_cannot_reach_is_refused_by_the_checks_in_one_line(tmp_path):
    params = yaml.safe_load((ROOT / "llm" / "params.yaml").read_text())
    params["width"]["levels"] = [0.2, 0.9]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    out = subprocess.run([sys.executable, "-m", "pipeline.checks", "--params", str(tmp_path / "params.yaml")],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        "error: width.levels: 90% of the parameters is out of reach for llm-pruner: the 24 of 30 layers it prunes "
        "hold 80.0%; take levels below that"]


@pytest.mark.slow  # prepare, finetune and width, each a stage in a subprocess
def test_the_width_stage_runs_flap_with_its_bias_on_a_tiny_gemma3_gguf_and_saves_ours(tmp_path):
    """Gemma 3 by params alone, as a user points llm/params.yaml at Gemma 3 270M's GGUF: one key/value head a layer
    (so no KV groups to prune), FLAP's bias held in memory by the sweep, ours saved refitted with no bias to lose.
    (Its folder is the project's form here: Gemma3TextConfig refuses 7 heads for a hidden size of 36, which they do
    not divide, though head_dim is given.)"""
    from tests.test_language_modeling import corpus, run_stage
    from tests.test_language_modeling_e2e import tiny_llm_pipeline_params

    write_tiny_gguf(tmp_path / "gemma.gguf", tiny_decoder("gemma3_text", kv_heads=1))
    params = tiny_llm_pipeline_params()
    params["model"] = {"name_or_path": "gemma.gguf", "attn_implementation": "eager"}
    params["prune"]["kv_group_fractions"] = []
    params["width"].update(methods=["flap", WIDTH_OURS], compensations=["none", "bias"], levels=[0.25],
                           save_levels=[0.25])
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (tmp_path / "corpus.txt").write_text("\n".join(corpus(400)) + "\n")
    (tmp_path / "held_out.txt").write_text("\n".join(corpus(100, seed=3)) + "\n")
    for stage in ("prepare", "finetune", "width"):
        done = run_stage(stage, tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
    table = pd.read_csv(tmp_path / "reports" / "tiny-lm" / "width_curve.csv")
    flap = table[(table["method"] == "flap") & (table["level"] == 0.25) & (table["corpus"] == "test")]
    perplexity = flap.set_index("compensation")["perplexity"]
    assert {"bias", "none"} <= set(perplexity.index) and perplexity["bias"] != pytest.approx(perplexity["none"],
                                                                                               rel=1e-6)
    saved = load_model(tmp_path / "artifacts" / "tiny-lm" / WIDTH_DIR / width_name(0.25))
    assert saved.config.model_type == "gemma3_text" and unsaid_biases(saved) == []
    assert attention_sites(saved)[0].num_heads < 9 and ffn_sites(saved)[0].num_neurons < 37
