"""Every check that can run before the heavy imports: the params file, and the inputs that the prepare stage reads.

A stage calls `preflight(stage)` first thing, before it imports torch, transformers or datasets (10-15 s here), so
that a mistyped key, path or column gets its line within a second or two, and before anything is written. The
command `python -m pipeline.checks` (run first by `make repro`) runs the same checks and lists every problem at once.
Imports stay light on purpose: yaml, pydantic, numpy and the standard library.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from pipeline.config.params import ExperimentSection, ParamsError, load_params
from pipeline.config.tasks import TASK_PACKAGES
from pipeline.data.inputs import placement_problems

PREPARE = "prepare"  # the one stage that reads the user's model and data; the later stages read its outputs


def params_file(argv: list[str] | None = None, description: str = "Run one pipeline stage of the experiment in FILE."
                ) -> str:
    """The `--params FILE` of a stage's (or the checks') command line."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--params", default="params.yaml", metavar="FILE",
                        help="the experiment's params file (default: params.yaml)")
    return parser.parse_args(argv).params


def input_problems(params: ExperimentSection) -> list[str]:
    """Every problem with the model and the data that the params name, one line each (none for the defaults): the
    family's own checks (`problems` of its inputs module, found through the registry), so this module names none."""
    return importlib.import_module(f"{TASK_PACKAGES[params.task]}.inputs").problems(params)


def runtime_problems(params: ExperimentSection) -> list[str]:
    """A runtime.placement the family does not run (layerwise: language modelling only), in one line. Every stage
    checks it: an execution setting may change after prepare ran."""
    family = importlib.import_module(f"{TASK_PACKAGES[params.task]}.inputs")
    return placement_problems(params.runtime.placement, getattr(family, "ACCEPTS", None))


def check_all(path: str | Path, inputs: bool = True) -> list[str]:
    """Every problem with the params file `path` and (`inputs`) with the model and data it names, one line each."""
    try:
        params = load_params(path)
    except ParamsError as error:
        return [str(error)]
    return [*runtime_problems(params), *(input_problems(params) if inputs else [])]


def preflight(stage: str, argv: list[str] | None = None) -> None:
    """A stage's checks before its heavy imports: its params, and for prepare the model and data they name. Exits
    with one `error:` line per problem."""
    problems = check_all(params_file(argv), inputs=stage == PREPARE)
    if problems:
        raise SystemExit("\n".join(f"error: {problem}" for problem in problems))
