"""The name llama.cpp splits a byte-level BPE tokenizer's text by (`tokenizer.ggml.pre`), chosen as llama.cpp's own
converter chooses it where that is right, and refused where llama.cpp would split text otherwise than the folder's
tokenizer does.

llama.cpp does not read a tokenizer's regex from the file: it reads a name, and applies the regexes it has compiled
in for that name (src/llama-vocab.cpp, `llm_tokenizer_bpe`), each splitting the pieces the one before left. A wrong
name costs nothing at load and everything after: SmolLM2 written as "default" scores 1.46x its perplexity in
llama.cpp. The name is the one whose split cuts text into the folder tokenizer's own pieces (before its merges), on
the check text of llama.cpp's own converter (`convert_hf_to_gguf.py`, conversion/base.py, `get_vocab_base_pre`),
split with llama.cpp's regexes in llama.cpp's order through `tokenizers`: equal pieces give equal ids whatever the
merges, where equal ids on one text would not. The converter's choice, the name its hash of the tokenizer's ids
names, is tried first, and written only where its split passes too. This matters for the default model. transformers
rebuilds SmolLM2's tokenizer from its GGUF file with GPT-2's split, without SmolLM's split of digits, so the folder
hashes to SmolLM's `smollm`, yet "the 1980s" falls into other pieces under it (two spaces before a digit): the
folder's split is llama.cpp's `gpt-2`. Any other tokenizer is refused in one line. tests/test_llama_cpp.py checks
the ids of a paragraph through llama.cpp itself where it is built, and the export stage those of the whole test
text.
"""

from __future__ import annotations

import hashlib

# convert_hf_to_gguf.py's check text (conversion/base.py, get_vocab_base_pre): spaces, tabs and newlines in runs,
# emoji with joiners, digit runs, Khmer, Chinese, Cyrillic, runs of punctuation and English contractions in mixed case.
CHECK_TEXT = ("\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) "
              "✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 "
              "កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ "
              "------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE "
              "you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL")

# llama.cpp's regexes of each name this module writes, in the order it applies them (src/llama-vocab.cpp,
# llm_tokenizer_bpe: GPT2 at line 372, SMOLLM 362, LLAMA3 284, QWEN2 383; the last two as llama.cpp adapted them
# from the tokenizer.json originals, case-insensitive contractions spelt out).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
SPLITS: dict[str, tuple[str, ...]] = {
    "gpt-2": (_GPT2,),
    "smollm": (r"\p{N}", _GPT2),
    "llama-bpe": (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "qwen2": (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
}

# The sha256 of str(token ids of CHECK_TEXT) that convert_hf_to_gguf.py maps to each name above, with the model it
# cites (conversion/base.py of llama.cpp 11434); hashes of names not in SPLITS are left out.
KNOWN_HASHES = {
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",  # openai-community/gpt2
    "0fe1cf6eda062318a1af7270f3331a85c539a01778ff948e24388e949c5282f4": "gpt-2",  # evilfreelancer/ruGPT3XL
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",  # HuggingFaceTB/SmolLM-135M
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",  # meta-llama/Meta-Llama-3-8B
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",  # Qwen/Qwen1.5-7B
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": "qwen2",  # Qwen/Qwen3-Embedding-0.6B
}


class PreTokenizerError(ValueError):
    """A tokenizer whose split no llama.cpp pre-tokenizer name this module writes reproduces: one line."""


def check_hash(ids: list[int]) -> str:
    """convert_hf_to_gguf.py's fingerprint of a tokenizer: the sha256 of the printed list of CHECK_TEXT's ids."""
    return hashlib.sha256(str(ids).encode()).hexdigest()


def _split(regexes: tuple[str, ...]):
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence([*(pre_tokenizers.Split(Regex(regex), behavior="isolated") for regex in regexes),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def llama_cpp_pieces(name: str, text: str) -> list[str]:
    """The pieces llama.cpp cuts `text` into under `name`, in GPT-2's byte alphabet: each regex of SPLITS[name]
    isolating its matches in the pieces the previous one left."""
    return [piece for piece, _ in _split(SPLITS[name]).pre_tokenize_str(text)]


def pieces(tokenizer, text: str) -> list[str]:
    """The pieces the folder's tokenizer cuts `text` into before its merges (its normalizer, then its
    pre-tokenizer)."""
    backend = tokenizer.backend_tokenizer
    if backend.normalizer is not None:
        text = backend.normalizer.normalize_str(text)
    return [piece for piece, _ in backend.pre_tokenizer.pre_tokenize_str(text)]


def llama_cpp_ids(tokenizer, name: str, text: str) -> list[int]:
    """The ids of `text` from `tokenizer`'s own vocabulary and merges, split as llama.cpp splits it under `name`."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.normalizer = None
    backend.pre_tokenizer = _split(SPLITS[name])
    return backend.encode(text, add_special_tokens=False).ids


def choose(tokenizer, where: str) -> str:
    """The llama.cpp pre-tokenizer name to write for the byte-level BPE `tokenizer` (of the folder `where`): the one
    whose split cuts the check text into the tokenizer's own pieces, so that every text gets the tokenizer's ids,
    whatever its merges. The converter's name (by hash) is tried first; it is written only where its split passes
    too. Raises PreTokenizerError where none does."""
    want = pieces(tokenizer, CHECK_TEXT)
    named = KNOWN_HASHES.get(check_hash(tokenizer.encode(CHECK_TEXT, add_special_tokens=False)))
    for candidate in dict.fromkeys([*([named] if named else []), *SPLITS]):
        if llama_cpp_pieces(candidate, CHECK_TEXT) == want:
            return candidate
    raise PreTokenizerError(f"{where}'s tokenizer splits text as none of llama.cpp's pre-tokenizers "
                            f"{', '.join(SPLITS)} does (convert_hf_to_gguf.py's check text falls into other pieces), "
                            f"so llama.cpp would read the file with other tokens")
