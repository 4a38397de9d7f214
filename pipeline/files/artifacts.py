"""Damaged and missing artifacts: one line naming the file and the DVC stage that rewrites it.

A stage reads what earlier stages wrote (models, data, tables). When one of those files is truncated or
unparsable, or absent because a stage ran out of order, the library that parses it raises its own error,
deep in a traceback that names neither the file nor the fix. The readers wrap the parse in `reading(path,
<that library's parse errors>)`, which raises `DamagedArtifact` / `MissingArtifact` instead; the stages'
entry point (`Experiment.from_cli`) installs `artifact_excepthook`, which prints such an error as

    error: <file> is damaged (<what>); it is an output of stage '<stage>': rerun it with dvc repro -f -s <stage>

and leaves every other exception (a genuine bug) its traceback. The stage is found from the outs of the
dvc.yaml beside the stage's params file, so the same code serves every pipeline (dvc.yaml, mt/, mt-fairseq/).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

import pandas as pd
import yaml

from pipeline.files.schema import TABLE_COLUMNS


class ArtifactError(Exception):
    """An artifact of an earlier stage that this stage cannot read."""

    def __init__(self, path: str | Path, what: str) -> None:
        super().__init__(path, what)  # the constructor's arguments: a Dask worker's error pickles back whole
        self.path, self.what = Path(path), what

    def __str__(self) -> str:
        return f"{self.path}: {self.what}"

    def line(self, stage: str | None) -> str:
        raise NotImplementedError


class DamagedArtifact(ArtifactError, ValueError):
    """The file exists but does not parse (truncated, overwritten, inconsistent with its model)."""

    def line(self, stage: str | None) -> str:
        return f"error: {self.path} is damaged ({self.what}); {_rerun(stage)}"


class MissingArtifact(ArtifactError, FileNotFoundError):
    """The file is absent: the stage that writes it has not run (or its output was deleted)."""

    def __init__(self, path: str | Path, what: str = "missing") -> None:
        super().__init__(path, what)

    def line(self, stage: str | None) -> str:
        # Not -s: the stages it needs may not have run either, and dvc repro <stage> runs those first.
        return f"error: {self.path} is missing; {_rerun(stage, fix='run it with dvc repro')}"


def _rerun(stage: str | None, fix: str = "rerun it with dvc repro -f -s") -> str:
    if stage is None:
        return "rerun the stage that writes it"
    return f"it is an output of stage '{stage}': {fix} {stage}"


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


@contextmanager
def reading(path: str | Path, *parse_errors: type[BaseException]) -> Iterator[None]:
    """Read the artifact `path` inside this block: it must exist, and the `parse_errors` the block raises
    (only those of its parser: anything else is a bug, with its traceback) become `DamagedArtifact`."""
    if not Path(path).exists():
        raise MissingArtifact(path)
    try:
        yield
    except ArtifactError:
        raise
    except parse_errors as error:
        what = _first_line(error)
        # Our own parsers' messages start with the file's name, which the line names already.
        if what.startswith(str(path)):
            what = what.removeprefix(str(path)).lstrip(": ")
        raise DamagedArtifact(path, what) from error


def read_table(path: str | Path) -> pd.DataFrame:
    """A CSV table that a stage wrote (reports/<experiment>/<name>.csv), with the columns its readers rely on
    (`TABLE_COLUMNS`)."""
    path = Path(path)
    with reading(path, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
        table = pd.read_csv(path)
    missing = [c for c in TABLE_COLUMNS.get(path.name, []) if c not in table.columns]
    if missing:
        raise DamagedArtifact(path, f"missing columns {', '.join(missing)}")
    return table


# --- which stage writes a file ------------------------------------------------------------------
def _dotted(tree: object, prefix: str = "") -> dict[str, str]:
    """`{"a.b": "v"}` of a nested mapping: what `${a.b}` in a dvc.yaml stands for."""
    if not isinstance(tree, dict):
        return {prefix: str(tree)} if prefix else {}
    flat: dict[str, str] = {}
    for key, value in tree.items():
        flat.update(_dotted(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def _out_paths(stage: dict) -> Iterator[str]:
    for key in ("outs", "metrics", "plots"):
        for out in stage.get(key) or []:
            yield from (out if isinstance(out, dict) else [out])


def producing_stage(path: str | Path, params_file: str | Path) -> str | None:
    """The stage of the dvc.yaml beside `params_file` that has `path` (relative to the working directory) as,
    or inside, one of its outputs, as `dvc repro` addresses it from here (`score`, or `mt/dvc.yaml:score` for
    another pipeline); None when there is no such dvc.yaml or no stage writes it."""
    dvc_file = Path(params_file).parent / "dvc.yaml"
    try:
        pipeline = yaml.safe_load(dvc_file.read_text())
        values = _dotted(yaml.safe_load(Path(params_file).read_text()))
    except (OSError, yaml.YAMLError):
        return None

    def absolute(p: Path | str) -> str:
        # abspath, not resolve: DVC links outputs to its cache, and the cache path names no stage.
        return os.path.abspath(p)

    target = absolute(path)
    for name, stage in (pipeline or {}).get("stages", {}).items():
        root = dvc_file.parent / stage.get("wdir", ".")
        for out in _out_paths(stage):
            out = absolute(root / re.sub(r"\$\{\s*([\w.-]+)\s*\}", lambda m: values.get(m[1], m[0]), out))
            if target == out or target.startswith(out + os.sep):
                where = os.path.relpath(dvc_file)
                return name if where == "dvc.yaml" else f"{where}:{name}"
    return None


def artifact_excepthook(params_file: str | Path) -> Callable[[type[BaseException], BaseException,
                                                               TracebackType | None], None]:
    """A `sys.excepthook` for a stage run with `params_file`: an `ArtifactError` becomes its one line on stderr
    (exit status 1), naming the stage to rerun; any other exception goes to the previous hook, traceback and all."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        if isinstance(error, ArtifactError):
            print(error.line(producing_stage(error.path, params_file)), file=sys.stderr)
        else:
            previous(kind, error, tb)

    return hook
