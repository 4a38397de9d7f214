"""Tiny random models of every supported family, built from configs in well under a second."""

from __future__ import annotations

import torch
import transformers

from pipeline.core.gates import head_gates
from pipeline.core.importance import per_example_loss
from pipeline.core.sites import attention_sites

VOCAB = 96
PAD, EOS = 0, 1

_COMMON = dict(vocab_size=VOCAB, pad_token_id=PAD)
_ENCODER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                max_position_embeddings=64, **_COMMON)
_SEQ2SEQ = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=64,
                eos_token_id=EOS, decoder_start_token_id=PAD, bos_token_id=PAD, forced_eos_token_id=None,
                **_COMMON)

CONFIGS = {
    "bert": (transformers.BertConfig, _ENCODER, transformers.BertForSequenceClassification),
    "roberta": (transformers.RobertaConfig, _ENCODER, transformers.RobertaForSequenceClassification),
    "electra": (transformers.ElectraConfig, {**_ENCODER, "embedding_size": 24},
                transformers.ElectraForSequenceClassification),
    "distilbert": (transformers.DistilBertConfig,
                   dict(dim=32, n_layers=2, n_heads=4, hidden_dim=37, max_position_embeddings=64, **_COMMON),
                   transformers.DistilBertForSequenceClassification),
    "mpnet": (transformers.MPNetConfig, _ENCODER, transformers.MPNetForSequenceClassification),
    "marian": (transformers.MarianConfig, _SEQ2SEQ, transformers.MarianMTModel),
    "bart": (transformers.BartConfig, _SEQ2SEQ, transformers.BartForConditionalGeneration),
}
# Decoder-only language models: grouped-query attention (8 query heads on 2 key/value heads, head_dim 6, not
# hidden / heads, so code that assumes one breaks) and multi-head attention (OPT, GPT-2's fused Conv1D).
_GQA = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2, head_dim=6,
            intermediate_size=37, max_position_embeddings=64, eos_token_id=EOS, bos_token_id=PAD, **_COMMON)
CONFIGS.update({
    "llama": (transformers.LlamaConfig, _GQA, transformers.LlamaForCausalLM),
    "qwen2": (transformers.Qwen2Config, _GQA, transformers.Qwen2ForCausalLM),
    "qwen3": (transformers.Qwen3Config, _GQA, transformers.Qwen3ForCausalLM),
    "mistral": (transformers.MistralConfig, {**_GQA, "num_key_value_heads": 4}, transformers.MistralForCausalLM),
    # Gemma 3: two sliding-window layers (window 4, shorter than the test sequences) then a full-attention one, as its
    # checkpoints end each run of sliding layers (so the decoder tests' emptied layer 1 is a sliding one), q/k norms,
    # norms on the sublayer outputs too, and an attention scale from query_pre_attn_scalar rather than head_dim.
    "gemma3_text": (transformers.Gemma3TextConfig,
                    {**_GQA, "sliding_window": 4, "query_pre_attn_scalar": 8,
                     "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]},
                    transformers.Gemma3ForCausalLM),
    "opt": (transformers.OPTConfig, dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, ffn_dim=37,
                                         word_embed_proj_dim=32, max_position_embeddings=64, eos_token_id=EOS,
                                         bos_token_id=PAD, **_COMMON), transformers.OPTForCausalLM),
    "gpt2": (transformers.GPT2Config, dict(n_embd=32, n_layer=3, n_head=4, n_inner=37, n_positions=64,
                                           eos_token_id=EOS, bos_token_id=PAD, **_COMMON),
             transformers.GPT2LMHeadModel),
})
SEQ2SEQ = {"marian", "bart"}
# The decoder-only families have their own tests (tests/test_decoder_only.py): other head counts and batches.
LM_FAMILIES = ["gemma3_text", "gpt2", "llama", "mistral", "opt", "qwen2", "qwen3"]
GQA = {"llama", "qwen2", "qwen3", "mistral", "gemma3_text"}
FAMILIES = sorted(set(CONFIGS) - set(LM_FAMILIES))  # the encoder and encoder-decoder families
# MPNet has no sdpa implementation in transformers; every other family is checked under both.
FAMILY_IMPLS = [(f, impl) for f in FAMILIES for impl in ("sdpa", "eager") if not (f == "mpnet" and impl == "sdpa")]


def impl_for(family: str) -> str:
    return "eager" if family == "mpnet" else "sdpa"


def tiny_model(family: str, attn_implementation: str = "sdpa", seed: int = 0, num_labels: int = 3):
    config_class, kwargs, model_class = CONFIGS[family]
    config = config_class(**kwargs, num_labels=num_labels)
    torch.manual_seed(seed)
    model = model_class._from_config(config, attn_implementation=attn_implementation)
    return model.eval()


def tiny_batch(family: str, batch_size: int = 3, length: int = 7, seed: int = 0, padded: bool = True) -> dict:
    """Inputs with labels; the last example is padded when `padded`, to exercise the masks."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, VOCAB, (batch_size, length), generator=g)
    attention_mask = torch.ones_like(input_ids)
    if padded and batch_size > 1:
        input_ids[-1, -2:] = PAD
        attention_mask[-1, -2:] = 0
    batch = {"input_ids": input_ids, "attention_mask": attention_mask}
    if family in SEQ2SEQ:
        labels = torch.randint(3, VOCAB, (batch_size, length - 2), generator=g)
        labels[:, -1] = EOS
        if padded and batch_size > 1:
            labels[-1, -1:] = -100
        batch["labels"] = labels
    elif family in LM_FAMILIES:
        batch["labels"] = input_ids.masked_fill(attention_mask == 0, -100)
    else:
        batch["labels"] = torch.randint(0, 3, (batch_size,), generator=g)
    return batch


def logits(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).logits


def non_uniform_plan(model) -> dict[int, list[int]]:
    """A head plan with different counts per site, one site emptied, and in encoder-decoders every kind touched."""
    n = len(attention_sites(model))
    plan = {0: [1, 2], 1: [0, 1, 2, 3]}
    if n > 2:
        plan.update({2: [0, 1, 2, 3], 3: [3], n - 1: [0, 2]})
    return plan


def randomize_biases(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """Give every bias random values: these families initialise them to zero, which would let an emptied
    FFN block (whose output is its second linear's bias) pass for a block that outputs nothing."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.copy_(0.1 * torch.randn(param.shape, generator=g))
    return model


def assert_per_example_gradients_are_each_examples_own(model: torch.nn.Module, batch: dict) -> None:
    """Per-example gates give, in one backward over the batch, the gradient each example gives alone."""
    size = len(batch["input_ids"])
    with head_gates(model) as gates:
        leaves = gates.per_example(size)
        per_example_loss(model, batch).sum().backward()
        batched = torch.stack([leaf.grad for leaf in leaves], dim=1)  # [batch, sites, heads]
        for i in range(size):
            single = {k: v[i : i + 1] for k, v in batch.items()}
            ones = gates.per_example(1)
            per_example_loss(model, single).sum().backward()
            assert torch.allclose(batched[i], torch.stack([g.grad[0] for g in ones]), atol=1e-10)
