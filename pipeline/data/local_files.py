"""Local task files, shared by both tasks: which file holds which split, how a file is read, how splits are cut.

A local source is one file (train only; dev and test are carved out of it by `fractions`), a folder
holding train.* and optionally dev.* (or validation.*, valid.*, val.*) and test.*, or an explicit
{split: path} mapping. Each task then picks its own columns from the tables read here.

Standard library and numpy only: the prepare stage and `python -m pipeline.checks` read and check these files
before torch, transformers and pandas load (pandas alone takes over 2 s to import here). Every problem is an
`InputError` whose message is one line naming the file, the line and what is allowed.
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.files.schema import EVAL_SPLITS, SPLITS

FORMATS = (".csv", ".tsv", ".json", ".jsonl")
SPLIT_STEMS = {"train": ("train",), "dev": ("dev", "validation", "valid", "val"), "test": ("test",)}


class InputError(ValueError):
    """A user's input that the pipeline cannot use; the message is one line saying what is wrong and what would do."""


@dataclass(frozen=True)
class Table:
    """One local file as columns of values, with where each row sits in the file (for messages).

    CSV/TSV values are the strings as written ("NA" stays "NA", "007" stays "007"); JSON keeps its own types,
    with None where a record lacks a key.
    """

    path: Path
    columns: dict[str, list]
    lines: list[int]  # the file line (JSON lines, CSV, TSV) or record number (a JSON array) of each row
    row_word: str = "line"

    def __len__(self) -> int:
        return len(self.lines)

    def where(self, rows: list[int] | np.ndarray, limit: int = 5) -> str:
        """'lines 4, 9 and 3 more' for row indices `rows`."""
        shown = ", ".join(str(self.lines[i]) for i in list(rows)[:limit])
        more = f" and {len(rows) - limit} more" if len(rows) > limit else ""
        return f"{self.row_word}{'s' if len(rows) > 1 else ''} {shown}{more}"

    def require(self, names: list[str], key: str = "") -> None:
        missing = [c for c in names if c not in self.columns]
        if missing:
            raise InputError(f"{key}{': ' if key else ''}{self.path}: missing column(s) {missing}; available columns: "
                             f"{list(self.columns)}")


def is_blank(value: object) -> bool:
    """No value: JSON null or NaN, or an empty or all-whitespace string."""
    return value is None or (isinstance(value, float) and math.isnan(value)) or (
        isinstance(value, str) and not value.strip())


def check_fractions(fractions: tuple[float, ...]) -> np.ndarray:
    """`fractions` as an array, once checked to be non-negative, to start with a positive one and to sum to 1."""
    f = np.asarray(fractions, dtype=float)
    if f.ndim != 1 or len(f) < 2 or (f < 0).any() or f[0] <= 0 or abs(f.sum() - 1) > 1e-6:
        raise ValueError(
            f"fractions must be non-negative, start with a positive one and sum to 1; got {fractions}"
        )
    return f


# --- which file holds which split -------------------------------------------------------------------------------------


def find_split_files(directory: Path, formats: tuple[str, ...] = FORMATS) -> dict[str, Path]:
    """The file of each split in `directory` (train required), by stem (SPLIT_STEMS) and format (`formats`)."""
    found: dict[str, Path] = {}
    for split, stems in SPLIT_STEMS.items():
        hits = [p for p in sorted(directory.iterdir()) if p.stem in stems and p.suffix.lower() in formats]
        if len(hits) > 1:
            raise InputError(f"{directory}: several files for split {split!r}: {[p.name for p in hits]}")
        if hits:
            found[split] = hits[0]
    if "train" not in found:
        names = sorted(p.name for p in directory.iterdir())
        raise InputError(f"{directory}: no train file (train{'/'.join(formats)}); found: {names}")
    return found


def parallel_text_files(source: str, source_lang: str | None, target_lang: str | None
                        ) -> dict[str, tuple[Path, Path]] | None:
    """A folder of plain-text parallel files, one sentence per line (train.en + train.es, valid.en + valid.es, ...:
    fairseq-preprocess's and Moses' input): (source file, target file) of each split found; None when `source` is no
    such folder."""
    if source_lang is None or target_lang is None or not Path(source).is_dir():
        return None
    found = {}
    for split, stems in SPLIT_STEMS.items():
        for stem in stems:
            pair = Path(source) / f"{stem}.{source_lang}", Path(source) / f"{stem}.{target_lang}"
            if pair[0].is_file() or pair[1].is_file():
                found[split] = pair
                break
    return found if "train" in found else None


def _nearby(path: Path) -> str:
    """' (did you mean data/train.csv?)' when the parent folder holds a similar name."""
    parent = path.parent if path.parent.is_dir() else None
    if parent is None:
        return ""
    close = difflib.get_close_matches(path.name, [p.name for p in parent.iterdir()], n=1, cutoff=0.6)
    return f" (did you mean {parent / close[0]}?)" if close else ""


def split_files(source: str, files: Mapping[str, str | Path] | None, formats: tuple[str, ...] = FORMATS
                ) -> dict[str, Path] | None:
    """The existing file of each split that a local source names: `files` if given, else a folder's split
    files (in `formats`), else one file as train; None when `source` is no local path (the caller says what else
    it takes)."""
    if files is not None:
        paths = {s: Path(p) for s, p in files.items()}
    elif Path(source).is_dir():
        paths = find_split_files(Path(source), formats)
    elif Path(source).is_file():
        paths = {"train": Path(source)}
    else:
        return None
    if sorted(set(paths) - set(SPLITS)) or "train" not in paths:
        raise InputError(f"local files must name a 'train' split and optionally 'dev', 'test'; got {sorted(paths)}")
    for split, path in paths.items():
        if not path.is_file():
            raise InputError(f"{split} file {path} does not exist{_nearby(path)}")
    return paths


def missing_path(source: str) -> str:
    """Why a source that looks like a path names nothing: 'no file or folder data/trian.csv (did you mean ...?)'."""
    return f"no file or folder {source}{_nearby(Path(source))}"


def looks_like_path(name: str) -> bool:
    """A name that can only be a path: it has a file extension, starts with . / ~, or has more than one '/'
    (hub ids and 'glue/<task>' have at most one)."""
    return (name.startswith((".", "/", "~")) or name.count("/") > 1 or name.endswith("/")
            or Path(name).suffix.lower() in FORMATS)


# --- reading one file -------------------------------------------------------------------------------------------------


def _text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise InputError(f"{path}: cannot be read ({error.strerror or error})") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise InputError(f"{path}: not UTF-8 text (byte 0x{raw[error.start]:02x} on line {line}); save it as UTF-8"
                         ) from None


def read_lines(path: Path) -> list[str]:
    """The lines of a plain UTF-8 text file (a final newline ends the last line; it does not start another)."""
    return _text(path).splitlines()


def _read_delimited(path: Path, text: str, delimiter: str) -> Table:
    # TSV corpora (GLUE's and parallel corpora) are full of unbalanced quotes, so TSV is read without quoting.
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, quoting=quoting, strict=True)
    kind = "TSV" if delimiter == "\t" else "CSV"
    try:
        header = next(reader, None)
        if not header or not any(h.strip() for h in header):
            raise InputError(f"{path}: empty; expected a header line naming the columns, then one row per line")
        duplicated = sorted({h for h in header if header.count(h) > 1})
        if duplicated:
            raise InputError(f"{path}: the header names column(s) {duplicated} twice")
        rows, lines = [], []
        for row in reader:
            if not row:  # a blank line
                continue
            if len(row) != len(header):
                raise InputError(f"{path}: line {reader.line_num} has {len(row)} field(s); the header has "
                                 f"{len(header)} ({', '.join(header)}): a stray or missing "
                                 f"{'tab' if kind == 'TSV' else 'comma (quote fields that hold commas)'}?")
            rows.append(row)
            lines.append(reader.line_num)
    except csv.Error as error:
        raise InputError(f"{path}: not valid {kind} on line {reader.line_num}: {error}") from None
    columns = {name: [row[i] for row in rows] for i, name in enumerate(header)}
    return Table(path, columns, lines)


def _records_table(path: Path, records: list, lines: list[int], row_word: str) -> Table:
    names: dict[str, None] = {}
    for record, line in zip(records, lines, strict=True):
        if not isinstance(record, dict):
            raise InputError(f"{path}: {row_word} {line} is a JSON {type(record).__name__}, not an object "
                             f"of columns")
        names.update(dict.fromkeys(record))
    return Table(path, {n: [r.get(n) for r in records] for n in names}, lines, row_word)


def _read_json(path: Path, text: str) -> Table:
    if text.lstrip().startswith("["):  # one JSON array of records
        try:
            records = json.loads(text)
        except json.JSONDecodeError as error:
            raise InputError(f"{path}: not valid JSON on line {error.lineno}, column {error.colno}: {error.msg}"
                             ) from None
        return _records_table(path, records, list(range(1, len(records) + 1)), "record")
    records, lines = [], []  # JSON lines
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise InputError(f"{path}: line {number} is not valid JSON (column {error.colno}: {error.msg}); "
                             f"expected one JSON object per line, or one JSON array") from None
        lines.append(number)
    return _records_table(path, records, lines, "line")


def read_table(path: Path) -> Table:
    """Read one local CSV, TSV, JSON (an array of objects, or JSON lines) or JSONL file."""
    ext = path.suffix.lower()
    if ext not in FORMATS:
        raise InputError(f"{path}: unsupported file type {ext!r}; expected one of {', '.join(FORMATS)}")
    text = _text(path)
    if ext in (".csv", ".tsv"):
        return _read_delimited(path, text, "\t" if ext == ".tsv" else ",")
    return _read_json(path, text)


def check_filled(table: Table, columns: list[str], what: str, key: str = "") -> None:
    """Refuse rows with no value in any of `columns`, counting them and naming where they are."""
    for column in columns:
        blank = [i for i, v in enumerate(table.columns[column]) if is_blank(v)]
        if blank:
            raise InputError(f"{key}{': ' if key else ''}{table.path}: {len(blank)} row(s) with no {what} in column "
                             f"{column!r} ({table.where(blank)})")


# --- how splits are cut -----------------------------------------------------------------------------------------------


def stratified_indices(labels: np.ndarray, fractions: tuple[float, ...], seed: int) -> list[np.ndarray]:
    """Partition range(len(labels)) into len(fractions) parts with the same label mix in each.

    Within each class the rows are permuted by a seeded numpy Generator and cut by largest-remainder
    rounding of n_class * fraction, so sizes are exact per class and the result depends only on
    (labels, fractions, seed). Each part is returned sorted, keeping the source order.
    """
    f = check_fractions(fractions)
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[] for _ in f]
    for cls in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        exact = len(idx) * f
        counts = np.floor(exact).astype(int)
        leftover = len(idx) - counts.sum()
        counts[np.argsort(-(exact - counts), kind="stable")[:leftover]] += 1
        for part, chunk in zip(parts, np.split(idx, np.cumsum(counts)[:-1]), strict=True):
            part.append(chunk)
    return [np.sort(np.concatenate(p)) if p else np.zeros(0, dtype=int) for p in parts]


def stratified_plan(labels: Mapping[str, np.ndarray], fractions: tuple[float, ...], seed: int
                    ) -> dict[str, tuple[str, np.ndarray]]:
    """Where each of SPLITS comes from: (the given split, its row indices there), for class ids by given split.

    Train alone is cut three ways by `fractions`; a missing dev or test is carved out of train in that order, with
    its share of train and itself, stratified by label. Given splits are kept whole.
    """
    f = check_fractions(fractions)
    if set(labels) == {"train"}:
        parts = stratified_indices(labels["train"], tuple(f), seed)
        return {split: ("train", rows) for split, rows in zip(SPLITS, parts, strict=True)}
    plan = {split: (split, np.arange(len(ids))) for split, ids in labels.items()}
    for split in EVAL_SPLITS:
        if split not in plan:
            share = f[SPLITS.index(split)] / (f[0] + f[SPLITS.index(split)])
            rows = plan["train"][1]
            keep, carved = stratified_indices(np.asarray(labels["train"])[rows], (1 - share, share), seed)
            plan["train"], plan[split] = ("train", rows[keep]), ("train", rows[carved])
    return {split: plan[split] for split in SPLITS}
