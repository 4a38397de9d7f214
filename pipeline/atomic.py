"""Atomic file writes: a killed stage leaves the previous file (or none), never half of a new one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd


def write_bytes(path: str | Path, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # same directory, so os.replace is atomic
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_text(path: str | Path, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, obj) -> Path:
    return write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_csv(path: str | Path, frame: pd.DataFrame) -> Path:
    return write_text(path, frame.to_csv(index=False))
