"""Task data for sequence classification: load, split, tokenize.

Every source ends up as the same thing: a DatasetDict with "train", "dev" and "test" splits (plus
"test_mismatched" for MNLI), holding the text column(s) and an integer "label" column, and a TaskInfo
that says how to read and score it. Sources:

- "<reader>:<path>": an offline task's file (catalog.OFFLINE_TASKS) read by READERS[reader]: the default
  "rt-snippets" (Rotten Tomatoes snippets with mean human ratings, binarised), "trec" and "disaster-tweets". A file
  with its own test rows (TREC) keeps them as test and carves dev out of train as GLUE does; the others are
  split by `fractions` (80/10/10) stratified by label.
- "glue/<task>": GLUE from the Hugging Face hub. GLUE test labels are hidden, so the official
  validation split is our "test" and "dev" is carved out of train.
- a local CSV/TSV/JSON/JSONL file or directory, or TaskSpec.files, with user-named columns.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import datasets
import numpy as np
import pandas as pd

from pipeline.data.catalog import GLUE_EVAL_SPLITS, GLUE_TASKS, OFFLINE_READERS
from pipeline.data.local_files import InputError, check_fractions, stratified_indices
from pipeline.data.readers import load_disaster_tweets, load_rotten_tomatoes_snippets, load_trec
from pipeline.files.schema import CLASSIFICATION_METRICS, SPLITS
from pipeline.tasks.classification.inputs import read_classification

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class TaskSpec:
    """What to load. Column names matter only for local files; GLUE and the offline readers have fixed schemas.

    source: "<reader>:<path>" (READERS), "glue/<task>", a local file (train only: split by `fractions`),
        a local directory holding train.* and optionally dev.* (or validation.*) and test.*, or
        "local" together with `files`.
    files: split name ("train", "dev", "test") -> path, for local files named in any way.
    fractions: train/dev/test fractions for splits that have to be carved out of train.
    metric: overrides the default metric (the GLUE task's, else "accuracy").
    """

    source: str
    text_column: str = "text"
    text_pair_column: str | None = None
    label_column: str = "label"
    files: Mapping[str, str | Path] | None = None
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
    metric: str | None = None


@dataclass(frozen=True)
class TaskInfo:
    """How to read and score a loaded task; JSON-friendly via dataclasses.asdict."""

    name: str
    num_labels: int
    label_names: tuple[str, ...] | None
    text_column: str
    text_pair_column: str | None
    metric: str


# --- the offline default -----------------------------------------------------------------------------












# How each offline task's file is read (catalog.OFFLINE_TASKS names the reader): a frame of text and label, and of
# split where the file brings its own test set.
READERS = {"rt-snippets": load_rotten_tomatoes_snippets, "trec": load_trec, "disaster-tweets": load_disaster_tweets}


# --- splitting ---------------------------------------------------------------------------------------


def stratified_split(
    df: pd.DataFrame, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1), seed: int = 0
) -> datasets.DatasetDict:
    """Split a frame with a "label" column into train/dev/test, stratified by label (stratified_indices)."""
    if "label" not in df.columns:
        raise ValueError(f"stratified_split needs a 'label' column; available: {list(df.columns)}")
    if len(fractions) != 3:
        raise ValueError(f"fractions must be (train, dev, test); got {fractions}")
    parts = stratified_indices(df["label"].to_numpy(), fractions, seed)
    return datasets.DatasetDict(
        {name: _to_dataset(df.iloc[idx]) for name, idx in zip(SPLITS, parts, strict=True)}
    )


def _to_dataset(df: pd.DataFrame) -> datasets.Dataset:
    features = datasets.Features(
        {c: datasets.Value("int64") if c == "label" else datasets.Value("string") for c in df.columns}
    )
    return datasets.Dataset.from_pandas(df.reset_index(drop=True), features=features, preserve_index=False)


def _carve(train: datasets.Dataset, fraction: float, seed: int) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Split `fraction` of train off as a new stratified split; returns (rest of train, new split)."""
    keep, carved = stratified_indices(np.asarray(train["label"]), (1 - fraction, fraction), seed)
    return train.select(keep), train.select(carved)


def split_with_given_test(df: pd.DataFrame, fractions: tuple[float, ...], seed: int) -> datasets.DatasetDict:
    """A frame whose "split" column marks its own test rows: they stay the test split, and dev is carved out of the
    train rows alone, stratified, with dev's share of train + dev as in `fractions` (as GLUE's dev)."""
    f = check_fractions(fractions)
    given = df.pop("split") if "split" in df.columns else None
    if given is None or set(given) != {"train", "test"}:
        raise ValueError(f"split_with_given_test needs a 'split' column of train and test rows; got {df.columns}")
    train, dev = _carve(_to_dataset(df[given.to_numpy() == "train"]), f[1] / (f[0] + f[1]), seed)
    return datasets.DatasetDict({"train": train, "dev": dev, "test": _to_dataset(df[given.to_numpy() == "test"])})


def _load_offline(reader: str, path: str, fractions: tuple[float, ...], seed: int
                  ) -> tuple[datasets.DatasetDict, TaskInfo]:
    task = OFFLINE_READERS[reader]
    df = READERS[reader](path)
    n = len(task.label_names)
    bad = sorted(set(df["label"]) - set(range(n)))
    if bad:
        raise InputError(f"{path}: labels {bad} out of range for the {n} classes {', '.join(task.label_names)}")
    dsd = split_with_given_test(df.copy(), fractions, seed) if "split" in df.columns else (
        stratified_split(df, tuple(fractions), seed))
    return dsd, TaskInfo(reader, n, task.label_names, "text", None, task.metric)


# --- sources -----------------------------------------------------------------------------------------


def fetch_glue(task: str) -> datasets.DatasetDict:
    """The only hub call for GLUE (kept alone so tests can replace it with local data)."""
    return datasets.load_dataset("nyu-mll/glue", task)


def _load_glue(
    task: str, fractions: tuple[float, ...], seed: int
) -> tuple[datasets.DatasetDict, tuple[str, ...]]:
    if task not in GLUE_TASKS:
        raise InputError(f"unknown GLUE task {task!r}; allowed: {', '.join(sorted(GLUE_TASKS))}")
    spec = GLUE_TASKS[task]
    raw = fetch_glue(task)
    columns = [c for c in (spec.text_column, spec.text_pair_column, "label") if c is not None]
    eval_splits = GLUE_EVAL_SPLITS.get(task, {"test": "validation"})
    out = {}
    for ours, theirs in {"train": "train", **eval_splits}.items():
        if theirs not in raw:
            raise InputError(f"glue/{task}: split {theirs!r} missing; available: {list(raw)}")
        _check_columns(raw[theirs].column_names, columns, f"glue/{task} split {theirs!r}")
        ds = raw[theirs].select_columns(columns)
        out[ours] = ds.filter(lambda batch: [y >= 0 for y in batch["label"]], batched=True)  # -1 = hidden
    f = check_fractions(fractions)
    train, dev = _carve(out.pop("train"), f[1] / (f[0] + f[1]), seed)
    feature = raw["train"].features["label"]
    label_names = tuple(feature.names) if isinstance(feature, datasets.ClassLabel) else spec.label_names
    dsd = datasets.DatasetDict({"train": train, "dev": dev, **out})
    return dsd.cast_column("label", datasets.Value("int64")), label_names


def _check_columns(available: list[str], required: list[str], where: str) -> None:
    missing = [c for c in required if c not in available]
    if missing:
        raise InputError(f"{where}: missing column(s) {missing}; available columns: {list(available)}")


def _load_local(spec: TaskSpec, seed: int) -> tuple[datasets.DatasetDict, int, tuple | None]:
    """A local source as read and checked by inputs.read_classification, cut into SPLITS by its plan."""
    text_columns = [c for c in (spec.text_column, spec.text_pair_column) if c is not None]
    task = read_classification(spec.source, spec.files, text_columns, spec.label_column, spec.fractions, seed)
    frames = {split: pd.DataFrame({**{c: [str(v) for v in table.columns[c]] for c in text_columns},
                                   "label": task.ids[split]}) for split, table in task.tables.items()}
    dsd = {split: _to_dataset(frames[given].iloc[rows]) for split, (given, rows) in task.plan.items()}
    return datasets.DatasetDict(dsd), task.num_labels, task.label_names


def load_task(spec: TaskSpec | str, seed: int = 0) -> tuple[datasets.DatasetDict, TaskInfo]:
    """Load any supported source as train/dev/test (+ test_mismatched for MNLI) and describe it.

    Splits carry the text column(s) under their source names and an int64 "label" column; all
    seeded splitting is stratified by label, so the same (spec, seed) gives the same rows.
    """
    if isinstance(spec, str):
        spec = TaskSpec(source=spec)
    if spec.metric is not None and spec.metric not in CLASSIFICATION_METRICS:
        raise InputError(f"unknown metric {spec.metric!r}; allowed: {', '.join(CLASSIFICATION_METRICS)}")
    source = spec.source
    if source.startswith("glue/"):
        task = source.removeprefix("glue/")
        dsd, label_names = _load_glue(task, spec.fractions, seed)
        glue = GLUE_TASKS[task]
        info = TaskInfo(
            source,
            len(label_names),
            label_names,
            glue.text_column,
            glue.text_pair_column,
            spec.metric or glue.metric,
        )
        return dsd, info
    reader, colon, path = source.partition(":")
    if colon and reader in READERS:
        dsd, info = _load_offline(reader, path, spec.fractions, seed)
        return dsd, dataclasses.replace(info, metric=spec.metric or info.metric)
    if spec.files is None and not Path(source).exists():
        raise InputError(
            f"unknown task source {source!r}: expected 'glue/<task>', '<reader>:<path>' (reader: "
            f"{', '.join(READERS)}), an existing local file or directory, or TaskSpec.files"
        )
    dsd, num_labels, label_names = _load_local(spec, seed)
    info = TaskInfo(
        source, num_labels, label_names, spec.text_column, spec.text_pair_column, spec.metric or "accuracy"
    )
    return dsd, info


# --- tokenization ------------------------------------------------------------------------------------


def tokenize_splits(
    dsd: datasets.DatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    text_column: str,
    text_pair_column: str | None = None,
    max_length: int = 128,
) -> datasets.DatasetDict:
    """Tokenize every split to input_ids, attention_mask (token_type_ids if the tokenizer makes them), labels.

    Sequences are truncated to max_length but not padded: a collator pads each batch to its own
    longest sequence, which is much cheaper than padding everything to max_length.
    """

    def encode(batch):
        pair = batch[text_pair_column] if text_pair_column is not None else None
        enc = tokenizer(batch[text_column], pair, truncation=True, max_length=max_length)
        return {**enc, "labels": batch["label"]}

    return datasets.DatasetDict(
        {
            name: ds.map(encode, batched=True, remove_columns=ds.column_names, desc=f"tokenize {name}")
            for name, ds in dsd.items()
        }
    )


# --- a fine-tuned checkpoint evaluated as it is (finetune.epochs: 0) ---------------------------------------------

_PLACEHOLDER_LABEL = re.compile(r"LABEL_\d+")


class HeadMismatch(ValueError):
    """A checkpoint whose classification head cannot score the task as it is; the message says why, in one line."""


def checkpoint_label_order(architectures: list[str] | None, id2label: Mapping[int, str] | None, num_labels: int,
                           task_num_labels: int, task_label_names: Sequence[str] | None,
                           head_labels: Sequence[str] | None = None) -> list[int]:
    """For each of the task's labels, the output of the checkpoint's head that scores it (identity when they agree).

    The checkpoint must be a `*ForSequenceClassification` with the task's number of labels. Its labels' names come
    from `head_labels` (the user's word) or else the config's `id2label`, unless those are placeholders (LABEL_0, ...),
    which say nothing, so the head's order is taken as the task's. Named labels must be the task's (case aside), in
    any order: the head is then reordered to the task's, so that a prediction keeps meaning what the data's label
    means. Raises HeadMismatch, in one line, for any other checkpoint.
    """
    classifiers = [a for a in architectures or [] if a.endswith("ForSequenceClassification")]
    if not classifiers:
        what = ", ".join(architectures) if architectures else "a model whose config names no architecture"
        raise HeadMismatch(f"it is {what}, with no sequence-classification head")
    if num_labels != task_num_labels:
        raise HeadMismatch(f"its {classifiers[0]} head has {num_labels} labels; the task has {task_num_labels}")
    if head_labels is not None:
        if len(head_labels) != num_labels:
            raise HeadMismatch(f"finetune.head_labels names {len(head_labels)} labels; the head has {num_labels}")
        names = [str(n) for n in head_labels]
    else:
        names = [str((id2label or {}).get(i, f"LABEL_{i}")) for i in range(num_labels)]
        if all(_PLACEHOLDER_LABEL.fullmatch(n) for n in names):
            return list(range(num_labels))
    if task_label_names is None:  # the data's labels are bare class ids: no names to match
        return list(range(num_labels))
    index = {n.lower(): i for i, n in enumerate(names)}
    task = [n.lower() for n in task_label_names]
    if len(index) != len(names) or sorted(index) != sorted(task):
        raise HeadMismatch(f"its head's labels are {names}; the task's are {list(task_label_names)}")
    return [index[n] for n in task]


def reorder_head(model, order: Sequence[int], label_names: Sequence[str] | None) -> None:
    """Make output i of `model`'s classification head the one `order[i]` was (rows of its last linear layer), and
    name its labels `label_names` in the config; identity order changes no weight."""
    import torch

    if list(order) != list(range(len(order))):
        heads = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.out_features == len(order)]
        if not heads:
            raise HeadMismatch(f"no linear layer with {len(order)} outputs in {type(model).__name__}'s head")
        head, index = heads[-1], torch.as_tensor(list(order))
        with torch.no_grad():
            head.weight.copy_(head.weight[index])
            if head.bias is not None:
                head.bias.copy_(head.bias[index])
    if label_names is not None:
        model.config.id2label = dict(enumerate(label_names))
        model.config.label2id = {name: i for i, name in enumerate(label_names)}
