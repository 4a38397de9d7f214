"""`python -m pipeline.checks.fresh_locks`: whether every committed dvc.lock is fresh for code and params.

A lock records the code, params and command each stage last ran with. When a shared module changes and its stages
are not rerun, the lock still names the old code, and the committed tables come from it; `dvc status` says so, but
nobody reads it on a fresh clone. This check runs `dvc status --json` on each pipeline that has a lock and fails
with one line per stale stage, naming what changed. Only the stage's own definition counts: a changed command, a
changed param, a code or params file (a dep git tracks) that differs from the lock. Outputs, and deps that are
other stages' outputs (absent on a fresh clone, "deleted"), do not: they are what `dvc repro` or `dvc pull` bring.

`make test` runs it (tests/test_dvc_contract.py), so a change to a shared module lands with its reruns or not at
all. A pipeline without a lock (mt-fairseq/, which a fresh clone cannot run: docs/fairseq.md) is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pipeline.checks.dvc_deps import PIPELINES, ROOT

DVC_ENV = {"DVC_NO_ANALYTICS": "1"}
REPRO_COMMANDS = {"dvc.yaml": "make repro", "mt/dvc.yaml": "make repro-mt", "llm/dvc.yaml": "make repro-llm"}


def git_tracked(paths: Sequence[str], root: Path = ROOT) -> set[str]:
    """Those of `paths` (files or folders, relative to `root`) that hold a file git tracks."""
    if not paths:
        return set()
    listed = subprocess.run(["git", "ls-files", "--", *paths], cwd=root, capture_output=True, text=True,
                            check=True).stdout.splitlines()
    return {path for path in paths if any(f == path or f.startswith(path.rstrip("/") + "/") for f in listed)}


def stale_reasons(status: Mapping[str, list], tracked: set[str]) -> dict[str, list[str]]:
    """Each stage of `dvc status --json`'s answer whose code, params or command changed, with what changed; a dep
    counts only where it is in `tracked` (the stage's code and params files) or is a param."""
    stale = {}
    for stage, entries in status.items():
        reasons = []
        for entry in entries:
            if entry == "changed command":
                reasons.append("its command")
            if not isinstance(entry, Mapping):
                continue
            for path, change in entry.get("changed deps", {}).items():
                if isinstance(change, Mapping):  # a params file: {key: "modified" | "new" | "deleted"}
                    reasons += [f"param {key} ({state})" for key, state in change.items()]
                elif path in tracked:
                    reasons.append(f"{path} ({change})")
        if reasons:
            stale[stage] = reasons
    return stale


def pipeline_status(pipeline: str, root: Path = ROOT) -> dict[str, list]:
    """`dvc status --json` of one pipeline file."""
    done = subprocess.run([sys.executable, "-m", "dvc", "status", "--json", pipeline], cwd=root,
                          capture_output=True, text=True, env={**os.environ, **DVC_ENV})
    if done.returncode != 0:
        said = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
        raise SystemExit(f"error: dvc status {pipeline}: {said[-1]}")
    return json.loads(done.stdout or "{}")


def stale_stages(pipeline: str, root: Path = ROOT) -> dict[str, list[str]]:
    """The stages of `pipeline` whose committed lock is stale for code or params, with what changed."""
    status = pipeline_status(pipeline, root)
    deps = {path for entries in status.values() for entry in entries if isinstance(entry, Mapping)
            for path, change in entry.get("changed deps", {}).items() if not isinstance(change, Mapping)}
    return stale_reasons(status, git_tracked(sorted(deps), root))


def locked_pipelines(root: Path = ROOT) -> list[str]:
    """The pipeline files that have a committed dvc.lock beside them."""
    return [p for p in PIPELINES if (root / p).with_name("dvc.lock").is_file()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipeline.checks.fresh_locks", description=__doc__.split("\n")[0])
    parser.parse_args(argv)
    lines, rerun = [], []
    for pipeline in locked_pipelines():
        stale = stale_stages(pipeline)
        lines += [f"{stage}: stale lock, changed since its run: {', '.join(why)}" for stage, why in stale.items()]
        if stale:
            rerun.append(REPRO_COMMANDS.get(pipeline, f"dvc repro {pipeline}"))
    if lines:
        print("\n".join(lines), file=sys.stderr)
        print(f"rerun {', '.join(rerun)} and commit the dvc.lock files", file=sys.stderr)
        raise SystemExit(1)
    print(f"every committed lock is fresh for code and params: {', '.join(locked_pipelines())}")


if __name__ == "__main__":
    main()
