"""Every check that can run before the heavy imports: the params file, and the inputs that the prepare stage reads.

A stage calls `preflight(stage)` first thing, before it imports torch, transformers or datasets (10-15 s here), so
that a mistyped key, path or column gets its line within a second or two, and before anything is written. The
command `python -m pipeline.checks` (run first by `make repro`) runs the same checks and lists every problem at once.
Imports stay light on purpose: yaml, pydantic, numpy and the standard library.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.config.params import AnyParams, ParamsError, TranslationParams, load_params
from pipeline.files.schema import CLASSIFICATION, DEFAULT, LANGUAGE_MODELING, SCRATCH
from pipeline.tasks.inputs import (
    classification_source_problems,
    language_modeling_source_problems,
    model_problems,
    translation_source_problems,
)

PREPARE = "prepare"  # the one stage that reads the user's model and data; the later stages read its outputs


def params_file(argv: list[str] | None = None, description: str = "Run one pipeline stage of the experiment in FILE."
                ) -> str:
    """The `--params FILE` of a stage's (or the checks') command line."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--params", default="params.yaml", metavar="FILE",
                        help="the experiment's params file (default: params.yaml)")
    return parser.parse_args(argv).params


def _fairseq_problems(params: TranslationParams) -> list[str]:
    m = params.model
    problems = []
    if not Path(m.checkpoint).is_file():
        problems.append(f"model.checkpoint: no file {m.checkpoint}; expected the .pt file written by fairseq-train")
    data_bin = Path(m.data_bin)
    if not data_bin.is_dir():
        problems.append(f"model.data_bin: no folder {m.data_bin}; expected the output folder of fairseq-preprocess "
                        f"(dict.<lang>.txt and the binarised splits)")
    elif not any(data_bin.glob("dict.*.txt")):
        problems.append(f"model.data_bin: {m.data_bin} has no dict.<lang>.txt; expected the output folder of "
                        f"fairseq-preprocess")
    return problems


def input_problems(params: AnyParams) -> list[str]:
    """Every problem with the model and the data that the params name, one line each (none for the defaults)."""
    d, m = params.data, params.model
    if params.task == LANGUAGE_MODELING:
        return [*model_problems(m.name_or_path), *language_modeling_source_problems(d.source, d.text_column,
                                                                                    d.fractions)]
    if params.task == CLASSIFICATION:
        text_columns = [c for c in (d.text_column, d.text_pair_column) if c is not None]
        return [*model_problems(m.name_or_path),
                *classification_source_problems(d.source, text_columns, d.label_column, d.fractions, params.seed)]
    if m.backend == "fairseq":
        return _fairseq_problems(params)
    problems = [] if m.name_or_path == SCRATCH else model_problems(m.name_or_path)
    if d.source != DEFAULT:
        problems += translation_source_problems(d.source, d.source_column, d.target_column, d.source_lang,
                                                d.target_lang, d.fractions)
    return problems


def check_all(path: str | Path, inputs: bool = True) -> list[str]:
    """Every problem with the params file `path` and (`inputs`) with the model and data it names, one line each."""
    try:
        params = load_params(path)
    except ParamsError as error:
        return [str(error)]
    return input_problems(params) if inputs else []


def preflight(stage: str, argv: list[str] | None = None) -> None:
    """A stage's checks before its heavy imports: its params, and for prepare the model and data they name. Exits
    with one `error:` line per problem."""
    problems = check_all(params_file(argv), inputs=stage == PREPARE)
    if problems:
        raise SystemExit("\n".join(f"error: {problem}" for problem in problems))
