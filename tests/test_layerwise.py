"""Scoring a decoder-only LM one decoder layer at a time (pipeline/core/layerwise.py): the same head scores as the
whole model, for both gate-gradient estimators and the activation criterion, from memory or from a safetensors
folder, with a peak memory well below the whole model's; and `runtime.placement: layerwise` wired through the
language-modelling `Task`, refused in one line by the families that do not run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from pipeline.config.params import parse_params
from pipeline.core.checkpoint import pruning_record
from pipeline.core.importance import head_importance, rank_heads, token_head_importance
from pipeline.core.layerwise import (
    LayerwiseModel,
    layerwise_head_importance,
    layerwise_token_head_importance,
)
from pipeline.core.sites import attention_sites
from pipeline.core.surgery import prune_heads
from pipeline.files.schema import PRUNING_FILE
from pipeline.methods.criteria import activation_norm, layerwise_activation_norm
from tests.test_decoder_only import grouped_plan, lm
from tests.tiny_models import LM_FAMILIES, tiny_batch, tiny_model

ROOT = Path(__file__).resolve().parents[1]


def batches(family: str) -> list[dict]:
    """Three batches of different lengths, each with a padded example."""
    return [tiny_batch(family, batch_size=3, length=7 + b, seed=b) for b in range(3)]


def assert_same_scores(whole: list[torch.Tensor], layerwise: list[torch.Tensor], model: torch.nn.Module) -> None:
    assert [t.shape for t in whole] == [t.shape for t in layerwise]
    for w, lw in zip(whole, layerwise, strict=True):
        torch.testing.assert_close(lw, w, rtol=1e-5, atol=1e-7 * float(torch.cat(whole).abs().max()))
    sites = attention_sites(model)
    groups = [site.head_groups for site in sites]
    for unit in ("query", "group"):
        assert rank_heads(layerwise, groups, unit) == rank_heads(whole, groups, unit)


def saved(model: torch.nn.Module, folder: Path) -> Path:
    """`model` as a safetensors folder, with its pruning record where it was pruned."""
    model.save_pretrained(folder)
    if any(site.num_heads != site.original_num_heads for site in attention_sites(model)):
        (folder / PRUNING_FILE).write_text(json.dumps(pruning_record(model)))
    return folder


@pytest.mark.parametrize("family", LM_FAMILIES)
def test_layerwise_scores_equal_whole_model_scores_for_both_estimators(family):
    model = lm(family)
    data = batches(family)
    layerwise = LayerwiseModel.in_memory(model)
    assert_same_scores(head_importance(model, data, progress=False),
                       layerwise_head_importance(layerwise, data, progress=False), model)
    per_token, per_example = token_head_importance(model, data, progress=False)
    lw_token, lw_example = layerwise_token_head_importance(layerwise, data, progress=False)
    assert_same_scores(per_token, lw_token, model)
    assert_same_scores(per_example, lw_example, model)


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3_text"])
def test_layerwise_scores_read_from_a_folder_equal_the_loaded_whole_model_scores(family, tmp_path):
    # Gemma 3: sliding and full layers get masks of their own; GPT-2: an LM head tied to the embedding, saved once.
    model = lm(family)
    data = batches(family)
    from_disk = LayerwiseModel.from_folder(saved(model, tmp_path), attn_implementation="sdpa")
    assert_same_scores(token_head_importance(model, data, progress=False)[0],
                       layerwise_token_head_importance(from_disk, data, progress=False)[0], model)
    assert all(p.device.type == "meta" for p in from_disk.model.parameters())  # nothing kept once scored


def test_a_pruned_folder_scores_layer_by_layer_as_its_whole_model_does(tmp_path):
    model = prune_heads(lm("llama"), grouped_plan(lm("llama")))  # layers pruned unequally, layer 1 emptied
    data = batches("llama")
    from_disk = LayerwiseModel.from_folder(saved(model, tmp_path), attn_implementation="sdpa")
    assert [s.num_heads for s in from_disk.sites] == [s.num_heads for s in attention_sites(model)] == [6, 0, 4]
    assert_same_scores(head_importance(model, data, progress=False),
                       layerwise_head_importance(from_disk, data, progress=False), model)


def test_layerwise_scores_under_bf16_autocast_equal_whole_model_scores():
    model = lm("qwen2")
    data = batches("qwen2")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        whole = token_head_importance(model, data, progress=False)[0]
        layerwise = layerwise_token_head_importance(LayerwiseModel.in_memory(model), data, progress=False)[0]
    assert_same_scores(whole, layerwise, model)


def test_layerwise_scores_do_not_depend_on_how_many_batches_go_through_the_layers_together():
    model = lm("mistral")
    data = batches("mistral")
    layerwise = LayerwiseModel.in_memory(model)
    together = layerwise_head_importance(layerwise, data, progress=False)
    for step in (1, 2):
        apart = layerwise_head_importance(layerwise, data, progress=False, batches_per_pass=step)
        assert all(torch.equal(a, t) for a, t in zip(apart, together, strict=True))


@pytest.mark.parametrize("family", LM_FAMILIES)
def test_layerwise_activation_norm_equals_the_whole_model_criterion(family):
    model = lm(family)
    data = batches(family)
    whole = activation_norm(model, data, progress=False)
    layerwise = layerwise_activation_norm(LayerwiseModel.in_memory(model), data, progress=False)
    assert_same_scores(whole, layerwise, model)


def test_scoring_layer_by_layer_leaves_the_in_memory_model_as_it_was():
    model = lm("llama")
    before = {name: p.clone() for name, p in model.named_parameters()}
    layerwise_head_importance(LayerwiseModel.in_memory(model), batches("llama"), progress=False)
    after = dict(model.named_parameters())
    assert all(torch.equal(before[name], after[name]) and after[name].requires_grad for name in before)
    assert all("forward" not in vars(layer) for layer in model.model.layers)  # the stand-ins are gone


def test_an_encoder_is_refused_by_layerwise_scoring_in_one_line():
    with pytest.raises(ValueError, match="layerwise scoring runs decoder-only language models"):
        LayerwiseModel.in_memory(tiny_model("bert"))


# --- peak memory: a model a few hundred MB on disk, scored whole and layer by layer in child processes ---------------

CHILD = """
import sys, torch
from tests.tiny_models import tiny_batch
placement, folder = sys.argv[1], sys.argv[2]


torch.set_num_threads(1)
data = [tiny_batch("llama", batch_size=2, length=16, seed=b) for b in range(2)]
from pipeline.core.checkpoint import load_model
from pipeline.core.importance import token_head_importance
from pipeline.core.layerwise import LayerwiseModel, layerwise_token_head_importance
from pipeline.core.timer import peak_rss_bytes
baseline = peak_rss_bytes()
if placement == "whole":
    scores = token_head_importance(load_model(folder), data, progress=False)[0]
else:
    scores = layerwise_token_head_importance(LayerwiseModel.from_folder(folder), data, progress=False)[0]
peak = peak_rss_bytes()
torch.save(torch.cat(scores), f"{folder}/{placement}.pt")
print(baseline, peak)
"""


def peak_rss(placement: str, folder: Path) -> tuple[int, int]:
    """(bytes of peak RSS once imported, once scored) of a fresh process scoring the model in `folder`."""
    result = subprocess.run([sys.executable, "-c", CHILD, placement, str(folder)], cwd=ROOT, capture_output=True,
                            text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    baseline, peak = map(int, result.stdout.split())
    return baseline, peak


@pytest.mark.slow  # two fresh processes, each importing torch and scoring a 360 MB model
def test_layerwise_scoring_from_disk_peaks_far_below_the_whole_model(tmp_path):
    import transformers

    config = transformers.LlamaConfig(vocab_size=96, hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
                                      num_key_value_heads=4, intermediate_size=2816, max_position_embeddings=64,
                                      pad_token_id=0, bos_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert model_bytes > 300 * 2**20
    folder = saved(model, tmp_path / "model")
    del model
    whole_base, whole_peak = peak_rss("whole", folder)
    layer_base, layer_peak = peak_rss("layerwise", folder)
    print(f"model {model_bytes / 2**20:.0f} MiB; peak RSS above the imports: whole "
          f"{(whole_peak - whole_base) / 2**20:.0f} MiB, layerwise {(layer_peak - layer_base) / 2**20:.0f} MiB")
    # The whole model is in memory at once; layer by layer, one layer's eighth of it and the activations are.
    assert whole_peak - whole_base > model_bytes
    assert layer_peak - layer_base < model_bytes / 3
    assert whole_peak - layer_peak > model_bytes * 2 / 3
    assert torch.allclose(torch.load(folder / "layerwise.pt"), torch.load(folder / "whole.pt"), rtol=1e-5)


# --- wiring: runtime.placement through the Task, refused where a family does not run it --------------------------


def lm_params(placement: str, estimator: str) -> dict:
    params = yaml.safe_load((ROOT / "experiments" / "tatoeba-llama.yaml").read_text())
    params["runtime"] = {"device": "cpu", "precision": "fp32", "placement": placement}
    params["score"]["estimator"] = estimator
    return params


@pytest.mark.parametrize("estimator", ["token", "example"])
def test_the_language_modelling_task_scores_layer_by_layer_under_placement_layerwise(estimator, tmp_path,
                                                                                    monkeypatch):
    from pipeline.run.experiment import Experiment
    from pipeline.tasks.language_modeling.task import LanguageModelingTask

    model = lm("llama")
    folder, data = saved(model, tmp_path / "model"), batches("llama")
    monkeypatch.chdir(tmp_path)
    whole_sites, whole = Experiment(parse_params(lm_params("whole", estimator))).task.head_importance(folder, data)

    def no_whole_load(*_args):
        raise AssertionError("layerwise scoring loaded the whole model")

    monkeypatch.setattr(LanguageModelingTask, "load", no_whole_load)
    sites, layerwise = Experiment(parse_params(lm_params("layerwise", estimator))).task.head_importance(folder, data)
    assert [(s.kind, s.layer) for s in sites] == [(s.kind, s.layer) for s in whole_sites]
    assert_same_scores(whole, layerwise, model)


def test_placement_layerwise_is_refused_in_one_line_by_a_family_that_does_not_run_it(tmp_path, monkeypatch):
    from pipeline.run.preflight import check_all, preflight

    monkeypatch.chdir(tmp_path)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["runtime"]["placement"] = "layerwise"
    Path("params.yaml").write_text(yaml.safe_dump(params))
    line = "runtime.placement: layerwise is not run by the classification task; allowed: whole"
    assert check_all("params.yaml", inputs=False) == [line]
    with pytest.raises(SystemExit) as stop:
        preflight("score", ["--params", "params.yaml"])
    assert str(stop.value) == f"error: {line}"
    Path("lm.yaml").write_text(yaml.safe_dump(lm_params("layerwise", "token")))
    assert check_all("lm.yaml", inputs=False) == []
