"""Pruned models leave as GGUF (pipeline/export/gguf.py): `python -m pipeline.export gguf <folder> <file.gguf>`.

Every exported file is read back by transformers' own GGUF loader (`gguf_file=`) in a process that imports nothing of
the project, and compared with the saved folder read by stock `from_pretrained`: logits to fp16 tolerance (F16),
perplexity to 0.1% (F32, F16) and the mean NLL of a random token batch to 1% (Q8_0), and the tokenizer's ids. Tiny
models pruned uniformly by the project's own surgery, in seconds.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import gguf
import pytest
import torch

from pipeline.core.checkpoint import save_model
from pipeline.core.surgery import prune_heads
from pipeline.export.gguf import ExportError, export_gguf
from pipeline.files.schema import PRUNING_FILE
from tests.tiny_gguf import (
    BOS,
    EOS,
    prune_uniformly,
    tiny_decoder,
    tiny_gemma_tokenizer,
    tiny_llama_for_q8,
    tiny_tokenizer,
    vocabulary,
)
from tests.tiny_project import ROOT

TEXTS = ["the cat sat on the mat", "  Hello, World! 2024 is 1 year.", "<|im_start|>user\nhi<|im_end|>", ""]
IDS = [[BOS, 86, 260, 270, 267, 266, 20, 18, 20, 22, EOS, 7, 100]]


def random_batch(seed: int = 0, rows: int = 4, length: int = 48) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, len(vocabulary()), (rows, length), generator=generator).tolist()


@pytest.fixture(scope="module")
def pruned_llama(tmp_path_factory) -> Path:
    """The tiny Llama with one query head of each group and 32 neurons a layer removed, saved as the prune stage
    saves it: a stock folder with its pruning record."""
    folder = tmp_path_factory.mktemp("pruned") / "llama"
    save_model(prune_uniformly(tiny_llama_for_q8(), [0, 4], 32), folder, tiny_tokenizer())
    assert json.loads((folder / PRUNING_FILE).read_text())["stock"]
    assert json.loads((folder / "config.json").read_text())["num_attention_heads"] == 6
    return folder


@pytest.fixture(scope="module")
def families(tmp_path_factory) -> dict[str, Path]:
    """A saved folder of each other exported family, pruned where transformers' GGUF reader can read the shape."""
    root = tmp_path_factory.mktemp("families")
    folders = {}
    for name, model in [("qwen2", tiny_decoder("qwen2")),  # unpruned: the reader takes head_dim as hidden / heads
                        ("qwen3", prune_uniformly(tiny_decoder("qwen3"), [0, 3, 6], 5)),
                        ("gemma3_text", prune_uniformly(tiny_decoder("gemma3_text", vocab_size=len(
                            tiny_gemma_tokenizer())), [1, 4, 7], 5))]:
        tokenizer = tiny_gemma_tokenizer() if name == "gemma3_text" else tiny_tokenizer()
        folders[name] = save_model(model, root / name, tokenizer)
    return folders


@pytest.fixture(scope="module")
def exported(pruned_llama, families, tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """name -> (saved folder, exported file): the pruned Llama in each type, the other families in F32."""
    out = tmp_path_factory.mktemp("gguf")
    files = {t: (pruned_llama, export_gguf(pruned_llama, out / f"llama.{t}.gguf", t)) for t in ("f32", "f16", "q8_0")}
    for name, folder in families.items():
        files[name] = (folder, export_gguf(folder, out / f"{name}.gguf", "f32"))
    return files


# What a llama.cpp user's other tool sees: transformers alone reads the GGUF file and the saved folder.
READ_BACK = """
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
pairs, ids, batch, texts = (json.loads(a) for a in sys.argv[1:5])

def scores(model):
    with torch.no_grad():
        logits = model(torch.tensor(ids)).logits
        batch_logits = model(torch.tensor(batch)).logits
    nll = torch.nn.functional.cross_entropy(batch_logits[:, :-1].flatten(0, 1), torch.tensor(batch)[:, 1:].flatten())
    return logits.tolist(), nll.item()

out = {}
for name, (folder, path) in pairs.items():
    saved = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    folder_logits, folder_nll = scores(saved)
    with torch.no_grad():  # the folder's matrices rounded to fp16, as an F16 file holds them (norms stay F32)
        for p in saved.parameters():
            if p.ndim == 2:
                p.copy_(p.half().float())
    half_logits, _ = scores(saved)
    model = AutoModelForCausalLM.from_pretrained(path.rsplit("/", 1)[0], gguf_file=path.rsplit("/", 1)[1],
                                                 dtype=torch.float32).eval()
    gguf_logits, gguf_nll = scores(model)
    tokenizer = AutoTokenizer.from_pretrained(path.rsplit("/", 1)[0], gguf_file=path.rsplit("/", 1)[1])
    folder_tokenizer = AutoTokenizer.from_pretrained(folder)
    out[name] = {"folder_logits": folder_logits, "gguf_logits": gguf_logits, "folder_nll": folder_nll,
                 "half_logits": half_logits,
                 "gguf_nll": gguf_nll, "model_type": model.config.model_type,
                 "encoded": [tokenizer(t)["input_ids"] for t in texts],
                 "folder_encoded": [folder_tokenizer(t)["input_ids"] for t in texts]}
out["project_imported"] = any(n == "pipeline" or n.startswith(("pipeline.", "tests.")) for n in sys.modules)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def read_back(exported, tmp_path_factory) -> dict:
    """Every exported file and its folder, read in one fresh process with -I (no PYTHONPATH, no current folder on
    the path) from a folder outside the project: nothing of the project is importable there."""
    pairs = {name: [str(folder), str(path)] for name, (folder, path) in exported.items()}
    result = subprocess.run(
        [sys.executable, "-I", "-c", READ_BACK, json.dumps(pairs), json.dumps(IDS), json.dumps(random_batch()),
         json.dumps(TEXTS)], cwd=tmp_path_factory.mktemp("elsewhere"), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def test_the_read_back_imports_nothing_of_the_project(read_back):
    assert read_back["project_imported"] is False


@pytest.mark.parametrize("out_type", ["f32", "f16"])
def test_a_uniformly_pruned_llama_read_back_by_transformers_alone_gives_the_folders_logits_and_perplexity(
        read_back, out_type):
    r = read_back[out_type]
    assert r["model_type"] == "llama"
    # F32 holds the folder's own numbers; F16 holds them rounded to fp16, and nothing else differs: its logits are
    # those of the folder's model with its matrices so rounded, and within fp16's rounding of the folder's.
    same = r["gguf_logits"], r["folder_logits" if out_type == "f32" else "half_logits"]
    torch.testing.assert_close(torch.tensor(same[0]), torch.tensor(same[1]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.tensor(r["gguf_logits"]), torch.tensor(r["folder_logits"]), rtol=1e-2,
                               atol=2e-2)
    assert math.exp(r["gguf_nll"]) == pytest.approx(math.exp(r["folder_nll"]), rel=1e-3)  # perplexity to 0.1%


def test_a_q8_0_llama_keeps_the_mean_nll_of_a_random_batch_within_1_percent(read_back):
    r = read_back["q8_0"]
    assert r["gguf_nll"] == pytest.approx(r["folder_nll"], rel=0.01)
    assert r["gguf_logits"] != r["folder_logits"]  # really quantised


@pytest.mark.parametrize("name", ["qwen2", "qwen3", "gemma3_text"])
def test_qwen2_qwen3_and_gemma3_folders_read_back_with_their_logits(read_back, name):
    r = read_back[name]
    assert r["model_type"] == name
    torch.testing.assert_close(torch.tensor(r["gguf_logits"]), torch.tensor(r["folder_logits"]), rtol=1e-5,
                               atol=1e-5)


def test_the_exported_tokenizer_encodes_as_the_folders_byte_level_bpe_and_gemmas_sentencepiece(read_back):
    for name in ("f32", "qwen3", "gemma3_text"):
        assert read_back[name]["encoded"] == read_back[name]["folder_encoded"]
    assert read_back["gemma3_text"]["encoded"] != read_back["f32"]["encoded"]  # two tokenizers, not one


def test_gemmas_tokenizer_is_written_as_llama_cpps_sentencepiece_with_byte_pieces(exported):
    reader = gguf.GGUFReader(exported["gemma3_text"][1])
    assert reader.fields["tokenizer.ggml.model"].contents() == "llama"
    tokens, types = reader.fields["tokenizer.ggml.tokens"].contents(), reader.fields["tokenizer.ggml.token_type"]
    kinds = dict(zip(tokens, types.contents(), strict=True))
    assert (kinds["<0x41>"], kinds["<bos>"], kinds["<unk>"], kinds["▁the"]) == (6, 3, 2, 1)


def test_the_file_holds_each_type_as_asked_and_keeps_norms_in_f32(exported):
    for out_type, wanted in (("f32", "F32"), ("f16", "F16"), ("q8_0", "Q8_0")):
        reader = gguf.GGUFReader(exported[out_type][1])
        types = {t.name: t.tensor_type.name for t in reader.tensors}
        assert {types[n] for n in types if n.endswith(("attn_q.weight", "ffn_down.weight", "token_embd.weight"))} == {
            wanted}
        assert {types[n] for n in types if "norm" in n} == {"F32"}
        assert "output.weight" not in types  # tied: one embedding
        assert reader.fields["general.architecture"].contents() == "llama"
        assert reader.fields["llama.attention.head_count"].contents() == 6
        assert reader.fields["llama.attention.key_length"].contents() == 16


# --- what is refused, in one line, with nothing written -----------------------------------------------------------


def test_a_non_uniform_folder_is_refused_saying_why_and_nothing_is_written(tmp_path):
    model = tiny_llama_for_q8()
    prune_heads(model, {0: [0, 4]})  # layer 0 loses a head of each group, layer 1 none
    folder = save_model(model, tmp_path / "uneven", tiny_tokenizer())
    with pytest.raises(ExportError) as error:
        export_gguf(folder, tmp_path / "uneven.gguf")
    assert str(error.value).startswith(f"{folder} cannot be one GGUF file: its layers differ ((query, key/value) "
                                       f"heads per layer: [6, 8] / [2, 2]")
    assert str(error.value).endswith("GGUF gives every layer one shape, so export a uniform level "
                                     "(prune.uniform: true)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["uneven"]


def test_a_shape_transformers_would_read_otherwise_is_refused_naming_the_key(tmp_path):
    # A pruned Qwen2: 6 heads of 4 in a hidden size of 36; transformers' reader would take head_dim 36 / 6 = 6.
    folder = save_model(prune_uniformly(tiny_decoder("qwen2"), [0, 3, 6], 0), tmp_path / "qwen2", tiny_tokenizer())
    with pytest.raises(ExportError) as error:
        export_gguf(folder, tmp_path / "qwen2.gguf")
    assert str(error.value) == (f"{folder} cannot be exported to GGUF as it stands: transformers' GGUF reader would "
                                f"read head_dim 6 from the file, not the model's 4")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["qwen2"]


def test_a_family_that_is_not_exported_is_refused_naming_those_that_are(tmp_path):
    folder = save_model(tiny_decoder("gpt2"), tmp_path / "gpt2", tiny_tokenizer())
    with pytest.raises(ExportError, match=r"is a gpt2 model; GGUF export writes llama, qwen2, qwen3, gemma3_text "
                                          r"models$"):
        export_gguf(folder, tmp_path / "gpt2.gguf")


def test_the_command_writes_the_file_and_refuses_bad_input_in_one_line(pruned_llama, tmp_path):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pipeline.export", "gguf", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)

    dest = tmp_path / "model.gguf"
    result = run(str(pruned_llama), str(dest), "--type", "q8_0")
    assert result.returncode == 0 and result.stdout.startswith(f"wrote {dest} (") and dest.is_file(), result.stderr
    result = run(str(tmp_path / "missing"), str(tmp_path / "other.gguf"))
    assert result.returncode == 1 and result.stderr == (
        f"error: {tmp_path / 'missing'} is not a saved model folder: it has no config.json\n")
    assert not (tmp_path / "other.gguf").exists()
