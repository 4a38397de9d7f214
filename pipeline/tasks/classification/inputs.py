"""What a classification experiment takes, checked before torch loads: encoder models with a sequence-classification
head (`ACCEPTS`), and its local data (columns, empty cells, labels, classes per split), read and encoded by the same
functions the prepare stage loads it with (pipeline/tasks/classification/data.py), so what was checked is what is
loaded. Light on purpose: numpy and the standard library.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.core.levels import AttentionShape
from pipeline.data.catalog import GLUE_TASKS, OFFLINE_TASKS
from pipeline.data.inputs import (
    Accepts,
    hub_unreachable,
    level_problems,
    model_problems,
    model_shape,
    offline_advice,
    read_source,
)
from pipeline.data.local_files import (
    InputError,
    Table,
    check_filled,
    check_fractions,
    is_blank,
    looks_like_path,
    missing_path,
    split_files,
    stratified_plan,
)
from pipeline.files.schema import CLASSIFICATION, DEFAULT, SPLITS

if TYPE_CHECKING:
    from pipeline.tasks.classification.params import ClassificationParams

ACCEPTS = Accepts(
    CLASSIFICATION,
    # The encoder families of pipeline/core/sites.py: each has a *ForSequenceClassification head that finetune trains
    # and the gates' gradients reach. Decoder-only models (GPT-2, Llama, ...) and encoder-decoders (Marian, BART)
    # load, then fail in a later stage.
    model_families=("bert", "distilbert", "electra", "mpnet", "roberta"),
    # Every split holds each class: a class that dev or test lacks is never scored, and one that falls out of a
    # split is a class the user asked to classify.
    min_per_class_and_split=1,
)
# The attention of the pinned default model (pipeline/data/assets.py), as its config.json states it: the levels a
# uniform plan can save are known before anything is fetched.
DEFAULT_SHAPE = AttentionShape.alike(sites=6, heads=12)
# pandas' default missing-value markers: a label spelled so is a hole in the data, not a class.
MISSING_LABELS = {"nan", "na", "n/a", "null", "none", "<na>", "-nan"}


@dataclass(frozen=True)
class LocalClassification:
    """A local classification task as read and checked: the tables of the given splits, their class ids, and where
    each of SPLITS comes from (stratified_plan)."""

    tables: dict[str, Table]
    ids: dict[str, np.ndarray]
    num_labels: int
    label_names: tuple[str, ...] | None
    plan: dict[str, tuple[str, np.ndarray]]


def _class_id(value: object) -> int | None:
    """A class id as written: an integer (1, "1", 1.0, "1.0"), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    text = str(value).strip()
    head, _, tail = text.partition(".")
    if head.lstrip("+-").isdigit() and (not tail or set(tail) == {"0"}):
        return int(head)
    return None


def _is_fractional(value: object) -> bool:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    return not isinstance(value, bool) and np.isfinite(number) and not number.is_integer()


def encode_labels(tables: Mapping[str, Table], label_column: str, key: str = "data.label_column"
                  ) -> tuple[dict[str, np.ndarray], int, tuple[str, ...] | None]:
    """Class ids of each split's label column: ids as written (0..K-1, every one of them in train), or label names,
    mapped to their index among train's sorted names (the names are kept). Refuses holes, a mix of ids and names,
    negative or missing ids, and dev/test classes that train lacks."""
    for table in tables.values():
        column = table.columns[label_column]
        blank = [i for i, v in enumerate(column) if is_blank(v) or str(v).strip().lower() in MISSING_LABELS]
        if blank:
            raise InputError(f"{key}: {table.path}: {len(blank)} row(s) without a label in column {label_column!r} "
                             f"({table.where(blank)})")
    for table in tables.values():
        fractional = [i for i, v in enumerate(table.columns[label_column]) if _is_fractional(v)]
        if fractional:
            raise InputError(f"{key}: {table.path}: labels must be class ids (integers >= 0) or names; "
                             f"{table.columns[label_column][fractional[0]]!r} ({table.where(fractional)}) is a "
                             f"fractional number (a regression target? this pipeline classifies)")
    parsed = {split: [_class_id(v) for v in t.columns[label_column]] for split, t in tables.items()}
    counts = {split: sum(i is not None for i in ids) for split, ids in parsed.items()}
    if all(counts[s] == len(tables[s]) for s in tables):
        ids = {split: np.asarray(v, dtype=np.int64) for split, v in parsed.items()}
        for split, v in ids.items():
            negative = np.flatnonzero(v < 0)
            if len(negative):
                raise InputError(f"{key}: {tables[split].path}: class ids must be integers >= 0; {len(negative)} "
                                 f"row(s) have {sorted(set(v[negative].tolist()))[:3]} ({tables[split].where(negative)}"
                                 f"), e.g. GLUE's -1 for a hidden test label")
        seen = set(ids["train"].tolist())
        for split, v in ids.items():
            unseen = sorted(set(v.tolist()) - seen)
            if unseen:
                raise InputError(f"{key}: {tables[split].path}: class id(s) {unseen[:5]} never occur in train "
                                 f"(train has {sorted(seen)}); a model cannot learn a class it never sees")
        num_labels = max(seen) + 1
        if len(seen) > 1 and seen != set(range(num_labels)):  # one class: check_split_classes says so
            absent = sorted(set(range(num_labels)) - seen)
            raise InputError(f"{key}: class ids must run 0..K-1, each occurring in train; {tables['train'].path} "
                             f"has {sorted(seen)} (no {absent[:5]}): renumber them, or write the labels as names")
        return ids, num_labels, None
    if any(counts.values()):  # some labels are class ids, others are not
        mixed = [s for s in tables if 0 < counts[s] < len(tables[s])]
        if not mixed:
            with_ids = next(s for s in tables if counts[s])
            with_names = next(s for s in tables if not counts[s])
            raise InputError(f"{key}: the labels of {tables[with_ids].path} are class ids and those of "
                             f"{tables[with_names].path} names; use one or the other")
        table, parsed_labels = tables[mixed[0]], parsed[mixed[0]]
        names = [i for i, v in enumerate(parsed_labels) if v is None]
        numbers = [i for i, v in enumerate(parsed_labels) if v is not None]
        raise InputError(f"{key}: {table.path}: the labels in {label_column!r} mix class ids "
                         f"({table.where(numbers, 2)}) and names ({table.where(names, 2)}); use one or the other")
    strings = {split: [str(v).strip() for v in t.columns[label_column]] for split, t in tables.items()}
    names = sorted(set(strings["train"]))
    index = {name: i for i, name in enumerate(names)}
    for split, values in strings.items():
        unknown = sorted(set(values) - set(index))
        if unknown:
            raise InputError(f"{key}: {tables[split].path}: labels {unknown[:5]} not seen in train; train labels: "
                             f"{names}")
    ids = {split: np.asarray([index[v] for v in values], dtype=np.int64) for split, values in strings.items()}
    return ids, len(names), tuple(names)


def check_split_classes(plan: Mapping[str, tuple[str, np.ndarray]], ids: Mapping[str, np.ndarray],
                        fractions: tuple[float, ...], key: str = "data") -> None:
    """Each split must hold two examples of two classes at least: a split of one class can be neither learnt from
    nor scored (accuracy is trivial there, Matthews and F1 undefined)."""
    for split, (given, rows) in plan.items():
        classes = np.unique(ids[given][rows])
        if len(classes) < 2:
            carved = "" if given == split else (f" (carved out of {len(ids[given])} training rows by data.fractions "
                                                f"{list(fractions)})")
            raise InputError(f"{key}: {split} would hold {len(rows)} example(s) of {len(classes)} class(es){carved}; "
                             f"every split needs examples of at least two classes: give more examples, or larger "
                             f"fractions for dev and test")


def rows_per_class_needed(given: Collection[str], fractions: tuple[float, ...], per_split: int) -> int:
    """The fewest training rows of a class from which the stratified split (stratified_plan, which rounds each class's
    share of a split by largest remainder) gives every split carved out of train (those not in `given`) at least
    `per_split` rows of it, at that size and every larger one. Found by running the plan on one class, so that it is
    the split's own arithmetic, not a formula beside it."""
    f = check_fractions(fractions)
    carved = [s for s in SPLITS if s not in given]
    if not carved or per_split <= 0:
        return 0
    # Beyond this size every carved share's floor alone is >= per_split (two carves in a row: a product of shares).
    bound = int(np.ceil(per_split / float(f.min()) ** 2)) + 1
    others = {split: np.zeros(1, dtype=np.int64) for split in given if split != "train"}
    needed = bound
    for n in range(bound, 0, -1):
        plan = stratified_plan({"train": np.zeros(n, dtype=np.int64), **others}, tuple(f), seed=0)
        if any(len(plan[split][1]) < per_split for split in carved):
            break
        needed = n
    return needed


def check_class_sizes(tables: Mapping[str, Table], ids: Mapping[str, np.ndarray], label_names: tuple[str, ...] | None,
                      label_column: str, fractions: tuple[float, ...], key: str = "data.label_column") -> None:
    """Each class of train has the rows that ACCEPTS asks of every split carved out of it (rows_per_class_needed)."""
    per_split = ACCEPTS.min_per_class_and_split
    needed = rows_per_class_needed(set(tables), fractions, per_split)
    classes, counts = np.unique(ids["train"], return_counts=True)
    short = [(c, n) for c, n in zip(classes.tolist(), counts.tolist(), strict=True) if n < needed]
    if short:
        cls, count = min(short, key=lambda item: item[1])
        name = label_names[cls] if label_names is not None else str(cls)
        carved = [s for s in SPLITS if s not in tables]
        hold = f"{carved[0]} holds" if len(carved) == 1 else f"{' and '.join(carved)} each hold"
        raise InputError(f"{key}: {tables['train'].path}: class {name!r} has {count} row(s) in column "
                         f"{label_column!r}; the stratified split by data.fractions {list(fractions)} needs {needed} "
                         f"rows of each class so that {hold} at least {per_split} of it; "
                         f"give more examples of it, or leave it out")


def read_classification(source: str, files: Mapping[str, str | Path] | None, text_columns: list[str],
                        label_column: str, fractions: tuple[float, ...], seed: int) -> LocalClassification:
    """Read and check a local classification source (a file, a folder of split files, or `files`)."""
    paths = split_files(source, files)
    if paths is None:
        close = [] if looks_like_path(source) else difflib.get_close_matches(source, list(OFFLINE_TASKS), n=1)
        why = f"no offline task or file {source} (did you mean {close[0]}?)" if close else missing_path(source)
        raise InputError(f"data.source: {why}; expected {', '.join(OFFLINE_TASKS)}, glue/<task> or a local "
                         f"CSV/TSV/JSON/JSONL file or folder")
    tables = {split: read_source(path) for split, path in paths.items()}
    for table in tables.values():
        if not len(table):
            raise InputError(f"data.source: {table.path}: no rows under its header")
        table.require([*text_columns, label_column], "data")
        check_filled(table, text_columns, "text", "data")
    ids, num_labels, label_names = encode_labels(tables, label_column)
    if len(np.unique(ids["train"])) < 2:
        files = ", ".join(str(t.path) for t in tables.values())
        raise InputError(f"data.label_column: every label in {files} is {tables['train'].columns[label_column][0]!r}: "
                         f"a task of one class can be neither learnt nor scored; give examples of two classes at least")
    plan = stratified_plan(ids, tuple(check_fractions(fractions)), seed)
    check_split_classes(plan, ids, fractions)
    check_class_sizes(tables, ids, label_names, label_column, fractions)
    return LocalClassification(tables, ids, num_labels, label_names, plan)


def classification_source_problems(source: str, text_columns: list[str], label_column: str,
                                   fractions: tuple[float, ...], seed: int) -> list[str]:
    """Problems with `data.source` of a classification experiment (the offline tasks, the default among them, have
    none: their files are pinned)."""
    if source in OFFLINE_TASKS:
        return []
    if source.startswith("glue/"):
        task = source.removeprefix("glue/")
        if task not in GLUE_TASKS:
            return [f"data.source: unknown GLUE task {task!r}; allowed: {', '.join(sorted(GLUE_TASKS))}"]
        reason = hub_unreachable()
        return [] if reason is None else [offline_advice(
            f"data.source: {source} is read from the Hugging Face hub (nyu-mll/glue), which is unreachable from "
            f"here ({reason}); save its splits as local train/dev/test CSV or JSONL files and point data.source at "
            f"their folder")]
    try:
        read_classification(source, None, text_columns, label_column, fractions, seed)
    except InputError as error:
        return [str(error)]
    return []


def problems(params: ClassificationParams) -> list[str]:
    """Every problem with the model and the data that a classification experiment's params name, one line each."""
    d, m = params.data, params.model
    text_columns = [c for c in (d.text_column, d.text_pair_column) if c is not None]
    model = model_problems(m.name_or_path, ACCEPTS)
    shape = DEFAULT_SHAPE if m.name_or_path == DEFAULT else model_shape(m.name_or_path)
    # Sharding (accelerate's device_map) is wired into the language-modelling family only: refuse it, not ignore it.
    sharded = ["runtime.placement: sharded is for language models (task: language-modeling); a classification "
               "model runs whole on runtime.device: use placement: whole"
               ] if params.runtime.placement == "sharded" else []
    return [*sharded, *model, *([] if model else level_problems(params.prune, shape)),
            *classification_source_problems(d.source, text_columns, d.label_column, d.fractions, params.seed)]
