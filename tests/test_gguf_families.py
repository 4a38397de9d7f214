"""Every family that transformers reads from GGUF and the core prunes comes in as a GGUF file: a tiny model of each,
written as llama.cpp's converter writes it (tests/tiny_gguf.py), passes the checks by the architecture name llama.cpp
gives it, converts to a folder of its Hugging Face family, and gives the logits of the model it was written from.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from pipeline.core.gguf import convert_gguf
from pipeline.core.sites import FAMILIES, GGUF_ARCHITECTURES
from pipeline.run.preflight import check_all
from tests.tiny_gguf import BOS, EOS, LLAMA_CPP_ARCH, tiny_decoder, tiny_gqa_llama, write_tiny_gguf
from tests.tiny_project import ROOT

IDS = [[BOS, 86, 260, 270, 267, 266, 20, 18, 20, 22, EOS, 7, 100]]
FAMILY_NAMES = ["llama", "mistral", "qwen2", "qwen3", "gemma3_text", "gpt2"]


def tiny(model_type: str):
    return tiny_gqa_llama() if model_type == "llama" else tiny_decoder(model_type)


def lm_problems(name_or_path: str, **prune) -> list[str]:
    """check_all on the language-modelling params (llm/params.yaml) with this model and prune updated."""
    params = yaml.safe_load((ROOT / "llm" / "params.yaml").read_text())
    params["model"] = {"name_or_path": name_or_path}
    params["prune"].update(prune)
    Path("llm.yaml").write_text(yaml.safe_dump(params))
    return check_all("llm.yaml")


def test_every_architecture_name_maps_to_a_family_the_core_prunes_and_gemma3_to_its_text_model():
    assert set(GGUF_ARCHITECTURES.values()) <= set(FAMILIES)
    assert GGUF_ARCHITECTURES["gemma3"] == "gemma3_text"
    assert {LLAMA_CPP_ARCH[f] for f in FAMILY_NAMES} == set(GGUF_ARCHITECTURES)  # each one tested below


@pytest.mark.parametrize("model_type", FAMILY_NAMES)
def test_a_tiny_gguf_of_each_family_converts_to_its_family_and_gives_its_source_models_logits(model_type, tmp_path):
    model = tiny(model_type)
    path = write_tiny_gguf(tmp_path / f"{model_type}.gguf", model)
    folder = convert_gguf(path, tmp_path / "converted")
    # By the table: a Mistral comes back a Llama (llama.cpp writes it so, and transformers makes it a Mistral only
    # when general.name is exactly "mistral"), which is Mistral's computation with no sliding window.
    assert json.loads((folder / "config.json").read_text())["model_type"] == GGUF_ARCHITECTURES[
        LLAMA_CPP_ARCH[model_type]]
    from transformers import AutoModelForCausalLM

    converted = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        expected, got = model(torch.tensor(IDS)).logits, converted(torch.tensor(IDS)).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)  # Gemma's norms pass through 1 + weight


def test_a_gemma3_gguf_passes_the_checks_by_params_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_tiny_gguf(tmp_path / "gemma.gguf", tiny_decoder("gemma3_text"))
    assert lm_problems("gemma.gguf", uniform=True, save_fractions=[0.333], kv_group_fractions=[0.333]) == []


def test_a_gguf_with_one_kv_head_a_layer_has_its_kv_group_levels_refused_naming_the_levels_it_can_take(
        tmp_path, monkeypatch):
    # Gemma 3 270M's shape in small: 4 query heads sharing one key/value head in every layer.
    monkeypatch.chdir(tmp_path)
    write_tiny_gguf(tmp_path / "gemma.gguf", tiny_decoder("gemma3_text", kv_heads=1))
    found = lm_problems("gemma.gguf", uniform=True, save_fractions=[], kv_group_fractions=[0.5])
    assert found == [
        "prune.kv_group_fractions: 0.5 of the heads cannot go alike from 2 attention layers of 9 query heads in 1 "
        "key/value groups, taken in whole groups of 9; the levels it can save are none"]
    assert lm_problems("gemma.gguf", uniform=True, save_fractions=[0.333], kv_group_fractions=[]) == []



def test_a_gpt2_gguf_of_other_than_1024_positions_is_refused_for_transformers_would_build_1024(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = tiny_decoder("gpt2")
    assert lm_problems(str(write_tiny_gguf(tmp_path / "gpt2.gguf", model)), kv_group_fractions=[]) == []
    model.config.n_positions = 64  # the header says 64
    write_tiny_gguf(tmp_path / "short.gguf", model)
    assert lm_problems("short.gguf", kv_group_fractions=[]) == [
        "model.name_or_path: short.gguf is a GPT-2 of 64 positions, but transformers' GGUF reader builds every GPT-2 "
        "with 1,024 (it ignores context_length), so prepare could not convert it; convert the original checkpoint "
        "instead"]
