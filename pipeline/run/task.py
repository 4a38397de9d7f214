"""The `Task` protocol: what a task family gives the stages, which name no family.

A family is one package under `pipeline/tasks/` (classification, translation, language_modeling), registered by
name in `pipeline/config/tasks.py`. Its `task` module defines `TASK`, a subclass of `Task` below, holding what every
stage of its pipeline uses: loading and saving its models, the batches that importance is scored on, and the
evaluation that the ablation and pruning sweeps call once per model (the one home of that factory). What only one
stage does lives in a module of the package named after the stage (`prepare`, `finetune`, `recover`, `benchmark`,
...), imported by `Task.stage` when that stage runs. So a stage's code is its script, this layer, the family's
entry modules (`params`, `inputs`, `task`) and its own stage module, which is what `make dvc-deps` writes into its
deps.

Stages are parse, call, write: `Experiment.from_cli()`, then `exp.task.<method>` or `exp.task.stage(name).<fn>`,
then the files. Adding a family is one package and one registry entry (tests/test_task_registry.py adds a toy).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

import pandas as pd
import torch
from torch import nn

from pipeline.config.tasks import family_module
from pipeline.core.checkpoint import load_model, save_model
from pipeline.core.importance import head_importance, token_head_importance
from pipeline.core.sites import AttentionSite, attention_sites
from pipeline.data.evaluation import TaskEval
from pipeline.files.artifacts import MissingArtifact
from pipeline.files.schema import EVAL_SPLITS, TRAIN_LOSS_LAST, TRAIN_SECONDS, TRAIN_STEPS

if TYPE_CHECKING:
    from pipeline.core.importance import HeadChoice
    from pipeline.methods.pruning import CurveEvaluator
    from pipeline.run.experiment import Experiment

Batch = dict[str, torch.Tensor]


@dataclass
class Prepared:
    """What a family's `prepare` returns, having written the base model folder: the tokenised splits, task.json's
    content, and anything else it writes into the data folder (`extra(folder)`)."""

    splits: Any  # datasets.DatasetDict
    info: dict
    extra: Callable[[Path], None] | None = None


@dataclass
class Finetuned:
    """What a family's `finetune` returns: the model to save, finetune.json's content (numbers only: DVC metrics,
    files/schema.py's METRICS_KEYS), the loss of every training step where the family draws training_loss.csv (None
    where it has no such table), and what about.json adds to task.json's descriptions (e.g. the BLEU signature)."""

    model: nn.Module
    summary: dict
    losses: list[float] | None = None
    about: dict = field(default_factory=dict)


def training_summary(losses: list[float], seconds: float) -> dict:
    """finetune.json's training numbers: the steps, the seconds and the last step's loss (none when nothing was
    trained: a metrics file holds numbers only)."""
    return {TRAIN_STEPS: len(losses), TRAIN_SECONDS: round(seconds),
            **({TRAIN_LOSS_LAST: float(losses[-1])} if losses else {})}


class UnknownStage(LookupError):
    """A stage the family takes no part in (its pipeline file does not list it)."""


class Task:
    """A task family, bound to one experiment. Subclasses override what differs; the defaults are a Hugging Face
    model folder written with its tokenizer."""

    name: ClassVar[str]  # the params' `task`
    # The splits the pruning sweep evaluates: decoding is the cost of translation, which evaluates test only.
    sweep_splits: ClassVar[tuple[str, ...]] = EVAL_SPLITS
    # Whether the model's first-token output is all the last layer computes (an encoder's [CLS], a decoder-only
    # LM's next token from the last position is not): the budgeted cost model counts FLOPs accordingly.
    first_token_last_layer: ClassVar[bool] = True
    # Tables 2/3 with a whole key/value group per layer kept, as well as one query head (grouped-query attention).
    one_group_table: ClassVar[bool] = False

    def __init__(self, exp: Experiment) -> None:
        self.exp = exp

    def stage(self, name: str) -> ModuleType:
        """The family's module for what only stage `name` does (`pipeline/tasks/<family>/<name>.py`)."""
        module = family_module(self.name, name)
        if module is None:
            raise UnknownStage(f"the {self.name} task has no {name} stage")
        return module

    # --- models ------------------------------------------------------------------------------------
    def load(self, path: Path) -> nn.Module:
        """A model folder written by `save` (or prepare's base model), on the runtime's device."""
        if not path.is_dir():
            raise MissingArtifact(path)
        exp = self.exp
        return load_model(path, trust_remote_code=exp.trust_remote_code,
                          attn_implementation=exp.params.model.attn_implementation).to(exp.runtime.device)

    def save(self, model: nn.Module, path: Path) -> Path:
        """Write `model` (pruned or not) to the folder `path`, atomically, with the tokenizer."""
        return save_model(model, path, self.exp.tokenizer())

    @property
    def pad_token_id(self) -> int:
        return self.exp.tokenizer().pad_token_id

    def pruned_models(self, attn_implementation: str) -> dict[float, nn.Module]:
        """The unpruned model and those of prune.save_fractions, by the share of heads pruned, running
        `attn_implementation`: what the benchmark stage times side by side."""
        exp = self.exp
        dirs = {0.0: exp.finetuned_dir, **{f: exp.pruned_dir(f) for f in exp.params.prune.save_fractions}}
        models = {f: self.load(d) for f, d in dirs.items()}
        for model in models.values():
            model.set_attn_implementation(attn_implementation)
        return models

    def head_importance(self, path: Path, batches: list[Batch]) -> tuple[list[AttentionSite], list[torch.Tensor]]:
        """The score stage's raw importance of every head of the model at `path` on `batches` (score.estimator:
        "token", the mean over token positions, or the paper's per-example estimator), one `[num_heads]` tensor per
        site, and the model's attention sites. Here the whole model on the runtime's device; a family that scores
        under another runtime.placement overrides it (language modelling: one decoder layer at a time)."""
        model = self.load(path)
        with self.exp.runtime.autocast():  # gates and their gradient sums stay fp32 (pipeline/core/gates.py)
            raw = (token_head_importance(model, batches)[0] if self.exp.params.score.estimator == "token"
                   else head_importance(model, batches))
        return attention_sites(model), raw

    # --- data and evaluation -------------------------------------------------------------------------
    def sample_batches(self, max_examples: int | None, skip: int = 0) -> list[Batch]:
        """Labelled batches (score.batch_size) of a seeded subset of `score.split` (None: all of it); a smaller
        subset is part of a larger one, and `skip` leaves out the first `skip` of the same order (a held-out
        sample: possibly empty when the split is small)."""
        s = self.exp.params.score
        data = self.exp.split(s.split)
        if skip or (max_examples is not None and max_examples < len(data)):
            end = len(data) if max_examples is None else min(len(data), skip + max_examples)
            data = data.shuffle(seed=self.exp.params.seed).select(range(min(skip, end), end))
        return self.batches(data, s.batch_size)

    def batches(self, data: Any, batch_size: int) -> list[Batch]:
        """`data` (a split's rows) as labelled model batches whose loss the gates' gradients are taken of."""
        raise NotImplementedError

    def score_batches(self) -> list[Batch]:
        """The importance-scoring data: `score.max_examples` examples of `score.split` (the paper: training data)."""
        return self.sample_batches(self.exp.params.score.max_examples)

    def evaluation(self, split: str, max_examples: int | None = None) -> TaskEval:
        """What the sweeps call once per masked or pruned model: the task's metric on `split` (a seeded subset of
        `max_examples`)."""
        raise NotImplementedError

    def evaluations(self, max_examples: int | None) -> dict[str, TaskEval]:
        """The pruning sweep's evaluations, one per split of `sweep_splits`."""
        return {split: self.evaluation(split, max_examples) for split in self.sweep_splits}

    def probe_batch(self, evals: Mapping[str, TaskEval]) -> Batch:
        """A short batch to count FLOPs on: its length sets the attention's share of them."""
        return {k: v[:8] for k, v in self.score_batches()[0].items()}

    # --- the prune stage's extra curves ------------------------------------------------------------------
    def extra_curves(self, evaluator: CurveEvaluator, order: list, levels: list[float], counts: list[int],
                     importance: list, choice: HeadChoice, lap: Callable[[str], None]
                     ) -> tuple[list[pd.DataFrame], dict[str, pd.DataFrame]]:
        """Curves beyond the paper's and the criteria's that the family draws into pruning_curve.csv, and tables of
        what they found, by file name (translation: Figure 5's attention kinds; Figure 6's checkpoints and their
        rank correlations, rank_correlation.csv); `lap(name)` after each records its seconds."""
        return [], {}

    def extra_tables(self, evaluator: CurveEvaluator, importance: list, criteria: dict, counts: list[int],
                     choice: HeadChoice, lap: Callable[[str], None]) -> dict[str, pd.DataFrame]:
        """Tables of its own that the family's prune stage writes, by file name (language modelling: the curves in
        the other unit); `lap(name)` records their seconds."""
        return {}
