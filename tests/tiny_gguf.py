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


def _llama_cpp_order(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's row order of a query or key projection (convert_hf_to_gguf.py, LlamaModel.permute): within each
    head, the two rotary halves interleaved. transformers' GGUF loader undoes it."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def write_tiny_gguf(path: Path, model: transformers.LlamaForCausalLM, tokenizer: bool = True) -> Path:
    """`model` as a GGUF file at `path`; without `tokenizer`, a file with no tokenizer.ggml.* metadata."""
    c = model.config
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("tiny llama")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_dimension_count(c.head_dim)
    writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
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
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, c.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue  # llama.cpp writes no output matrix for tied embeddings
        base, suffix = name.rsplit(".", 1)
        weight = tensor.detach().float().numpy()
        if base.endswith("q_proj"):
            weight = _llama_cpp_order(weight, c.num_attention_heads)
        elif base.endswith("k_proj"):
            weight = _llama_cpp_order(weight, c.num_key_value_heads)
        writer.add_tensor(f"{names.get_name(base)}.{suffix}", np.ascontiguousarray(weight))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
