"""The experiment's parameters (`params.yaml`), validated before any stage does any work: what every task family
shares, and the reading of a params file.

Sections follow the stages (DVC convention: each stage declares the sections it reads). Each family's root class and
its own sections live in its package (`pipeline/tasks/<family>/params.py`, which defines `PARAMS`), found through
the registry (pipeline/config/tasks.py) by the file's `task`. Unknown keys, wrong types and out-of-range values fail
with one line naming the key and what is allowed.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from pipeline.config.tasks import TASK_PACKAGES
from pipeline.files.schema import (
    BUDGETED_METHODS,
    BUDGETED_TUNED,
    CLASSIFICATION,
    DEVICE_PATTERN,
    DEVICES,
    EVAL_SPLITS,
    HEAD_CRITERIA,
    HEAD_UNITS,
    MEMORY_KEY_PATTERN,
    MEMORY_SIZE_PATTERN,
    PLACEMENTS,
    PRECISION_SETTINGS,
    SCORE_ESTIMATORS,
    SPLITS,
)


def _sum_to_one(v: tuple[float, float, float]) -> tuple[float, float, float]:
    if any(f <= 0 for f in v) or abs(sum(v) - 1.0) > 1e-6:
        raise ValueError("must be three positive fractions (train, dev, test) summing to 1")
    return v


Fractions = Annotated[tuple[float, float, float], AfterValidator(_sum_to_one)]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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


Precision = Literal[PRECISION_SETTINGS]  # "auto" resolves by hardware (pipeline/core/runtime.py)
Placement = Literal[PLACEMENTS]


class GenerationBenchmarkParams(Section):
    """Timing `generate()`: every model decodes exactly `new_tokens` tokens (equal work), `repeats` times a cell."""

    batch_sizes: list[int] = Field(default_factory=lambda: [1, 16, 64], min_length=1)
    new_tokens: int = Field(16, ge=1)
    repeats: int = Field(7, ge=1)
    turn_seconds: float = Field(0.2, ge=0)  # as BenchmarkParams'
    precisions: list[Precision] = Field(default_factory=lambda: ["fp32"], min_length=1)


EXPERIMENT_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


def _a_device(v: str) -> str:
    if not re.fullmatch(DEVICE_PATTERN, v):
        raise ValueError(f"must be {DEVICES}")
    return v


def _a_memory_key(v: str) -> str:
    if not re.fullmatch(MEMORY_KEY_PATTERN, v):
        raise ValueError("must be a GPU index (0, 1, ...), cpu or disk")
    return v


def _a_size(v: str) -> str:
    if not re.fullmatch(MEMORY_SIZE_PATTERN, v.strip()):
        raise ValueError("must be a size such as 70GiB, 512MiB or 2TB")
    return v


class RuntimeParams(Section):
    """Where every stage runs its models (pipeline/core/runtime.py). `precision` changes results, so the stages
    declare it as a DVC param; `device` is an execution setting (EXECUTION_SETTINGS): the same params give the
    same results on any device up to floating-point rounding, and moving a run to a GPU must not invalidate it."""

    device: Annotated[str, AfterValidator(_a_device)] = "auto"  # auto, cpu, cuda, cuda:N
    precision: Precision = "fp32"
    # whole | sharded | layerwise (PLACEMENTS): how a model larger than one device runs; `python -m
    # pipeline.checks` prints the memory plan that says which fits.
    placement: Placement = "whole"
    # accelerate's per-device caps for "sharded" (and the plan): {"0": "70GiB", "cpu": "200GiB", "disk": ...};
    # empty: what each device has.
    max_memory: dict[Annotated[str, AfterValidator(_a_memory_key)], Annotated[str, AfterValidator(_a_size)]] = {}


# Params that say how to run, not what to compute: read by the stages, never declared as DVC params (the params
# tracer does not record them), so changing them reruns nothing. A placement gives the same results as "whole" up
# to floating-point rounding (layerwise scoring replays the whole model's gradient layer by layer).
EXECUTION_SETTINGS = frozenset({"runtime.device", "runtime.placement", "runtime.max_memory"})


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


# How pydantic names the member of a union an error is from, as one element of its location ("constrained-int",
# "dict[literal['a','b'],constrained-int]"): not a key of the params, so it is left out of the line.
UNION_MEMBER = re.compile(r"constrained-[a-z]+|int|float|str|bool|none|[a-z-]+\[.*\]")


def _without_union_members(errors: list[dict]) -> list[dict]:
    """`errors` with each union's members reduced to those the input had the shape of: `items: {task: 0}` is
    wrong as a mapping (a count too small), not as an integer, so only the mapping's error stays, under the key
    and the value that are wrong. A union member's name is dropped from every location."""
    def member_at(loc: tuple) -> int | None:
        return next((i for i, part in enumerate(loc) if i > 0 and isinstance(part, str)
                     and UNION_MEMBER.fullmatch(part)), None)

    deeper = {e["loc"][:i] for e in errors if (i := member_at(e["loc"])) is not None and len(e["loc"]) > i + 1}
    kept = []
    for e in errors:
        i = member_at(e["loc"])
        if i is None:
            kept.append(e)
        elif not (len(e["loc"]) == i + 1 and e["loc"][:i] in deeper):  # the wrong shape, beside the right one
            kept.append({**e, "loc": e["loc"][:i] + e["loc"][i + 1:]})
    return kept


def _describe(error: ValidationError, root: type[BaseModel]) -> str:
    lines: dict[str, list[str]] = {}
    for e in _without_union_members(error.errors()):
        loc = e["loc"]
        if loc and loc[-1] == "[key]":  # a mapping's key that is not allowed: "items: key 'nope': ..."
            loc, e = loc[:-2], {**e, "msg": f"key {loc[-2]!r}: {e['msg']}", "input": None}
        key = ".".join(str(p) for p in loc) or "(top level)"
        if e["type"] == "extra_forbidden":
            line = f"{key}: unknown key; allowed here: {', '.join(_allowed_keys(root, e['loc'][:-1]))}"
        elif e["type"] == "value_error" and isinstance(e.get("input"), dict):
            # A check across a section's keys: its message names them; the whole section would only be noise.
            prefix = f"{key}." if e["loc"] else ""
            line = f"{prefix}{e['msg'].removeprefix('Value error, ')}"
        else:
            got = "" if e.get("input") is None else f" (got {e['input']!r})"
            line = f"{e['msg'].removeprefix('Value error, ')}{got}"
            lines.setdefault(key, []).append(line)  # a union's members each say what they take: "... or ..."
            continue
        lines.setdefault(line, [])
    return "; ".join(f"{key}: {' or '.join(said)}" if said else key for key, said in lines.items())


def parse_params(raw: dict) -> ExperimentSection:
    """The params of `raw` (a params file's content), validated by the root class of its `task` (classification
    when none is named)."""
    raw = raw or {}
    task = raw.get("task", CLASSIFICATION)
    if task not in TASK_PACKAGES:
        raise ParamsError(f"invalid params: task: unknown task {task!r}; allowed: {', '.join(TASK_PACKAGES)}")
    # The family's root class, from its own package: this module names no family.
    root: type[ExperimentSection] = importlib.import_module(f"{TASK_PACKAGES[task]}.params").PARAMS
    try:
        return root.model_validate(raw)
    except ValidationError as error:
        raise ParamsError(f"invalid params: {_describe(error, root)}") from None


def load_params(path: str | Path = "params.yaml") -> ExperimentSection:
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"params file {path} not found")
    return parse_params(yaml.safe_load(path.read_text()))
