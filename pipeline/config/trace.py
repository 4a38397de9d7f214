"""Which params a stage reads: a read-only view of validated params that records every field it hands out.

With $SIXTEEN_HEADS_PARAMS_TRACE set to a folder, each stage records the dotted names it read into
`<folder>/<stage>.json` when it exits. The tests run the real pipeline that way and check every name against
the params the stage declares in its dvc.yaml, so a stage can never read a param DVC does not track.
"""

from __future__ import annotations

import atexit
import json
import os
from pathlib import Path

from pydantic import BaseModel

from pipeline.config.params import EXECUTION_SETTINGS

TRACE_ENV = "SIXTEEN_HEADS_PARAMS_TRACE"


class TracedParams:
    """Forwards attribute reads to `model`, noting each field's dotted name in `reads`. A section handed out
    whole is traced too, and calling one of its methods (`model_dump()`, ...) counts as reading all of it."""

    def __init__(self, model: BaseModel, reads: set[str], prefix: str = ""):
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_reads", reads)
        object.__setattr__(self, "_prefix", prefix)

    def __getattr__(self, name: str):
        model, reads, prefix = self._model, self._reads, self._prefix
        value = getattr(model, name)
        if name not in type(model).model_fields:
            if callable(value) and prefix:
                reads.add(prefix.rstrip("."))  # a method of the section reads the whole section
            return value  # a property (derived from fields it reads itself) or a method of the top level
        if isinstance(value, BaseModel):
            return TracedParams(value, reads, f"{prefix}{name}.")
        if f"{prefix}{name}" not in EXECUTION_SETTINGS:  # how to run, not what: never a DVC param
            reads.add(f"{prefix}{name}")
        return value

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError("params are read-only")


def traced(params: BaseModel, stage: str) -> BaseModel | TracedParams:
    """`params` as they are, or traced into $SIXTEEN_HEADS_PARAMS_TRACE/<stage>.json when that is set."""
    folder = os.environ.get(TRACE_ENV)
    if not folder:
        return params
    reads: set[str] = set()
    path = Path(folder) / f"{stage}.json"

    def write() -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        earlier = set(json.loads(path.read_text())) if path.exists() else set()
        path.write_text(json.dumps(sorted(reads | earlier), indent=1))

    atexit.register(write)
    return TracedParams(params, reads)
