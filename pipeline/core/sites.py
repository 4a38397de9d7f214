"""Prunable sites, in model order: the multi-head attention modules (heads) and the feed-forward
blocks (FFN neurons).

transformers 5 dropped `head_mask` and `prune_heads`, so every other part of the project (gates,
importance, physical pruning, save/load) goes through this one table of per-family facts: which
submodule holds the query/key/value projections, which linear is the output projection whose input
is the concatenation of the heads, which attributes the module reads for its head count, and which
two linears make each feed-forward block. Adding a family is one entry in `FAMILIES`.
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
    num_heads_attr: str
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
        return getattr(self.module, self.layout.num_heads_attr)

    @property
    def head_dim(self) -> int:
        return getattr(self.module, self.layout.head_dim_attr)

    @property
    def projections(self) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
        lay = self.layout
        return getattr(self.module, lay.query), getattr(self.module, lay.key), getattr(self.module, lay.value)

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


@dataclass(frozen=True)
class FeedForwardSite:
    """One feed-forward block: `fc_in` (hidden -> intermediate), an elementwise activation, `fc_out`
    (intermediate -> hidden). Neuron i owns row i (and bias i) of `fc_in` and column i of `fc_out`.
    `layer` is 0-based within its stack (encoder or decoder)."""

    kind: str
    layer: int
    fc_in: nn.Linear
    fc_out: nn.Linear
    # Dimension of the batch in `fc_out`'s input: 0, or 1 for time-major fairseq; per-example gates broadcast along it.
    batch_dim: int

    @property
    def num_neurons(self) -> int:
        return self.fc_in.out_features

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
FeedForwardEntry = tuple[str, int, "nn.Linear", "nn.Linear"]  # kind, layer, fc_in, fc_out

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
class Family:
    layout: AttentionLayout
    walk: Callable[[nn.Module], Iterator[SiteEntry]]  # the base model's sites, in model order
    stacks: Callable[[nn.Module], dict[str, nn.ModuleList]]  # kind -> the layer blocks holding its sites
    ffn_walk: Callable[[nn.Module], Iterator[FeedForwardEntry]]  # the base model's FFN blocks, in model order


def _encoder_stack(path: str) -> Callable[[nn.Module], dict[str, nn.ModuleList]]:
    def stacks(base: nn.Module) -> dict[str, nn.ModuleList]:
        return {ENCODER: base.get_submodule(path)}

    return stacks


def _encoder_decoder_stacks(base: nn.Module) -> dict[str, nn.ModuleList]:
    return {ENCODER: base.encoder.layers, DECODER: base.decoder.layers, CROSS: base.decoder.layers}


# config.model_type -> family
FAMILIES: dict[str, Family] = {
    "bert": Family(_BERT_LAYOUT, _bert_like, _encoder_stack("encoder.layer"), _bert_like_ffn),
    "roberta": Family(_BERT_LAYOUT, _bert_like, _encoder_stack("encoder.layer"), _bert_like_ffn),
    "electra": Family(_BERT_LAYOUT, _bert_like, _encoder_stack("encoder.layer"), _bert_like_ffn),
    "distilbert": Family(_DISTILBERT_LAYOUT, _distilbert, _encoder_stack("transformer.layer"), _distilbert_ffn),
    "mpnet": Family(_MPNET_LAYOUT, _mpnet, _encoder_stack("encoder.layer"), _bert_like_ffn),
    "marian": Family(_SEQ2SEQ_LAYOUT, _encoder_decoder, _encoder_decoder_stacks, _encoder_decoder_ffn),
    "bart": Family(_SEQ2SEQ_LAYOUT, _encoder_decoder, _encoder_decoder_stacks, _encoder_decoder_ffn),
    # fairseq's TransformerModel, wrapped by pipeline.backends.fairseq.FairseqSeq2Seq (which sets this model_type):
    # its layers name their attention modules and FFN linears as Marian's and BART's do.
    "fairseq_transformer": Family(_FAIRSEQ_LAYOUT, _encoder_decoder, _encoder_decoder_stacks, _fairseq_ffn),
}


class UnsupportedModelError(TypeError):
    pass


def _family(model: nn.Module) -> Family:
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
    family = _family(model)
    base = getattr(model, "base_model", model)
    return [
        AttentionSite(kind, layer, module, out_proj, family.layout)
        for kind, layer, module, out_proj in family.walk(base)
    ]


def ffn_sites(model: nn.Module) -> list[FeedForwardSite]:
    """Every feed-forward block of `model`, in model order: the encoder's layers, then the decoder's.

    Works on the bare model and on any task head around it, as `attention_sites` does.
    """
    family = _family(model)
    base = getattr(model, "base_model", model)
    return [
        FeedForwardSite(kind, layer, fc_in, fc_out, family.layout.batch_dim)
        for kind, layer, fc_in, fc_out in family.ffn_walk(base)
    ]


def layer_stack(model: nn.Module, kind: str) -> nn.ModuleList:
    """The layer blocks of the stack holding `kind` sites (the decoder's for "decoder" and "cross")."""
    return _family(model).stacks(getattr(model, "base_model", model))[kind]

