"""A tiny GGUF file written as llama.cpp's convert_hf_to_gguf.py writes a Llama model: its metadata keys, its tensor
names and its reordering of the query and key rows, with a byte-level BPE tokenizer under tokenizer.ggml.* as
SmolLM2's file has (its special tokens and ids, no BOS added). The tensors are float32 where the real default's
are Q4_1: the conversion is the same, with no rounding to hide a mistake behind."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
import transformers
from transformers.convert_slow_tokenizer import bytes_to_unicode

from pipeline.core.sites import attention_sites, ffn_sites
from pipeline.core.surgery import prune_heads, prune_neurons

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # SmolLM2's unknown, BOS and EOS (also its padding)
UNK, BOS, EOS = 0, 1, 2
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s", "a t", "e n", "Ġ w", "Ġ c", "o u", "i s"]
CONTROL, NORMAL = 3, 1  # llama.cpp's token types


def vocabulary() -> list[str]:
    """Every byte in GPT-2's byte alphabet (so any text encodes), the special tokens first, merged tokens last."""
    return [*SPECIALS, *bytes_to_unicode().values(), *("".join(m.split()) for m in MERGES)]


def tiny_gqa_llama(seed: int = 0, layers: int = 2) -> transformers.LlamaForCausalLM:
    """A random Llama with grouped-query attention as SmolLM2 has it (9 query heads in 3 groups, tied embeddings),
    head_dim 6 given explicitly (not hidden / heads = 4), sized for `vocabulary()`."""
    config = transformers.LlamaConfig(
        vocab_size=len(vocabulary()), hidden_size=36, intermediate_size=37, num_hidden_layers=layers,
        num_attention_heads=9, num_key_value_heads=3, head_dim=6, max_position_embeddings=64, rope_theta=10000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=EOS)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa").eval()


def tiny_decoder(model_type: str, seed: int = 0, kv_heads: int = 3,
                 vocab_size: int | None = None) -> transformers.PreTrainedModel:
    """A random 2-layer decoder of another family that transformers reads from GGUF, sized for `vocabulary()`, in
    the shapes its GGUF reader can express: Qwen2's head size is hidden / heads (the reader takes no other), Qwen3's
    128 (the reader's default), Gemma 3's attention scale its default 256 (no GGUF key states it), GPT-2's context
    1,024 positions (the reader puts context_length in n_ctx, which GPT2Config ignores for its default n_positions)."""
    common = dict(vocab_size=vocab_size or len(vocabulary()), num_hidden_layers=2, max_position_embeddings=64,
                  tie_word_embeddings=True, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=EOS)
    gqa = dict(common, hidden_size=36, intermediate_size=37, num_attention_heads=9, num_key_value_heads=kv_heads,
               rms_norm_eps=1e-6)
    configs = {
        "mistral": lambda: transformers.MistralConfig(**gqa, head_dim=6, sliding_window=None),
        "qwen2": lambda: transformers.Qwen2Config(**gqa),
        "qwen3": lambda: transformers.Qwen3Config(**{**gqa, "hidden_size": 32}, head_dim=128),
        "gemma3_text": lambda: transformers.Gemma3TextConfig(**gqa, head_dim=6, sliding_window=4),
        "gpt2": lambda: transformers.GPT2Config(vocab_size=len(vocabulary()), n_embd=32, n_layer=2, n_head=4,
                                                n_positions=1024, bos_token_id=BOS, eos_token_id=EOS),
    }
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(configs[model_type](), attn_implementation="eager").eval()


# llama.cpp's architecture name of each family (convert_hf_to_gguf.py): Mistral's files say llama.
LLAMA_CPP_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3",
                  "gpt2": "gpt2"}


def _llama_cpp_order(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's row order of a query or key projection (convert_hf_to_gguf.py, LlamaModel.permute): within each
    head, the two rotary halves interleaved. transformers' GGUF loader undoes it."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def _llama_cpp_tensor(model_type: str, name: str, weight: np.ndarray, c) -> np.ndarray:
    """A weight as llama.cpp's converter stores it for the family."""
    if model_type in ("llama", "mistral") and ".q_proj." in name:
        return _llama_cpp_order(weight, c.num_attention_heads)
    if model_type in ("llama", "mistral") and ".k_proj." in name:
        return _llama_cpp_order(weight, c.num_key_value_heads)
    if model_type == "gemma3_text" and name.endswith("norm.weight"):
        return weight + 1  # Gemma's norms multiply by 1 + weight; llama.cpp stores the factor
    if model_type == "gpt2" and name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
        return weight.T  # GPT-2's Conv1D keeps (in, out); ggml wants (out, in)
    return weight


def _shape_keys(writer: gguf.GGUFWriter, model_type: str, c) -> None:
    if model_type == "gpt2":
        writer.add_context_length(c.n_positions)
        writer.add_embedding_length(c.n_embd)
        writer.add_block_count(c.n_layer)
        writer.add_feed_forward_length(4 * c.n_embd)
        writer.add_head_count(c.n_head)
        writer.add_layer_norm_eps(c.layer_norm_epsilon)
        return
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    if model_type in ("llama", "mistral"):
        writer.add_rope_dimension_count(head_dim)
    else:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    rope = c.rope_parameters.get("full_attention", c.rope_parameters)
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    if model_type == "gemma3_text":
        writer.add_sliding_window(c.sliding_window)


def write_tiny_gguf(path: Path, model: transformers.PreTrainedModel, tokenizer: bool = True,
                    truncate: int = 0) -> Path:
    """`model` (a Llama, or any family of `LLAMA_CPP_ARCH`) as llama.cpp's converter writes it, at `path`; without
    `tokenizer`, a file with no tokenizer.ggml.* metadata; with `truncate`, that many bytes cut off its end (a copy
    that stopped early)."""
    c = model.config
    model_type = c.model_type
    arch = LLAMA_CPP_ARCH[model_type]
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(f"tiny {model_type}")  # "mistral" in the name is what makes transformers read a Mistral
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    _shape_keys(writer, model_type, c)
    writer.add_vocab_size(c.vocab_size)
    if tokenizer:
        tokens = vocabulary()
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("smollm")
        writer.add_token_list(tokens)
        writer.add_token_types([CONTROL] * len(SPECIALS) + [NORMAL] * (len(tokens) - len(SPECIALS)))
        writer.add_token_merges(MERGES)
        writer.add_unk_token_id(UNK)
        writer.add_bos_token_id(BOS)
        writer.add_eos_token_id(EOS)
        writer.add_pad_token_id(EOS)
        writer.add_add_bos_token(False)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], 2 if model_type == "gpt2" else
                                     c.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings and model_type != "gpt2":
            continue  # llama.cpp writes no output matrix for tied embeddings (GPT-2's converter copies it)
        base, suffix = name.rsplit(".", 1)
        weight = _llama_cpp_tensor(model_type, name, tensor.detach().float().numpy(), c)
        writer.add_tensor(f"{names.get_name(base)}.{suffix}", np.ascontiguousarray(weight))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if truncate:
        data = path.read_bytes()
        path.write_bytes(data[:-truncate])
    return path


def tiny_tokenizer() -> transformers.PreTrainedTokenizerBase:
    """`vocabulary()` and `MERGES` as a byte-level BPE tokenizer with SmolLM2's special tokens (no BOS added), for a
    folder saved beside a tiny model."""
    tokenizer = transformers.GPT2Tokenizer(
        vocab={token: i for i, token in enumerate(vocabulary())}, merges=[tuple(m.split()) for m in MERGES],
        unk_token=SPECIALS[UNK], bos_token=SPECIALS[BOS], eos_token=SPECIALS[EOS], pad_token=SPECIALS[EOS])
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIALS}, replace_extra_special_tokens=False)
    return tokenizer


def tiny_gemma_tokenizer() -> transformers.PreTrainedTokenizerBase:
    """A sentencepiece-style BPE as Gemma's (byte fallback, spaces as U+2581, <pad> <eos> <bos> <unk> first), with
    a few merges: what a real Gemma 3 folder's tokenizer.json holds, small."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    merges = [("▁", "t"), ("h", "e"), ("▁t", "he"), ("i", "n"), ("▁", "a"), ("e", "r"), ("o", "n"), ("a", "t")]
    chars = sorted(set("abcdefghijklmnopqrstuvwxyzHW0123456789,.!?'") | {"▁"})
    pieces = [*specials, *(f"<0x{i:02X}>" for i in range(256)), *chars, *("".join(m) for m in merges)]
    return transformers.GemmaTokenizer(vocab={p: i for i, p in enumerate(pieces)}, merges=merges)


def tiny_llama_for_q8():
    """A Llama whose matrices' rows stay multiples of Q8_0's 32-value blocks once pruned: hidden 96, 8 query heads of
    16 in 2 key/value groups (6 left still divide the hidden size, as LlamaConfig requires), 160 FFN neurons."""
    config = transformers.LlamaConfig(
        vocab_size=len(vocabulary()), hidden_size=96, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-5,
        tie_word_embeddings=True, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=EOS)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa").eval()
    with torch.no_grad():  # weights of a trained model's scale, so that the logits are no flat noise
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0, 0.2)
    return model


def prune_uniformly(model, heads_per_group: list[int], neurons: int):
    """Every layer alike: the given query heads (original indices, the same number from each group) and the first
    `neurons` FFN neurons removed."""
    prune_heads(model, {i: heads_per_group for i in range(len(attention_sites(model)))})
    prune_neurons(model, {i: list(range(neurons)) for i in range(len(ffn_sites(model)))})
    return model
