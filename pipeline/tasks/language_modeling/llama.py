"""The decoder the LM experiments train from scratch, and its batches and token losses.

Llama because it is the architecture of today's open models (Llama, Qwen, Mistral and SmolLM differ from it
in details), and because its attention is grouped-query: `kv_heads` key/value heads, each shared by
heads / kv_heads query heads, which is what a head-pruning study of modern models must handle.

Batching: one text (a sentence, or a window of a longer text) per row, right-padded, rather than packed
blocks of concatenated texts. The sweeps compare models example by example (the paired bootstrap), and a row
is a natural example only if it is one text; packing would also let a sentence attend to unrelated ones
unless masked. Tatoeba's sentences are short (about 12 tokens), so sorting by length keeps padding small.
HF's causal-LM convention: labels are the input ids, shifted inside the loss, with -100 on padding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from pipeline.core.importance import LABEL_PAD


def llama_config(
    tokenizer: PreTrainedTokenizerBase,
    hidden_size: int = 128,
    layers: int = 6,
    heads: int = 8,
    kv_heads: int = 2,
    intermediate_size: int = 384,
    max_positions: int = 64,
    dropout: float = 0.0,
) -> LlamaConfig:
    """A small Llama config sized for `tokenizer`'s vocabulary, with tied input and output embeddings (as SmolLM
    and the small Qwen and Llama 3.2 models tie them: at this size the two matrices would be most parameters)."""
    if hidden_size % heads or heads % kv_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must divide by heads ({heads}), and heads by kv_heads "
                         f"({kv_heads})")
    eos = tokenizer.eos_token_id
    if eos is None or tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer needs a pad and an eos token")
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_positions,
        attention_dropout=dropout,
        bos_token_id=tokenizer.bos_token_id if tokenizer.bos_token_id is not None else eos,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )


def new_llama(config: LlamaConfig, seed: int = 0) -> LlamaForCausalLM:
    """A freshly initialised model (seeded, HF's initialisation), in eval mode."""
    torch.manual_seed(seed)
    return LlamaForCausalLM._from_config(config, attn_implementation="sdpa").eval()


def collate_texts(sequences: Sequence[Sequence[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a batch of token sequences: attention_mask 0 and label -100 on padding, labels == input_ids
    elsewhere (the model shifts them)."""
    n, longest = len(sequences), max(map(len, sequences))
    ids = torch.full((n, longest), pad_id, dtype=torch.long)
    mask = torch.zeros((n, longest), dtype=torch.long)
    for i, x in enumerate(sequences):
        ids[i, : len(x)] = torch.tensor(x)
        mask[i, : len(x)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, LABEL_PAD)}


def token_nll(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed NLL, number of predicted tokens) of each row: position t predicts label t + 1, and labels -100
    are never scored. Logits are upcast to fp32 (float64 stays float64) for the loss, as under autocast."""
    logits = logits[:, :-1].to(torch.promote_types(logits.dtype, torch.float32))
    targets = labels[:, 1:]
    nll = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=LABEL_PAD, reduction="none")
    return nll.sum(dim=1), (targets != LABEL_PAD).sum(dim=1)


def batch_nll(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_nll` of `model` on a batch from `collate_texts` (on the model's device)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return token_nll(logits, batch["labels"])
