"""The Marian transformer the MT experiments train from scratch: its config, a fresh model, and its batches.

Marian is used because the attention-site table (pipeline/core/sites.py) already knows its layout; the
fairseq backend reuses `collate_pairs` and `decoder_inputs`, so both backends see the same batches.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from transformers import GenerationConfig, MarianConfig, MarianMTModel, PreTrainedTokenizerBase

from pipeline.core.importance import LABEL_PAD


def marian_config(
    tokenizer: PreTrainedTokenizerBase,
    d_model: int = 256,
    layers: tuple[int, int] = (3, 3),
    heads: int = 8,
    ffn_dim: int = 1024,
    max_positions: int = 256,
    dropout: float = 0.1,
) -> MarianConfig:
    """A Marian config sized for `tokenizer`'s vocabulary; `layers` is (encoder, decoder).

    As in Marian: the decoder starts from the pad token, sentences end in </s>, there is no BOS, and
    the input embeddings, output embeddings and LM head are one shared matrix. Positions are
    sinusoidal, so `max_positions` only sizes the table. Embeddings are scaled by sqrt(d_model)
    (Vaswani et al.), which the opus-mt checkpoints also do.
    """
    if d_model % heads:
        raise ValueError(f"d_model ({d_model}) must be divisible by heads ({heads})")
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    if pad is None or eos is None:
        raise ValueError("the tokenizer needs a pad and an eos token")
    enc_layers, dec_layers = layers
    return MarianConfig(
        vocab_size=len(tokenizer),
        d_model=d_model,
        encoder_layers=enc_layers,
        decoder_layers=dec_layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=ffn_dim,
        decoder_ffn_dim=ffn_dim,
        max_position_embeddings=max_positions,
        dropout=dropout,
        attention_dropout=dropout,
        activation_dropout=0.0,
        activation_function="relu",
        scale_embedding=True,
        pad_token_id=pad,
        eos_token_id=eos,
        decoder_start_token_id=pad,
        bos_token_id=None,
        forced_eos_token_id=None,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
    )


def new_marian(config: MarianConfig, seed: int = 0) -> MarianMTModel:
    """A freshly initialised model (seeded), with generation defaults fit for a small model.

    Beam 4 as in Vaswani et al.; pad is suppressed in the output because it doubles as the decoder start
    token, which the model should never generate again. The model is returned in eval mode.
    """
    torch.manual_seed(seed)
    model = MarianMTModel._from_config(config, attn_implementation="sdpa")
    # Embeddings are multiplied by sqrt(d_model); initialised at HF's std 0.02 they come out ~0.2 against
    # sinusoidal positions of ~1, and training crawls (BLEU 0.1 after 300 steps here). std d_model^-0.5,
    # as in Vaswani et al. and fairseq, makes the scaled embeddings ~1.
    shared = model.get_input_embeddings().weight
    with torch.no_grad():
        nn.init.normal_(shared, mean=0.0, std=config.d_model**-0.5)
        shared[config.pad_token_id].zero_()
    model.generation_config = GenerationConfig(
        decoder_start_token_id=config.decoder_start_token_id,
        pad_token_id=config.pad_token_id,
        eos_token_id=config.eos_token_id,
        bos_token_id=None,
        forced_eos_token_id=None,
        suppress_tokens=[config.pad_token_id],
        num_beams=4,
        max_new_tokens=config.max_position_embeddings - 1,  # sinusoidal positions: the table's size
    )
    return model.eval()


def collate_pairs(
    input_ids: Sequence[Sequence[int]], labels: Sequence[Sequence[int]], pad_id: int
) -> dict[str, torch.Tensor]:
    """Right-pad a batch: input_ids with pad (attention_mask 0 there), labels with -100 (never scored)."""
    n, src_len, tgt_len = len(input_ids), max(map(len, input_ids)), max(map(len, labels))
    ids = torch.full((n, src_len), pad_id, dtype=torch.long)
    mask = torch.zeros((n, src_len), dtype=torch.long)
    out = torch.full((n, tgt_len), LABEL_PAD, dtype=torch.long)
    for i, (x, y) in enumerate(zip(input_ids, labels, strict=True)):
        ids[i, : len(x)] = torch.tensor(x)
        mask[i, : len(x)] = 1
        out[i, : len(y)] = torch.tensor(y)
    return {"input_ids": ids, "attention_mask": mask, "labels": out}


def decoder_inputs(labels: torch.Tensor, start_id: int, pad_id: int) -> torch.Tensor:
    """Teacher forcing: the target shifted right behind the start token, label padding turned into pad."""
    shifted = torch.full_like(labels, pad_id)
    shifted[:, 0] = start_id
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill(shifted == LABEL_PAD, pad_id)
