"""Local task files, shared by both tasks: which file holds which split, how a file is read, how splits are cut.

A local source is one file (train only; dev and test are carved out of it by `fractions`), a folder
holding train.* and optionally dev.* (or validation.*, valid.*, val.*) and test.*, or an explicit
{split: path} mapping. Each task then picks its own columns from the frames read here.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.files.schema import SPLITS

FORMATS = (".csv", ".tsv", ".json", ".jsonl")
SPLIT_STEMS = {"train": ("train",), "dev": ("dev", "validation", "valid", "val"), "test": ("test",)}


def check_fractions(fractions: tuple[float, ...]) -> np.ndarray:
    """`fractions` as an array, once checked to be non-negative, to start with a positive one and to sum to 1."""
    f = np.asarray(fractions, dtype=float)
    if f.ndim != 1 or len(f) < 2 or (f < 0).any() or f[0] <= 0 or abs(f.sum() - 1) > 1e-6:
        raise ValueError(
            f"fractions must be non-negative, start with a positive one and sum to 1; got {fractions}"
        )
    return f


def find_split_files(directory: Path) -> dict[str, Path]:
    """The file of each split in `directory` (train required), by stem (SPLIT_STEMS) and format (FORMATS)."""
    found: dict[str, Path] = {}
    for split, stems in SPLIT_STEMS.items():
        hits = [p for p in sorted(directory.iterdir()) if p.stem in stems and p.suffix.lower() in FORMATS]
        if len(hits) > 1:
            raise ValueError(f"{directory}: several files for split {split!r}: {[p.name for p in hits]}")
        if hits:
            found[split] = hits[0]
    if "train" not in found:
        names = sorted(p.name for p in directory.iterdir())
        raise ValueError(f"{directory}: no train file (train.csv/.tsv/.json/.jsonl); found: {names}")
    return found


def split_files(source: str, files: Mapping[str, str | Path] | None) -> dict[str, Path] | None:
    """The existing file of each split that a local source names: `files` if given, else a folder's split
    files, else one file as train; None when `source` is no local path (the caller says what else it takes)."""
    if files is not None:
        paths = {s: Path(p) for s, p in files.items()}
    elif Path(source).is_dir():
        paths = find_split_files(Path(source))
    elif Path(source).is_file():
        paths = {"train": Path(source)}
    else:
        return None
    if sorted(set(paths) - set(SPLITS)) or "train" not in paths:
        raise ValueError(f"local files must name a 'train' split and optionally 'dev', 'test'; got {sorted(paths)}")
    for split, path in paths.items():
        if not path.is_file():
            raise ValueError(f"{split} file {path} does not exist")
    return paths


def read_frame(path: Path) -> pd.DataFrame:
    """Read one local file with CSV/TSV fields kept as strings ("NA" stays "NA", "007" stays "007");
    JSON keeps its own types."""
    ext = path.suffix.lower()
    if ext in (".csv", ".tsv"):
        # TSV corpora (GLUE's and parallel corpora) are full of unbalanced quotes, so TSV is read without quoting.
        quoting = csv.QUOTE_NONE if ext == ".tsv" else csv.QUOTE_MINIMAL
        return pd.read_csv(
            path, sep="\t" if ext == ".tsv" else ",", quoting=quoting, keep_default_na=False, dtype=str
        )
    if ext in (".json", ".jsonl"):
        with open(path, encoding="utf-8") as f:
            head = f.read(1024).lstrip()
        if head.startswith("["):  # one JSON array of records
            return pd.DataFrame(json.loads(path.read_text("utf-8")))
        return pd.read_json(path, lines=True, dtype=False)  # JSON lines; dtype=False keeps "007" a string
    raise ValueError(f"{path}: unsupported file type {ext!r}; expected one of {', '.join(FORMATS)}")
