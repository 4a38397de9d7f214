"""The prepare stage for classification: the model (offline default, hub or local folder) and the task's splits,
tokenised, with the metric the data calls for."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pipeline.data.assets import fetch_asset
from pipeline.data.catalog import OFFLINE_TASKS
from pipeline.data.sources import DEFAULT_MODEL_NAME, materialize_model
from pipeline.files.schema import DEFAULT, TASK_DATA, TASK_DATA_ATTRIBUTION, TASK_MODEL
from pipeline.run.experiment import WHEEL_CACHE, Experiment, log
from pipeline.run.task import Prepared
from pipeline.tasks.classification.data import TaskSpec, load_task, tokenize_splits
from pipeline.tasks.classification.params import DataParams


def task_spec(data: DataParams, cache_dir: Path) -> tuple[TaskSpec, str, str | None]:
    """(spec for `load_task`, a human name of the data, its attribution if we must carry one)."""
    if data.source in OFFLINE_TASKS:  # the default and the other offline tasks (catalog.OFFLINE_TASKS)
        task = OFFLINE_TASKS[data.source]
        path = fetch_asset(task.asset, cache_dir, cache_dir.parent / "assets" / task.file_name)
        spec = TaskSpec(source=f"{task.reader}:{path}", fractions=data.fractions, metric=data.metric)
        return spec, task.name, task.attribution
    spec = TaskSpec(source=data.source, text_column=data.text_column, text_pair_column=data.text_pair_column,
                    label_column=data.label_column, fractions=data.fractions, metric=data.metric)
    return spec, data.source, None


def prepare(exp: Experiment) -> Prepared:
    p = exp.params
    materialize_model(p.model.name_or_path, exp.base_model_dir, WHEEL_CACHE, exp.trust_remote_code)
    spec, data_name, attribution = task_spec(p.data, WHEEL_CACHE)
    splits, info = load_task(spec, seed=p.seed)
    tokenized = tokenize_splits(splits, exp.tokenizer(), info.text_column, info.text_pair_column, p.data.max_length)
    model_name = DEFAULT_MODEL_NAME if p.model.name_or_path == DEFAULT else p.model.name_or_path
    log.info("prepare: %s -> %s, metric %s", data_name, {s: len(d) for s, d in tokenized.items()}, info.metric)
    return Prepared(tokenized, {**dataclasses.asdict(info), TASK_MODEL: model_name, TASK_DATA: data_name,
                                TASK_DATA_ATTRIBUTION: attribution})
