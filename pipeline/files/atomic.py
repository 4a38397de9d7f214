"""Atomic file writes: a killed stage leaves the previous file (or none), never half of a new one.

A write goes to a scratch file or folder beside its target, named after the writing process, and is renamed
onto the target when complete. A SIGKILL skips every `finally`, so a killed writer's scratch stays behind; the
next write to the same target removes the scratch of writers that no longer run (a rerun of the killed stage
writes the same targets), so a killed run neither leaks a model's worth of disk per kill nor leaves stray
files in the git-tracked reports folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd


def _scratch(path: Path, kind: str) -> Path:
    """A fresh scratch name beside `path` (same folder, so os.replace is atomic), tagged with this process's
    pid, which tells a dead writer's leftovers from a live one's; the random part keeps threads apart."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.{kind}")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def remove_stale_scratch(path: str | Path) -> list[Path]:
    """Remove the scratch files and folders that killed writers of `path` left beside it (their staging, and a
    previous folder set aside mid-swap); those of running processes are kept. Returns what was removed.

    Liveness is by pid on this machine, the assumption DVC's own rwlock makes about a workspace."""
    path = Path(path)
    if not path.parent.is_dir():
        return []
    # The random part is optional: temp files named before it was added (`.NAME.PID.tmp`) are scratch too.
    pattern = re.compile(rf"\.{re.escape(path.name)}\.(\d+)(\.[0-9a-f]{{12}})?\.(tmp|old)")
    removed = []
    for sibling in path.parent.iterdir():
        match = pattern.fullmatch(sibling.name)
        if match is None or _running(int(match.group(1))):
            continue
        if sibling.is_dir() and not sibling.is_symlink():
            shutil.rmtree(sibling, ignore_errors=True)
        else:
            sibling.unlink(missing_ok=True)
        removed.append(sibling)
    return removed


def write_bytes(path: str | Path, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_scratch(path)
    tmp = _scratch(path, "tmp")
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


@contextmanager
def staged_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty staging folder beside `path`; when the block succeeds it replaces `path` (a folder), so a
    killed write leaves the previous folder (or none), never a half-written one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_scratch(path)
    # Not tempfile.mkdtemp: its 0o700 mode would survive the rename; mkdir gives the umask's usual mode.
    staging = _scratch(path, "tmp")
    staging.mkdir()
    try:
        yield staging
        if path.exists():
            old = _scratch(path, "old")
            os.replace(path, old)
            os.replace(staging, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
