"""Prunable sites, in model order: the multi-head attention modules (heads) and the feed-forward
blocks (FFN neurons).

transformers 5 dropped `head_mask` and `prune_heads`, so every other part of the project (gates,
importance, physical pruning, save/load) goes through this one table of per-family facts: which
submodule holds the query/key/value projections, which linear is the output projection whose input
is the concatenation of the heads, which attributes the module reads for its head count, how query
heads share key/value heads (grouped-query attention), which linears make each feed-forward block, and
how a pruned shape is written as the family's own config. Adding a family is one entry in `FAMILIES`.

Grouped-query attention (Llama, Qwen2/3, Mistral, Gemma 3): query head h reads key/value head
h // group_size, where group_size = num_heads / num_kv_heads and the heads of a group are contiguous.
Multi-head attention is the case group_size = 1: every query head has a key/value head of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.files.schema import CROSS, DECODER, ENCODER

if TYPE_CHECKING:  # torch only in annotations: the input checks read FAMILIES before torch loads (3 s)
    from torch import nn


@dataclass(frozen=True)
class AttentionLayout:
    """How one family's attention module names its parts."""

    query: str
    key: str
    value: str
    # Attribute holding the head count; None for modules that reshape with -1 and keep no count (Llama's).
    num_heads_attr: str | None
    head_dim_attr: str
    # Attribute holding num_heads * head_dim, for modules that reshape with it (None if unused).
    inner_dim_attr: str | None
    # True when the module's own forward applies the output projection (Marian, BART, DistilBERT,
    # MPNet); False when a sibling module does (BERT's `attention.output.dense`).
    projects_output: bool
    # True when the module's forward returns `(output,)` rather than `(output, weights)` (MPNet).
    returns_singleton: bool = False
    # Position of a forward argument holding a `[batch, heads, query, key]` score bias computed for
    # all original heads (MPNet's relative position bias, shared by the layers); pruning selects
    # the kept heads' slices of it.
    head_bias_arg: int | None = None
    # Dimension of the batch in the output projection's input: 0, or 1 for time-major modules (fairseq's
    # `[time, batch, channels]`); per-example gates broadcast along it.
    batch_dim: int = 0
    # Name of the forward argument holding the attention's input (the query side), for callers that pass
    # it by keyword.
    query_arg: str = "hidden_states"
    # Attribute holding the query heads per key/value head, for grouped-query attention (None: multi-head).
    group_size_attr: str | None = None
    # True when one layer computes query, key and value side by side (GPT-2's `c_attn`, `inner_dim_attr` wide
    # each); `query`, `key` and `value` then all name it.
    fused_qkv: bool = False


@dataclass(frozen=True)
class AttentionSite:
    """One multi-head attention module. `layer` is 0-based within its stack (encoder or decoder)."""

    kind: str
    layer: int
    module: nn.Module
    out_proj: nn.Linear
    layout: AttentionLayout

    @property
    def num_heads(self) -> int:
        if self.layout.num_heads_attr is not None:
            return getattr(self.module, self.layout.num_heads_attr)
        return out_features(self.projections[0]) // self.head_dim

    @property
    def head_dim(self) -> int:
        return getattr(self.module, self.layout.head_dim_attr)

    @property
    def projections(self) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
        lay = self.layout
        return getattr(self.module, lay.query), getattr(self.module, lay.key), getattr(self.module, lay.value)

    @property
    def original_group_size(self) -> int:
        """Query heads per key/value head before any pruning (1 for multi-head attention)."""
        if self.layout.group_size_attr is None:
            return 1
        return getattr(self.module, "original_group_size", getattr(self.module, self.layout.group_size_attr))

    @property
    def kept_kv_heads(self) -> list[int]:
        """Original indices of the key/value heads still present: those serving a kept query head."""
        size = self.original_group_size
        return sorted({head // size for head in self.kept_heads})

    @property
    def num_kv_heads(self) -> int:
        return len(self.kept_kv_heads)

    @property
    def head_groups(self) -> list[list[int]]:
        """Positions (among the heads present) of the query heads each present key/value head serves; one
        head per group for multi-head attention. Pruning keeps a site valid only if every group keeps the
        same number of heads (`pipeline.core.surgery.validate_heads_to_prune`)."""
        size, groups = self.original_group_size, {}
        for position, head in enumerate(self.kept_heads):
            groups.setdefault(head // size, []).append(position)
        return [groups[kv] for kv in sorted(groups)]

    @property
    def original_num_heads(self) -> int:
        return getattr(self.module, "original_num_heads", self.num_heads)

    @property
    def kept_heads(self) -> list[int]:
        """Original indices of the heads still present (pruning keeps the order)."""
        return list(getattr(self.module, "kept_heads", range(self.num_heads)))

    @property
    def name(self) -> str:
        return f"{self.kind} layer {self.layer}"


def out_features(layer: nn.Module) -> int:
    """Output width of an `nn.Linear` or of GPT-2's `Conv1D` (a linear whose weight is stored transposed)."""
    return layer.out_features if hasattr(layer, "out_features") else layer.nf


@dataclass(frozen=True)
class FeedForwardSite:
    """One feed-forward block: `fc_in` (hidden -> intermediate), an elementwise activation, `fc_out`
    (intermediate -> hidden). Neuron i owns output i (weight row and bias i) of `fc_in` and input i of `fc_out`.
    Gated blocks (Llama's SwiGLU: `down(act(gate(x)) * up(x))`) have a second input linear, `fc_gate`, whose
    output i belongs to neuron i too. `layer` is 0-based within its stack (encoder or decoder)."""

    kind: str
    layer: int
    fc_in: nn.Linear
    fc_out: nn.Linear
    # Dimension of the batch in `fc_out`'s input: 0, or 1 for time-major fairseq; per-example gates broadcast along it.
    batch_dim: int
    fc_gate: nn.Linear | None = None

    @property
    def inputs(self) -> tuple[nn.Linear, ...]:
        """The linears whose outputs are the neurons: `fc_in`, and `fc_gate` in a gated block."""
        return (self.fc_in,) if self.fc_gate is None else (self.fc_in, self.fc_gate)

    @property
    def num_neurons(self) -> int:
        return out_features(self.fc_in)

    @property
    def original_num_neurons(self) -> int:
        return getattr(self.fc_in, "original_num_neurons", self.num_neurons)

    @property
    def kept_neurons(self) -> list[int]:
        """Original indices of the neurons still present (pruning keeps the order); `prune_neurons` records
        them on `fc_in`."""
        return list(getattr(self.fc_in, "kept_neurons", range(self.num_neurons)))

    @property
    def name(self) -> str:
        return f"{self.kind} layer {self.layer} FFN"


SiteEntry = tuple[str, int, "nn.Module", "nn.Linear"]
# kind, layer, fc_in, fc_out[, fc_gate]
FeedForwardEntry = tuple[str, int, "nn.Linear", "nn.Linear"] | tuple[str, int, "nn.Linear", "nn.Linear", "nn.Linear"]

_BERT_LAYOUT = AttentionLayout("query", "key", "value", "num_attention_heads", "attention_head_size",
                               "all_head_size", projects_output=False)
_DISTILBERT_LAYOUT = AttentionLayout("q_lin", "k_lin", "v_lin", "n_heads", "attention_head_size", None,
                                     projects_output=True)
_MPNET_LAYOUT = AttentionLayout("q", "k", "v", "num_attention_heads", "attention_head_size", "all_head_size",
                                projects_output=True, returns_singleton=True, head_bias_arg=2)
_SEQ2SEQ_LAYOUT = AttentionLayout("q_proj", "k_proj", "v_proj", "num_heads", "head_dim", None,
                                  projects_output=True)
# fairseq's MultiheadAttention reshapes its output with `embed_dim` (= num_heads * head_dim) and is time-major.
_FAIRSEQ_LAYOUT = AttentionLayout("q_proj", "k_proj", "v_proj", "num_heads", "head_dim", "embed_dim",
                                  projects_output=True, batch_dim=1, query_arg="query")
# Llama, Qwen2, Qwen3, Mistral and Gemma 3 reshape with head_dim and -1, and repeat each key/value head
# num_key_value_groups times; Qwen3's and Gemma 3's per-head q_norm/k_norm (over head_dim) are shared by the heads,
# so they stay as they are.
_GQA_LAYOUT = AttentionLayout("q_proj", "k_proj", "v_proj", None, "head_dim", None, projects_output=True,
                              group_size_attr="num_key_value_groups")
_OPT_LAYOUT = AttentionLayout("q_proj", "k_proj", "v_proj", "num_heads", "head_dim", None, projects_output=True)
# GPT-2 splits c_attn's output into query, key and value with split_size (= num_heads * head_dim).
_GPT2_LAYOUT = AttentionLayout("c_attn", "c_attn", "c_attn", "num_heads", "head_dim", "split_size",
                               projects_output=True, fused_qkv=True)


def _bert_like(base: nn.Module) -> Iterator[SiteEntry]:
    for i, layer in enumerate(base.encoder.layer):
        yield ENCODER, i, layer.attention.self, layer.attention.output.dense


def _distilbert(base: nn.Module) -> Iterator[SiteEntry]:
    for i, layer in enumerate(base.transformer.layer):
        yield ENCODER, i, layer.attention, layer.attention.out_lin


def _mpnet(base: nn.Module) -> Iterator[SiteEntry]:
    for i, layer in enumerate(base.encoder.layer):
        yield ENCODER, i, layer.attention.attn, layer.attention.attn.o


def _encoder_decoder(base: nn.Module) -> Iterator[SiteEntry]:
    # Model order: the whole encoder, then per decoder layer its self- then cross-attention.
    for i, layer in enumerate(base.encoder.layers):
        yield ENCODER, i, layer.self_attn, layer.self_attn.out_proj
    for i, layer in enumerate(base.decoder.layers):
        yield DECODER, i, layer.self_attn, layer.self_attn.out_proj
        yield CROSS, i, layer.encoder_attn, layer.encoder_attn.out_proj


def _decoder_only(path: str, attention: str, out_proj: str) -> Callable[[nn.Module], Iterator[SiteEntry]]:
    def walk(base: nn.Module) -> Iterator[SiteEntry]:
        for i, layer in enumerate(base.get_submodule(path)):
            module = layer.get_submodule(attention)
            yield DECODER, i, module, module.get_submodule(out_proj)

    return walk


def _gated_mlp_ffn(base: nn.Module) -> Iterator[FeedForwardEntry]:
    # Llama-style SwiGLU: neuron i is up_proj's and gate_proj's output i and down_proj's input i.
    for i, layer in enumerate(base.layers):
        yield DECODER, i, layer.mlp.up_proj, layer.mlp.down_proj, layer.mlp.gate_proj


def _opt_ffn(base: nn.Module) -> Iterator[FeedForwardEntry]:
    for i, layer in enumerate(base.decoder.layers):
        yield DECODER, i, layer.fc1, layer.fc2


def _gpt2_ffn(base: nn.Module) -> Iterator[FeedForwardEntry]:
    for i, block in enumerate(base.h):
        yield DECODER, i, block.mlp.c_fc, block.mlp.c_proj


def _bert_like_ffn(base: nn.Module) -> Iterator[FeedForwardEntry]:
    # BERT, RoBERTa, ELECTRA and MPNet alike.
    for i, layer in enumerate(base.encoder.layer):
        yield ENCODER, i, layer.intermediate.dense, layer.output.dense


def _distilbert_ffn(base: nn.Module) -> Iterator[FeedForwardEntry]:
    for i, layer in enumerate(base.transformer.layer):
        yield ENCODER, i, layer.ffn.lin1, layer.ffn.lin2


def _encoder_decoder_ffn(base: nn.Module) -> Iterator[FeedForwardEntry]:
    for kind, layers in ((ENCODER, base.encoder.layers), (DECODER, base.decoder.layers)):
        for i, layer in enumerate(layers):
            yield kind, i, layer.fc1, layer.fc2


def _fairseq_ffn(base: nn.Module) -> Iterator[FeedForwardEntry]:
    for kind, layers in ((ENCODER, base.encoder.layers), (DECODER, base.decoder.layers)):
        for i, layer in enumerate(layers):
            # NormFormer's `--scale-fc` puts a LayerNorm over the intermediate activations between fc1 and fc2, so a
            # neuron's output depends on the others' and removing one changes the rest.
            if getattr(layer, "ffn_layernorm", None) is not None:
                raise UnsupportedModelError(f"{kind} layer {i}: feed-forward blocks with a LayerNorm inside "
                                            f"(NormFormer's scale_fc) are not supported")
            yield kind, i, layer.fc1, layer.fc2


@dataclass(frozen=True)
class PrunedShape:
    """What every layer of a uniformly pruned model has: the config values a stock load needs."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int


@dataclass(frozen=True)
class Family:
    layout: AttentionLayout
    walk: Callable[[nn.Module], Iterator[SiteEntry]]  # the base model's sites, in model order
    stacks: Callable[[nn.Module], dict[str, nn.ModuleList]]  # kind -> the layer blocks holding its sites
    ffn_walk: Callable[[nn.Module], Iterator[FeedForwardEntry]]  # the base model's FFN blocks, in model order
    # The config keys that describe a uniformly pruned shape in the family's own config class, so that stock
    # `from_pretrained` builds it (`pipeline.core.checkpoint.stock_config` checks that the class does).
    stock_keys: Callable[[PrunedShape], dict] | None = None
    # Pre-norm families: per layer, the norms in front of its attention and its FFN, whose input is the residual
    # stream that the sublayer's output is added to. None: post-norm (the residual is the sublayer's own input).
    pre_norms: Callable[[nn.Module], Iterator[tuple[nn.Module, nn.Module]]] | None = None
    # True when each sublayer's output also passes through a norm of its own before it is added to the residual
    # (Gemma 3's post_attention_layernorm and post_feedforward_layernorm): the residual stream then changes by a
    # nonlinear function of the output projection's output, which `pipeline.methods.budgeted_tuning.tune` must know.
    normed_outputs: bool = False


def _gqa_keys(shape: PrunedShape) -> dict:
    return {"num_attention_heads": shape.num_heads, "num_key_value_heads": shape.num_kv_heads,
            "head_dim": shape.head_dim, "intermediate_size": shape.intermediate_size}


def _bert_keys(shape: PrunedShape) -> dict:
    # BERT-likes derive head_dim from hidden_size / num_attention_heads: only FFN-pruned shapes load stock.
    return {"num_attention_heads": shape.num_heads, "intermediate_size": shape.intermediate_size}


def _gpt2_keys(shape: PrunedShape) -> dict:
    return {"n_head": shape.num_heads, "n_inner": shape.intermediate_size}


def _opt_keys(shape: PrunedShape) -> dict:
    return {"num_attention_heads": shape.num_heads, "ffn_dim": shape.intermediate_size}


def _decoder_stack(path: str) -> Callable[[nn.Module], dict[str, nn.ModuleList]]:
    def stacks(base: nn.Module) -> dict[str, nn.ModuleList]:
        return {DECODER: base.get_submodule(path)}

    return stacks


def _norms(path: str, attention_norm: str, ffn_norm: str) -> Callable[[nn.Module], Iterator[tuple[nn.Module,
                                                                                                nn.Module]]]:
    def norms(base: nn.Module) -> Iterator[tuple[nn.Module, nn.Module]]:
        for layer in base.get_submodule(path):
            yield layer.get_submodule(attention_norm), layer.get_submodule(ffn_norm)

    return norms


def _gqa_family() -> Family:
    return Family(_GQA_LAYOUT, _decoder_only("layers", "self_attn", "o_proj"), _decoder_stack("layers"),
                  _gated_mlp_ffn, _gqa_keys, _norms("layers", "input_layernorm", "post_attention_layernorm"))


def _gemma3_family() -> Family:
    # Llama's layout and names, with four norms per layer: `input_layernorm` and `pre_feedforward_layernorm` in front
    # of the sublayers, their input the residual stream (so they are the pre-norms), and `post_attention_layernorm`
    # and `post_feedforward_layernorm` on the sublayers' outputs before the residual adds them (`normed_outputs`);
    # Llama's `post_attention_layernorm` is the FFN's pre-norm, Gemma's is not.
    return Family(_GQA_LAYOUT, _decoder_only("layers", "self_attn", "o_proj"), _decoder_stack("layers"),
                  _gated_mlp_ffn, _gqa_keys, _norms("layers", "input_layernorm", "pre_feedforward_layernorm"),
                  normed_outputs=True)


def _encoder_stack(path: str) -> Callable[[nn.Module], dict[str, nn.ModuleList]]:
    def stacks(base: nn.Module) -> dict[str, nn.ModuleList]:
        return {ENCODER: base.get_submodule(path)}

    return stacks


def _encoder_decoder_stacks(base: nn.Module) -> dict[str, nn.ModuleList]:
    return {ENCODER: base.encoder.layers, DECODER: base.decoder.layers, CROSS: base.decoder.layers}


# config.model_type -> family
FAMILIES: dict[str, Family] = {
    "bert": Family(_BERT_LAYOUT, _bert_like, _encoder_stack("encoder.layer"), _bert_like_ffn, _bert_keys),
    "roberta": Family(_BERT_LAYOUT, _bert_like, _encoder_stack("encoder.layer"), _bert_like_ffn, _bert_keys),
    "electra": Family(_BERT_LAYOUT, _bert_like, _encoder_stack("encoder.layer"), _bert_like_ffn, _bert_keys),
    "distilbert": Family(_DISTILBERT_LAYOUT, _distilbert, _encoder_stack("transformer.layer"), _distilbert_ffn),
    "mpnet": Family(_MPNET_LAYOUT, _mpnet, _encoder_stack("encoder.layer"), _bert_like_ffn),
    "marian": Family(_SEQ2SEQ_LAYOUT, _encoder_decoder, _encoder_decoder_stacks, _encoder_decoder_ffn),
    "bart": Family(_SEQ2SEQ_LAYOUT, _encoder_decoder, _encoder_decoder_stacks, _encoder_decoder_ffn),
    # fairseq's TransformerModel, wrapped by pipeline.tasks.translation.fairseq.FairseqSeq2Seq (which sets this
    # model_type): its layers name their attention modules and FFN linears as Marian's and BART's do.
    "fairseq_transformer": Family(_FAIRSEQ_LAYOUT, _encoder_decoder, _encoder_decoder_stacks, _fairseq_ffn),
    # Decoder-only language models: one stack of decoder self-attention, grouped-query or multi-head.
    "llama": _gqa_family(),
    "qwen2": _gqa_family(),
    "qwen3": _gqa_family(),
    "mistral": _gqa_family(),
    # Gemma 3's text model (Gemma3ForCausalLM: the 270M and 1B checkpoints; the larger ones are "gemma3", multimodal,
    # with the text model inside and its config nested, which no entry here describes). Nothing in its attention
    # depends on the head count: it scales scores by query_pre_attn_scalar ** -0.5, a number of its config, and its
    # sliding-window layers differ from the full ones only in their mask. Its embeddings are scaled by
    # sqrt(hidden_size), which pruning heads and neurons leaves alone.
    "gemma3_text": _gemma3_family(),
    # OPT-350m normalises after its sublayers (do_layer_norm_before: false); `pre_norms` says which it is.
    "opt": Family(_OPT_LAYOUT, _decoder_only("decoder.layers", "self_attn", "out_proj"),
                  _decoder_stack("decoder.layers"), _opt_ffn, _opt_keys,
                  _norms("decoder.layers", "self_attn_layer_norm", "final_layer_norm")),
    "gpt2": Family(_GPT2_LAYOUT, _decoder_only("h", "attn", "c_proj"), _decoder_stack("h"), _gpt2_ffn, _gpt2_keys,
                   _norms("h", "ln_1", "ln_2")),
}


# A GGUF file's general.architecture is llama.cpp's name for the family, not transformers' model_type; these are the
# families above that transformers reads from GGUF (modeling_gguf_pytorch_utils.py), by the name llama.cpp writes.
# llama.cpp writes Mistral's files as "llama" (transformers makes them "mistral" when general.name says so), and
# Gemma 3's text model as "gemma3", which transformers loads as "gemma3_text". OPT and the encoders have no GGUF form.
GGUF_ARCHITECTURES: dict[str, str] = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3": "gemma3_text",
    "gpt2": "gpt2",
}

class UnsupportedModelError(TypeError):
    pass


def family_of(model: nn.Module) -> Family:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in FAMILIES:
        raise UnsupportedModelError(
            f"{type(model).__name__} (model_type={model_type!r}) is not supported; "
            f"supported families: {', '.join(sorted(FAMILIES))}"
        )
    return FAMILIES[model_type]


def attention_sites(model: nn.Module) -> list[AttentionSite]:
    """Every multi-head attention module of `model`, in model order.

    Works on the bare model and on any task head around it (`...ForSequenceClassification`,
    `MarianMTModel`, ...), since Hugging Face models expose the bare one as `base_model`.
    """
    family = family_of(model)
    base = getattr(model, "base_model", model)
    return [
        AttentionSite(kind, layer, module, out_proj, family.layout)
        for kind, layer, module, out_proj in family.walk(base)
    ]


def ffn_sites(model: nn.Module) -> list[FeedForwardSite]:
    """Every feed-forward block of `model`, in model order: the encoder's layers, then the decoder's.

    Works on the bare model and on any task head around it, as `attention_sites` does.
    """
    family = family_of(model)
    base = getattr(model, "base_model", model)
    return [
        FeedForwardSite(kind, layer, fc_in, fc_out, family.layout.batch_dim, *fc_gate)
        for kind, layer, fc_in, fc_out, *fc_gate in family.ffn_walk(base)
    ]


def is_decoder_only(model: nn.Module) -> bool:
    """A language model whose every attention is the decoder's self-attention (Llama, GPT-2, ...)."""
    return {site.kind for site in attention_sites(model)} == {DECODER}


def pre_norms(model: nn.Module) -> list[tuple[nn.Module, nn.Module]] | None:
    """Per layer, the norms in front of the attention and the FFN of a pre-norm model (their input is the
    residual stream); None for a post-norm model, whose sublayers' inputs are the residual."""
    family = family_of(model)
    if family.pre_norms is None or not getattr(model.config, "do_layer_norm_before", True):
        return None
    return list(family.pre_norms(getattr(model, "base_model", model)))


def layer_stack(model: nn.Module, kind: str) -> nn.ModuleList:
    """The layer blocks of the stack holding `kind` sites (the decoder's for "decoder" and "cross")."""
    return family_of(model).stacks(getattr(model, "base_model", model))[kind]

