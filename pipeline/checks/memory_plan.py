"""How much memory each stage of a language-modelling experiment needs at its peak, and how many FLOPs (so hours)
scoring and pruning take, from the model's config.json and the params alone: nothing is loaded, torch is not imported
(but to resolve `runtime.precision: auto` on the CPU).

The estimates count the tensors the stages really hold at their peak, as this project runs them (weights fp32, the
matrix products under `torch.autocast` when runtime.precision is bf16/fp16, pipeline/core/runtime.py):
- weights: 4 bytes a parameter (fp32 always, whatever the autocast precision);
- autocast's half-precision copies of the linear weights: a backward pass needs each product's weight to compute its
  input's gradient, so every cast weight is saved until the backward ends (2 bytes a linear parameter);
- activations saved for the backward, per token and per decoder layer (`layer_activation_bytes`, counted from the
  tensors autograd saves in a Llama layer: tests/test_memory_plan.py checks the count against a measured peak);
- the logits chain: half-precision logits, their fp32 upcast for the loss, the log-softmax, and in the backward their
  gradients; with a 50k to 128k vocabulary this is the largest activation of all;
- full fine-tuning: fp32 gradients and AdamW's two fp32 moments (12 more bytes a parameter); LoRA: the adapters'
  inputs (and dropout masks) per adapted linear;
- the benchmark: every saved model at once (the unpruned one and each pruned one), every batch size's KV cache of
  prompt_tokens + new_tokens for every model, and one more at the largest batch (the timed whole generation).

Each estimate is a list of `Block`s (the embedding, each decoder layer, the head), so a placement can put them on
devices one by one, as accelerate's device_map does (pipeline/checks/placement_plan.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipeline.files.schema import AUTO_PRECISION

if TYPE_CHECKING:
    from pipeline.tasks.language_modeling.params import LanguageModelingParams

GiB = 2**30
FP32 = 4


@dataclass(frozen=True)
class DecoderShape:
    """What the memory of a Llama-style decoder depends on, as its config.json names it."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool

    @classmethod
    def from_config(cls, config: dict) -> DecoderShape:
        """From a Hugging Face config.json's keys (head_dim defaults to hidden / heads, kv heads to heads, as in
        transformers). Raises KeyError naming a missing key."""
        heads = int(config["num_attention_heads"])
        return cls(hidden=int(config["hidden_size"]), layers=int(config["num_hidden_layers"]), heads=heads,
                   kv_heads=int(config.get("num_key_value_heads") or heads),
                   head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
                   intermediate=int(config["intermediate_size"]), vocab=int(config["vocab_size"]),
                   tied=bool(config.get("tie_word_embeddings", False)))

    @property
    def query_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    def layer_linear_params(self, query_kept: float = 1.0, kv_kept: float = 1.0) -> int:
        """The weights of one layer's seven linears (q, k, v, o; gate, up, down), with a share of the query and of
        the key/value heads kept (a pruned model)."""
        d = self.hidden
        q = round(self.query_width * query_kept)
        kv = round(self.kv_width * kv_kept)
        return 2 * d * q + 2 * d * kv + 3 * d * self.intermediate

    def layer_params(self, query_kept: float = 1.0, kv_kept: float = 1.0) -> int:
        return self.layer_linear_params(query_kept, kv_kept) + 2 * self.hidden  # + the two RMSNorm weights

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """The final norm and, unless tied to the embedding, the output projection."""
        return self.hidden + (0 if self.tied else self.vocab * self.hidden)

    def params(self, query_kept: float = 1.0, kv_kept: float = 1.0) -> int:
        return self.embedding_params + self.layers * self.layer_params(query_kept, kv_kept) + self.head_params

    def matmul_params(self) -> int:
        """The weights every token multiplies by: the layers' linears and the output projection (the embedding is
        a lookup)."""
        return self.layers * self.layer_linear_params() + self.vocab * self.hidden


@dataclass(frozen=True)
class Block:
    """One piece of a stage's peak that a placement moves as a whole: its weights (what must live somewhere,
    device or offloaded) and what it needs on the device while it runs."""

    name: str
    weight_bytes: int
    work_bytes: int  # activations, gradients, optimiser states, caches: on the device that runs the block

    @property
    def total(self) -> int:
        return self.weight_bytes + self.work_bytes


@dataclass(frozen=True)
class StageEstimate:
    stage: str
    blocks: tuple[Block, ...]
    # Layerwise placement: what stays on the device besides one block (the hidden states carried between layers,
    # kept for the backward).
    carried_bytes: int
    note: str
    flops: float = 0.0  # of the whole stage; 0 where no time is estimated
    parts: dict[str, int] = field(default_factory=dict)  # the peak by kind, for the table

    @property
    def total(self) -> int:
        return sum(b.total for b in self.blocks)


def planned_precision(setting: str, gpu: bool) -> str:
    """`runtime.precision` as the plan counts it: `auto` is bf16 on the GPUs it plans for (every GPU it prices
    supports bf16) and, on the CPU, what this CPU would choose (pipeline/core/runtime.py, `auto_precision`)."""
    if setting != AUTO_PRECISION:
        return setting
    if gpu:
        return "bf16"
    import torch  # only here: the plan of any other setting stays free of torch's import time

    from pipeline.core.runtime import auto_precision
    return auto_precision(torch.device("cpu"))[0]


def half(precision: str) -> bool:
    return precision in ("bf16", "fp16")


def activation_bytes(precision: str) -> int:
    """Bytes an element of autocast's products: 2 under bf16/fp16, 4 in fp32."""
    return 2 if half(precision) else FP32


def layer_activation_bytes(shape: DecoderShape, precision: str, gates: bool) -> int:
    """Bytes one decoder layer saves for the backward, per token. Counted from autograd's saved tensors of a Llama
    layer under autocast: the inputs of the two RMSNorms (fp32: the norm computes in fp32), three intermediate-wide
    tensors of the MLP (gate and up projections' outputs, the SiLU's), the query and the attention output, key and
    value, at the products' precision; with head gates (scoring) also the gated attention output in fp32 (the gates
    are fp32 leaves, pipeline/core/gates.py)."""
    a = activation_bytes(precision)
    count = 2 * FP32 * shape.hidden + 3 * a * shape.intermediate + 2 * a * shape.query_width + 2 * a * shape.kv_width
    return count + (FP32 * shape.query_width if gates else 0)


def lora_activation_bytes(shape: DecoderShape, precision: str, dropout: float) -> int:
    """Bytes LoRA adds per token and layer: each adapted linear's input cast for its A matrix, and with dropout the
    dropout's fp32 output (peft drops out before the cast; counted from autograd's saved tensors). The adapted
    linears' inputs: q, k, v, gate, up read the hidden state, o the attention output, down the MLP's intermediate."""
    widths = 5 * shape.hidden + shape.query_width + shape.intermediate
    return widths * (activation_bytes(precision) + (FP32 if dropout > 0 else 0))


def logits_bytes(shape: DecoderShape, precision: str, backward: bool) -> int:
    """Per token: the logits (at the products' precision), their fp32 upcast for the loss (none in fp32: the same
    tensor), the log-softmax the cross-entropy saves; a backward doubles it with their gradients."""
    forward = shape.vocab * (activation_bytes(precision) + (FP32 if half(precision) else 0) + FP32)
    return 2 * forward if backward else forward


def kv_cache_bytes_per_token(shape: DecoderShape, precision: str, kv_kept: float = 1.0) -> int:
    """Keys are fp32 even under autocast (rotary embedding multiplies them by fp32 cos/sin tables), values at the
    products' precision: SmolLM2's measured 34,560 bytes a token is 30 x 192 x (4 + 2)."""
    return shape.layers * round(shape.kv_width * kv_kept) * (FP32 + activation_bytes(precision))


def _model_blocks(shape: DecoderShape, precision: str, per_token_layer: int, per_token_head: int, tokens: int,
                  *, weight_copies: bool, per_param_work: int = 0, prefix: str = "") -> list[Block]:
    """Embedding, layers and head of one model: weights fp32; work = autocast's saved weight copies (when a backward
    follows), `per_param_work` bytes a parameter (gradients and optimiser states), and the activations of `tokens`."""
    copy = 2 if weight_copies and half(precision) else 0  # see `_model_blocks`' callers: when autocast keeps them
    layer_linear, layer_all = shape.layer_linear_params(), shape.layer_params()
    out_linear = shape.vocab * shape.hidden  # the output projection multiplies whether tied or not
    blocks = [Block(f"{prefix}embedding", FP32 * shape.embedding_params, per_param_work * shape.embedding_params)]
    blocks += [Block(f"{prefix}layer {i}", FP32 * layer_all,
                     copy * layer_linear + per_param_work * layer_all + tokens * per_token_layer)
               for i in range(shape.layers)]
    blocks.append(Block(f"{prefix}head", FP32 * shape.head_params,
                        copy * out_linear + per_param_work * shape.head_params + tokens * per_token_head))
    return blocks


def _parts(blocks: list[Block], shape: DecoderShape, **named: int) -> dict[str, int]:
    return {"weights": sum(b.weight_bytes for b in blocks), **named}


def score_estimate(shape: DecoderShape, p: LanguageModelingParams) -> StageEstimate:
    """The score stage: one backward of score.batch_size windows of data.max_length tokens to the head gates, every
    parameter frozen (no weight gradients)."""
    precision, tokens = p.runtime.precision, p.score.batch_size * p.data.max_length
    layer, head = layer_activation_bytes(shape, precision, gates=True), logits_bytes(shape, precision, backward=True)
    blocks = _model_blocks(shape, precision, layer, head, tokens, weight_copies=True)
    # Forward and backward of the gates only: the backward computes input gradients, not weight gradients, so it
    # costs about one forward more (x2, not training's x3).
    flops = 2 * forward_flops(shape, p.score.max_examples * p.data.max_length, p.data.max_length)
    copies = 2 * shape.matmul_params() if half(precision) else 0
    return StageEstimate("score", tuple(blocks), carried_bytes=(shape.layers + 1) * tokens * FP32 * shape.hidden,
                         note=f"backward of {p.score.batch_size} x {p.data.max_length} tokens to the gates",
                         flops=flops,
                         parts=_parts(blocks, shape, weight_copies=copies,
                                      activations=tokens * (shape.layers * layer + head)))


def eval_blocks(shape: DecoderShape, p: LanguageModelingParams, prefix: str = "") -> list[Block]:
    """A perplexity evaluation (inference mode): the weights, and the logits chain of eval.batch_size windows; a
    layer's own activations are freed as the next one runs."""
    tokens = p.eval.batch_size * p.data.max_length
    layer = layer_activation_bytes(shape, p.runtime.precision, gates=False) // shape.layers  # one layer's, transient
    # Autocast caches its half-precision cast of every weight that requires grad (a loaded model's do) for as long
    # as its context lasts, here a whole evaluation: the copies are there without a backward too.
    return _model_blocks(shape, p.runtime.precision, layer, logits_bytes(shape, p.runtime.precision, False), tokens,
                         weight_copies=True, prefix=prefix)


def prune_evaluations(shape: DecoderShape, p: LanguageModelingParams) -> tuple[int, int]:
    """(perplexity evaluations, importance passes over the scoring data) the prune stage runs: every curve (the
    importance order, each random seed, re-estimated, each criterion) at every level on dev and test, in one unit or
    (compare_units, grouped-query attention) both, plus the unpruned model once per split; the paper-importance
    criterion and each re-estimation score the model again."""
    pp = p.prune
    levels = int(pp.max_fraction / pp.step + 1e-9)
    curves = 1 + len(pp.random_seeds) + len(pp.criteria) + (1 if pp.reestimate else 0)
    units = 2 if pp.compare_units and shape.kv_heads < shape.heads else 1
    passes = (1 if "paper-importance" in pp.criteria else 0) + (levels if pp.reestimate else 0)
    return curves * levels * 2 * units + 2, passes


def prune_estimate(shape: DecoderShape, p: LanguageModelingParams) -> StageEstimate:
    """The prune stage: the model, a physically pruned copy of it per level (the copy is freed before the next), its
    evaluation; the paper-importance criterion runs the scoring backward again, so the peak is the larger of the two."""
    evaluations, passes = prune_evaluations(shape, p)
    copy = eval_blocks(shape, p, prefix="pruned copy: ")
    evaluating = [*_model_blocks(shape, p.runtime.precision, 0, 0, 0, weight_copies=False), *copy]
    scoring = score_estimate(shape, p)
    eval_tokens = p.prune.max_examples * p.data.max_length
    flops = (evaluations * forward_flops(shape, eval_tokens, p.data.max_length) + passes * scoring.flops
             + (forward_flops(shape, p.score.max_examples * p.data.max_length, p.data.max_length)
                if "activation" in p.prune.criteria else 0))
    note = (f"{evaluations} evaluations of {p.prune.max_examples} windows"
            + (f", {passes} scoring pass{'es' if passes > 1 else ''}" if passes else ""))
    if sum(b.total for b in evaluating) > scoring.total:
        return StageEstimate("prune", tuple(evaluating), carried_bytes=0, note=note, flops=flops,
                             parts=_parts(evaluating, shape,
                                          copies_and_activations=sum(b.work_bytes for b in evaluating)))
    return StageEstimate("prune", scoring.blocks, scoring.carried_bytes, note=note, flops=flops, parts=scoring.parts)


def recover_estimate(shape: DecoderShape, p: LanguageModelingParams) -> StageEstimate:
    """The recover stage: training steps of recover.batch_size windows, LoRA (frozen weights, adapters trained) or
    full fine-tuning (fp32 gradients and AdamW's two moments: 12 more bytes a parameter), for each of recover's
    methods in turn; distillation (kd-) keeps the unpruned model beside the student as its teacher, whose forward
    pass adds its logits."""
    r, precision = p.recover, p.runtime.precision
    tokens = r.batch_size * p.data.max_length
    layer = layer_activation_bytes(shape, precision, gates=False)
    full = any(not m.endswith("lora") for m in r.methods)
    distils = any(m.startswith("kd-") for m in r.methods)
    if not full:
        layer += lora_activation_bytes(shape, precision, r.dropout)
    head = logits_bytes(shape, precision, backward=True) + (logits_bytes(shape, precision, backward=False)
                                                            if distils else 0)
    blocks = _model_blocks(shape, precision, layer, head, tokens, weight_copies=True, per_param_work=12 if full else 0)
    if not full:  # the adapters: A (rank x in) and B (out x rank) on each linear, trained with AdamW
        d, q, kv, i = shape.hidden, shape.query_width, shape.kv_width, shape.intermediate
        adapter = r.rank * ((d + q) * 2 + (d + kv) * 2 + (d + i) * 3)
        blocks = [Block(b.name, b.weight_bytes, b.work_bytes + (16 * adapter if b.name.startswith("layer") else 0))
                  for b in blocks]
    if distils:  # the teacher's weights; its activations pass (no backward), its logits are counted in the head's
        blocks += [Block(b.name, b.weight_bytes, 0) for b in _model_blocks(shape, precision, 0, 0, tokens,
                                                                          weight_copies=False, prefix="teacher ")]
    passes = sum(3 + m.startswith("kd-") for m in r.methods)  # forward and backward (x3), and the teacher's forward
    flops = passes * forward_flops(shape, r.steps(p.data.max_length) * tokens, p.data.max_length)
    what = "full fine-tuning, AdamW" if full else f"LoRA rank {r.rank}"
    copies = 2 * shape.matmul_params() if half(precision) else 0
    return StageEstimate("recover", tuple(blocks), carried_bytes=(shape.layers + 1) * tokens * FP32 * shape.hidden,
                         note=f"{what}{', the unpruned teacher beside' if distils else ''}, {r.batch_size} x "
                              f"{p.data.max_length} tokens a step", flops=flops,
                         parts=_parts(blocks, shape, weight_copies=copies,
                                      gradients_and_adamw=12 * shape.params() if full else 0,
                                      activations=tokens * (shape.layers * layer + head)))


def saved_model_shares(shape: DecoderShape, p: LanguageModelingParams) -> list[tuple[str, float, float]]:
    """(label, query heads kept, key/value heads kept) of every model the prune stage saves, the unpruned first:
    prune.save_fractions remove query heads (a key/value head only with its group's last, ignored here: an upper
    bound), prune.kv_group_fractions whole groups, the same number from every layer."""
    pp = p.prune
    models = [("unpruned", 1.0, 1.0)]
    for f in pp.save_fractions:
        kept = 1 - f
        models.append((f"{f:.0%} of heads", kept, kept if pp.unit == "group" else 1.0))
    for f in pp.kv_group_fractions:
        kept = 1 - round(f * shape.kv_heads) / shape.kv_heads
        models.append((f"{f:.0%} of KV groups", kept, kept))
    return models


def benchmark_estimate(shape: DecoderShape, p: LanguageModelingParams) -> StageEstimate:
    """The benchmark stage: every saved model loaded at once, a KV cache of prompt_tokens + new_tokens per model and
    batch size (each kept for the timed rounds), one more for the whole generation at the largest batch."""
    b, precision = p.benchmark, p.runtime.precision
    context = b.prompt_tokens + b.new_tokens
    blocks: list[Block] = []
    cache = weight_copies = 0
    for label, q, kv in saved_model_shares(shape, p):
        per_token = kv_cache_bytes_per_token(shape, precision, kv)
        model_cache = per_token * context * (sum(b.batch_sizes) + (max(b.batch_sizes) if label == "unpruned" else 0))
        cache += model_cache
        layer_weights = FP32 * shape.layer_params(q, kv)
        # The timed rounds run under one autocast context, which caches its cast of every weight (they require grad).
        copies = (2 if half(precision) else 0) * shape.layer_linear_params(q, kv)
        head_copy = (2 if half(precision) else 0) * shape.vocab * shape.hidden
        weight_copies += shape.layers * copies + head_copy
        blocks.append(Block(f"{label}: embedding", FP32 * shape.embedding_params, 0))
        blocks += [Block(f"{label}: layer {i}", layer_weights, copies + model_cache // shape.layers)
                   for i in range(shape.layers)]
        blocks.append(Block(f"{label}: head", FP32 * shape.head_params, head_copy))
    # The prefill of the largest batch: one layer's activations at a time (transient) and the last position's logits.
    transient = max(b.batch_sizes) * b.prompt_tokens * layer_activation_bytes(shape, precision, gates=False)
    blocks.append(Block("prefill", 0, transient // shape.layers))
    models = len(saved_model_shares(shape, p))
    return StageEstimate("benchmark", tuple(blocks), carried_bytes=0,
                         note=f"{models} models, KV caches at batches {b.batch_sizes} x {context} tokens",
                         parts=_parts(blocks, shape, weight_copies=weight_copies, kv_caches=cache))


def forward_flops(shape: DecoderShape, tokens: int, context: int) -> float:
    """FLOPs of a forward pass over `tokens` tokens in windows of `context`: 2 a weight a token for the products,
    and attention's two [context x context] products (causal: half of them on average) per layer."""
    attention = 2 * shape.layers * shape.query_width * context  # 2 products x 2 FLOPs x context / 2 (causal)
    return float(tokens) * (2 * shape.matmul_params() + attention)


def stage_estimates(shape: DecoderShape, p: LanguageModelingParams) -> list[StageEstimate]:
    """Every stage that loads the model, in pipeline order (ablate and zero-shot evaluate as prune's copy does)."""
    return [score_estimate(shape, p), prune_estimate(shape, p), recover_estimate(shape, p),
            benchmark_estimate(shape, p)]


def gib(n: float) -> str:
    """A byte count as GiB, three significant figures (0.51 GiB, 12.3 GiB, 137 GiB)."""
    value = n / GiB
    digits = max(0, 2 - int(math.floor(math.log10(value)))) if value > 0 else 2
    return f"{value:.{digits}f} GiB"
