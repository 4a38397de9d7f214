"""Prefect flows over the DVC pipeline: one experiment's stages as tasks, and sweeps of experiments.

DVC is the one cache of record. A stage task runs `dvc repro <stage>` in the experiment's workspace, so
DVC alone decides what is stale, exactly as on the command line, and records what ran in dvc.lock and in
its run-cache. With a DVC remote, the task first pulls the stage's inputs and the run-cache, and pushes its
outputs and the run-cache after, so a worker on another machine restores what any worker (or a plain
`dvc repro`) already computed. Prefect adds scheduling, retries, logs and parallel sweeps; of a stage it
caches nothing, so the two can never disagree. Of a sweep it persists each finished member's result, so a rerun
skips whole members (pipeline/flows/placement.py, which also places members on GPUs).

    python -m pipeline.flows experiment -S prune.step=0.05                  # ephemeral: no server needed
    python -m pipeline.flows sweep steps -m prune.step=0.05 -m prune.step=0.2 --workers 2
    python -m pipeline.flows experiment --params-file experiments/bert-base-mnli.yaml   # a whole params file
    python -m pipeline.flows sweep paper --member-file experiments/bert-base-sst2.yaml --member-file ...
    python -m pipeline.flows sweep seeds -m seed=0 -m seed=1 --gpus-per-member 1 --result-storage s3://bucket/r
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

# Set before Prefect reads its settings: no analytics (these machines are offline, so it would only print
# network errors), and time for the ephemeral API server to start on a busy 2-core machine (default 20 s).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

from prefect import flow, get_run_logger, task  # noqa: E402
from prefect.context import FlowRunContext  # noqa: E402
from prefect.exceptions import MissingContextError  # noqa: E402
from ruamel.yaml import YAML  # noqa: E402

from pipeline.config.params import ParamsError, parse_params  # noqa: E402
from pipeline.files.atomic import staged_dir, write_csv, write_text  # noqa: E402
from pipeline.files.schema import CLASSIFICATION, TASK_PIPELINES, TRANSLATION  # noqa: E402
from pipeline.flows.placement import (  # noqa: E402
    PlacementError,
    declared_gpus,
    gpu_slots,
    member_gpu_env,
    persisted,
    resolve_gpus_per_member,
    result_storage,
    source_identity,
    submit_members,
    sweep_task_runner,
    task_runner_client,
    visible_gpus,
    worker_gpus,
    working_tree_changes,
)

# The DVC remote that workers share, as a URL (s3://bucket/path, a local folder in tests); a flow's
# `dvc_remote` parameter takes precedence. It is registered in each workspace as the remote "flows".
REMOTE_ENV = "SIXTEEN_HEADS_DVC_REMOTE"
REMOTE_NAME = "flows"
# Sweep members' workspaces, beside the project (git- and DVC-ignored), and their persisted results (without a
# DVC remote; with one, they go beside it, where workers on other machines find them).
SWEEPS_DIR = ".sweeps"
RESULTS_DIR = f"{SWEEPS_DIR}/.results"

_STAGE_LINE = {
    "ran": re.compile(r"Running stage '([^']+)'"),
    "restored": re.compile(r"Stage '([^']+)' is cached - skipping run"),
    "up to date": re.compile(r"Stage '([^']+)' didn't change"),
}


class StageFailed(RuntimeError):
    """A DVC command failed; the message ends with the stage's own error output."""


def _logger():
    try:
        return get_run_logger()
    except MissingContextError:  # called outside a flow run, e.g. from a test
        import logging

        return logging.getLogger("pipeline.flows.dvc_flows")


# --- params ----------------------------------------------------------------------------------------


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """`["prune.step=0.05", "seed=1"]` -> `{"prune.step": 0.05, "seed": 1}`; values are YAML, as in
    `dvc exp run -S`."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ParamsError(f"override {item!r}: expected KEY=VALUE, e.g. prune.step=0.05")
        overrides[key.strip()] = yaml.safe_load(value)
    return overrides


def _set_dotted(tree: Any, key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    node = tree
    for i, part in enumerate(parents):
        if not isinstance(node, Mapping) or part not in node:
            raise ParamsError(f"override {key}: no section {'.'.join(parents[: i + 1])!r} in the params file")
        node = node[part]
    if not isinstance(node, Mapping):
        raise ParamsError(f"override {key}: {'.'.join(parents)!r} is not a section")
    node[leaf] = value


def overridden_params(params_file: Path, overrides: Mapping[str, Any]) -> str:
    """The params file's text with `overrides` applied, comments kept; validated, so a wrong key, type or
    value raises ParamsError naming it before anything is written or run."""
    rt = YAML()  # round-trip: keeps comments and order, as `dvc exp run -S` does
    rt.width = 4096
    rt.representer.add_representer(type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null"))
    tree = rt.load(params_file.read_text())
    for key, value in overrides.items():
        _set_dotted(tree, key, value)
    buffer = io.StringIO()
    rt.dump(tree, buffer)
    parse_params(yaml.safe_load(buffer.getvalue()))
    return buffer.getvalue()


def experiment_params(source: Path, overrides: Mapping[str, Any], task: str | None = None) -> str:
    """The text of the params file `source` (an experiment file, e.g. experiments/bert-base-mnli.yaml) with
    `overrides` applied, validated, and checked to be of `task` (the pipeline's); ParamsError otherwise."""
    if not source.is_file():
        raise ParamsError(f"params file {source} not found")
    text = overridden_params(source, overrides) if overrides else source.read_text()
    params = parse_params(yaml.safe_load(text))
    if task is not None and params.task != task:
        raise ParamsError(f"{source}: a {params.task} experiment, but the pipeline runs {task} experiments; give "
                          f"--pipeline {TASK_PIPELINES[params.task]}"
                          f"{' (mt-fairseq/dvc.yaml for a fairseq checkpoint)' if params.task == TRANSLATION else ''}")
    return text


def pipeline_task(workspace: Path, pipeline: str) -> str | None:
    """The task of the experiments `pipeline` runs: that of the params.yaml beside it (None if there is none)."""
    beside = workspace / Path(pipeline).parent / "params.yaml"
    return (yaml.safe_load(beside.read_text()) or {}).get("task", CLASSIFICATION) if beside.is_file() else None


def use_params_file(workspace: Path, pipeline: str, source: str | None, overrides: Mapping[str, Any]) -> None:
    """Make the pipeline's params.yaml in `workspace` the file `source` (relative to the workspace; None: the params
    file as it is), with `overrides` applied, as `cp FILE params.yaml && dvc exp run -S ...` would; validated before
    anything is written, and a file it would not change is left untouched."""
    target = workspace / Path(pipeline).parent / "params.yaml"
    if source is None:
        apply_overrides(target, overrides)
        return
    text = experiment_params(workspace / source, overrides, pipeline_task(workspace, pipeline))
    if not target.is_file() or text != target.read_text():
        write_text(target, text)


def apply_overrides(params_file: Path, overrides: Mapping[str, Any]) -> None:
    """Write the overrides into the params file; a file they would not change is left untouched."""
    if overrides:
        text = overridden_params(params_file, overrides)
        if yaml.safe_load(text) != yaml.safe_load(params_file.read_text()):
            write_text(params_file, text)


# --- DVC -------------------------------------------------------------------------------------------


def run_dvc(args: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None) -> str:
    """Run `dvc ARGS` in `cwd`, streaming its output (and the stage's) into the task's Prefect log."""
    log = _logger()
    bin_dir = Path(sys.executable).parent
    # Stage commands (`python -m stages.x`) run on the flow's own interpreter, whatever PATH the worker had;
    # tqdm bars become a log line every 30 s instead of a carriage-return stream.
    full_env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                "TQDM_MININTERVAL": "30", **(env or {})}
    command = [str(bin_dir / "dvc"), *args]
    lines = []
    with subprocess.Popen(command, cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1) as process:
        for chunk in process.stdout:
            for line in re.split(r"[\r\n]", chunk):
                if line.strip():
                    lines.append(line)
                    log.info(line)
    if process.returncode != 0:
        raise StageFailed(f"`dvc {' '.join(args)}` failed in {cwd}: {_headline(lines)}\n" + "\n".join(lines[-15:]))
    return "\n".join(lines)


def _headline(lines: Sequence[str]) -> str:
    """The stage's own error line (a stage's `error: ...` or an exception's last line), else DVC's."""
    for line in reversed(lines):
        if re.match(r"(error: |\w+(Error|Exception): )", line):
            return line
    return next((line for line in reversed(lines) if line.startswith("ERROR")), "see the output below")


def pipeline_stages(workspace: Path, pipeline: str = "dvc.yaml") -> list[str]:
    """The stages of a dvc.yaml in file order (ours is topological), as DVC addresses them."""
    stages = yaml.safe_load((workspace / pipeline).read_text())["stages"]
    prefix = "" if pipeline == "dvc.yaml" else f"{pipeline}:"
    return [f"{prefix}{name}" for name in stages]


def stage_status(output: str, stage: str) -> str:
    """'ran', 'restored' (from the run-cache) or 'up to date', from what `dvc repro` printed."""
    for status, pattern in _STAGE_LINE.items():
        if stage in pattern.findall(output):
            return status
    raise StageFailed(f"`dvc repro {stage}` did not report the stage:\n{output[-2000:]}")


def use_remote(workspace: Path, url: str | None) -> str | None:
    """Register the shared DVC remote in the workspace (config.local: nothing committed changes)."""
    if not url:
        return None
    # The local default, because `dvc repro --pull` takes no remote name.
    run_dvc(["remote", "add", "--local", "--force", "--default", REMOTE_NAME, url], workspace)
    return REMOTE_NAME


def dvc_metrics(workspace: Path) -> dict[str, float]:
    """The workspace's DVC metrics, flattened to `<file stem>.<key>` (numbers only)."""
    from dvc.repo import Repo

    with Repo(str(workspace)) as repo:
        shown = repo.metrics.show()
    flat: dict[str, float] = {}
    for path, content in shown.get("", {}).get("data", {}).items():  # {rev: {"data": {file: {"data": ...}}}}
        _flatten(Path(path).stem, content.get("data", {}), flat)
    return flat


def _flatten(prefix: str, value: Any, out: dict[str, float]) -> None:
    if isinstance(value, Mapping):
        for key, inner in value.items():
            _flatten(f"{prefix}.{key}", inner, out)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out[prefix] = value


# --- tasks and flows -------------------------------------------------------------------------------


def push_git_tracked_outputs(workspace: Path, stage: str, remote: str) -> None:
    """Push the objects of the stage's `cache: false` metrics and plots. DVC's run-cache restores them (it copies
    them into its cache when the stage runs), but `dvc push --run-cache` sends only cached outputs' objects, so a
    worker with a bare clone would rerun a stage it could restore (DVC 3.67; the remote round trip is tested)."""
    from dvc.repo import Repo

    # DVC resolves a stage's address against the process's cwd, not the repo's root, so make it absolute.
    dvcfile, _, name = stage.rpartition(":")
    address = f"{workspace.resolve() / (dvcfile or 'dvc.yaml')}:{name}"
    with Repo(str(workspace)) as repo:
        objects = [out.hash_info for s in repo.stage.collect(address) for out in s.outs
                   if not out.use_cache and out.hash_info]
        if objects:
            repo.cloud.push(objects, remote=remote)


@task(name="stage", task_run_name="{stage}", retries=2, retry_delay_seconds=10)
def run_stage(workspace: str, stage: str, remote: str | None = None, env: dict[str, str] | None = None) -> dict:
    """One DVC stage: pull its inputs (with a remote), `dvc repro` it, push its outputs."""
    root = Path(workspace)
    start = time.perf_counter()
    repro = ["repro", "--single-item", stage]  # stages run in order, so upstream is already reproduced
    if remote:
        # The run-cache's entries, then `repro --pull` fetches the outputs of the entry it restores.
        run_dvc(["pull", "--run-cache", "--allow-missing", "--with-deps", "-r", remote, stage], root)
        repro.insert(1, "--pull")
    status = stage_status(run_dvc(repro, root, env), stage)
    if remote:
        run_dvc(["push", "--run-cache", "-r", remote, stage], root)
        push_git_tracked_outputs(root, stage, remote)
    seconds = round(time.perf_counter() - start, 2)
    _logger().info("%s: %s (%.1f s)", stage, status, seconds)
    return {"stage": stage, "status": status, "seconds": seconds}


@flow(name="experiment")
def experiment(overrides: dict[str, Any] | None = None, workspace: str = ".", pipeline: str = "dvc.yaml",
               dvc_remote: str | None = None, retries: int = 2, ablate_workers: int = 1,
               params_file: str | None = None, env: dict[str, str] | None = None) -> dict:
    """Every stage of one experiment, in order, in `workspace`.

    `params_file` (relative to the workspace, e.g. experiments/bert-base-mnli.yaml) replaces the pipeline's
    params.yaml first; then `overrides` ({"prune.step": 0.05}) are written into it, as `dvc exp run -S` does.
    `pipeline` is one of TASK_PIPELINES (dvc.yaml, mt/dvc.yaml, llm/dvc.yaml), with params.yaml beside it.
    `ablate_workers` > 1 shards the single-head ablation over Dask workers (the result is identical).
    `env` is added to every stage's environment (a sweep member's CUDA_VISIBLE_DEVICES).
    """
    root = Path(workspace).resolve()
    use_params_file(root, pipeline, params_file, overrides or {})
    remote = use_remote(root, dvc_remote or os.environ.get(REMOTE_ENV))
    stage_env = {"ABLATE_WORKERS": str(ablate_workers), **(env or {})}
    results = [run_stage.with_options(retries=retries)(str(root), stage, remote, stage_env)
               for stage in pipeline_stages(root, pipeline)]
    return {"workspace": str(root), "stages": results, "metrics": dvc_metrics(root)}


def make_workspace(root: Path, dest: Path) -> Path:
    """A fresh clone of the project at `dest` with the working tree's uncommitted changes, sharing the
    project's DVC cache (and run-cache), so stages any workspace already ran are restored, not rerun.

    Built in a staging folder that replaces `dest` only when complete: a killed build leaves the previous
    workspace (or none), never a clone without the changes or the shared cache that a later run would trust."""
    changed, deleted = working_tree_changes(root)
    cache = run_dvc(["cache", "dir"], root).strip().splitlines()[-1]
    with staged_dir(dest) as staging:
        subprocess.run(["git", "clone", "--quiet", "--shared", str(root), str(staging)], check=True)
        for name in changed:
            if (root / name).is_file():
                (staging / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / name, staging / name)
        for name in deleted:
            (staging / name).unlink(missing_ok=True)
        run_dvc(["cache", "dir", "--local", cache], staging)
    return dest


@task(name="sweep-member", task_run_name="{member}")
def sweep_member(workspace: str, sweep_name: str, member: str, overrides: dict[str, Any], pipeline: str,
                 dvc_remote: str | None, retries: int, params_file: str | None = None, gpus_per_member: int = 0,
                 source: str = "") -> dict:
    """One member of a sweep, in its own workspace, on the GPUs of the Dask worker it runs on. `source` (the
    project's source_identity) is not used here: it is part of the key the member's result is persisted under."""
    dest = make_workspace(Path(workspace), Path(workspace) / SWEEPS_DIR / sweep_name / member)
    return experiment(overrides, str(dest), pipeline, dvc_remote, retries, params_file=params_file,
                      env=member_gpu_env(worker_gpus(), gpus_per_member))


def comparison_table(members: Mapping[str, Mapping[str, Any]], results: Mapping[str, dict],
                     params_files: Mapping[str, str] | None = None) -> pd.DataFrame:
    """One row per member: its params file (when the sweep has any), its overrides, then its DVC metrics."""
    rows = []
    for member, overrides in members.items():
        ran = [r["stage"] for r in results[member]["stages"] if r["status"] == "ran"]
        source = {"params_file": (params_files or {}).get(member)} if params_files else {}
        rows.append({"member": member, **source, **overrides, "stages_ran": len(ran), **results[member]["metrics"]})
    return pd.DataFrame(rows)


def member_results(futures: Mapping[str, Any]) -> dict[str, dict]:
    """Every member's result, once all have ended: a failing member does not stop the others, so that theirs
    persist and a rerun runs only the failed. StageFailed naming the failed members (and the first's error)."""
    results, failed = {}, {}
    for member, future in futures.items():
        try:
            results[member] = future.result()
        except Exception as error:  # any member's error: reported below, after the others have finished
            failed[member] = error
    if failed:
        first, error = next(iter(failed.items()))
        raise StageFailed(f"{len(failed)} of {len(futures)} sweep members failed ({', '.join(failed)}); the others' "
                          f"results are kept, so a rerun runs only these. {first}: {error}")
    return results


@flow(name="sweep", task_runner=sweep_task_runner())
def sweep(members: dict[str, dict[str, Any]], name: str = "sweep", workspace: str = ".",
          pipeline: str = "dvc.yaml", dvc_remote: str | None = None, retries: int = 2,
          params_files: dict[str, str] | None = None, gpus_per_member: int | None = None,
          results: str | None = None, refresh: bool = False) -> str:
    """The experiment flow once per member ({"step-05": {"prune.step": 0.05}, ...}), in parallel, each in
    its own workspace under .sweeps/<name>/; the comparison table goes to reports/sweeps/<name>/.
    `params_files` ({"bert-base-sst2": "experiments/bert-base-sst2.yaml"}, relative to the workspace) gives a
    member a whole params file of its own, which its overrides then change.

    Each member asks its Dask worker for `gpus_per_member` GPUs (None: 1 if any worker declares a GPU, else 0)
    and sees only those. Each finished member's result persists at `results` (a folder or fsspec URL; default
    .sweeps/.results, or prefect-results beside the DVC remote), so a rerun runs only the members that did not
    finish, unless `refresh`."""
    root = Path(workspace).resolve()
    params_files = params_files or {}
    if not members:
        raise ParamsError("sweep: no members; give at least one set of overrides or params file")
    stray = sorted(set(params_files) - set(members))
    if stray:
        raise ParamsError(f"sweep: params_files names {', '.join(stray)}, which are not members")
    for member, overrides in members.items():
        try:  # every member is validated before any runs
            if member in params_files:
                experiment_params(root / params_files[member], overrides, pipeline_task(root, pipeline))
            else:
                overridden_params(root / Path(pipeline).parent / "params.yaml", overrides)
        except ParamsError as error:
            raise ParamsError(f"sweep member {member!r}: {error}") from None
    client = task_runner_client(FlowRunContext.get().task_runner)
    per_member = resolve_gpus_per_member(gpus_per_member, declared_gpus(client) if client else [])
    remote = dvc_remote or os.environ.get(REMOTE_ENV)
    storage = results or (f"{remote.rstrip('/')}/prefect-results" if remote else str(root / RESULTS_DIR))
    member_task = persisted(sweep_member, result_storage(storage), refresh)
    source = source_identity(root)
    _logger().info("sweep %s: %d members, %d GPU(s) each; results at %s", name, len(members), per_member, storage)
    futures = submit_members(member_task, {
        member: {"workspace": str(root), "sweep_name": name, "member": member, "overrides": overrides,
                 "pipeline": pipeline, "dvc_remote": dvc_remote, "retries": retries,
                 "params_file": params_files.get(member), "gpus_per_member": per_member, "source": source}
        for member, overrides in members.items()}, per_member)
    table = comparison_table(members, member_results(futures), params_files)
    out = root / "reports" / "sweeps" / name
    write_csv(out / "comparison.csv", table)
    write_text(out / "comparison.md", table.to_markdown(index=False) + "\n")
    _logger().info("sweep %s: %d members -> %s", name, len(table), out / "comparison.csv")
    return str(out / "comparison.csv")


# --- command line ----------------------------------------------------------------------------------


def member_name(overrides: Mapping[str, Any]) -> str:
    return "_".join(f"{key}={value}" for key, value in overrides.items()) or "base"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipeline.flows", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("experiment", help="run every stage of one experiment")
    one.add_argument("-S", "--set", action="append", default=[], metavar="KEY=VALUE", help="override a param")
    one.add_argument("--ablate-workers", type=int, default=1, help="shard the ablation over this many Dask workers")
    one.add_argument("--params-file", metavar="FILE",
                     help="a whole params file (e.g. experiments/bert-base-mnli.yaml) to run, written over the "
                          "pipeline's params.yaml before the -S overrides")
    many = commands.add_parser("sweep", help="run the experiment once per member, in parallel")
    many.add_argument("name", help="the sweep's name: reports/sweeps/<name>/comparison.csv")
    many.add_argument("-m", "--member", action="append", default=[], metavar="'KEY=VALUE ...'",
                      help="one member's overrides, space-separated (repeat for each member)")
    many.add_argument("--member-file", action="append", default=[], metavar="FILE",
                      help="one member that runs a whole params file, named after it (repeat for each member)")
    many.add_argument("--workers", type=int, help="Dask LocalCluster workers, without an address (default: one "
                                                     "per GPU group, else 2)")
    many.add_argument("--address", help="a Dask scheduler's address (default: $DASK_SCHEDULER_ADDRESS)")
    many.add_argument("--gpus-per-member", type=int, metavar="N",
                      help="GPUs (the Dask worker resource GPU) each member asks for and sees; 0: CPU members "
                           "(default: 1 if the cluster has GPUs, else 0)")
    many.add_argument("--result-storage", metavar="URL",
                      help="where finished members' results persist, so a rerun skips them: a folder or fsspec URL "
                           f"(default: {RESULTS_DIR}, or prefect-results beside the DVC remote)")
    many.add_argument("--refresh", action="store_true", help="rerun every member, finished or not")
    for sub in (one, many):
        sub.add_argument("--pipeline", default="dvc.yaml", help=", ".join(TASK_PIPELINES.values()))
        sub.add_argument("--dvc-remote", help=f"a DVC remote URL workers share (default: ${REMOTE_ENV})")
        sub.add_argument("--retries", type=int, default=2, help="retries of a failed stage")
    args = parser.parse_args(argv)
    try:
        if args.command == "experiment":
            overrides = parse_overrides(args.set)
            if args.params_file:  # checked here too, so that a wrong file fails before Prefect starts
                experiment_params(Path(args.params_file), overrides, pipeline_task(Path("."), args.pipeline))
            experiment(overrides, ".", args.pipeline, args.dvc_remote, args.retries, args.ablate_workers,
                       params_file=args.params_file)
        else:
            if not args.member and not args.member_file:
                parser.error("sweep: give at least one -m/--member or --member-file")
            members, params_files = {}, {}
            for item in args.member:
                overrides = parse_overrides(item.split())
                members[member_name(overrides)] = overrides
            for path in args.member_file:
                member = Path(path).stem
                if member in members:
                    raise ParamsError(f"sweep: two members named {member!r} ({path})")
                experiment_params(Path(path), {}, pipeline_task(Path("."), args.pipeline))
                members[member], params_files[member] = {}, path
            address = args.address or os.environ.get("DASK_SCHEDULER_ADDRESS")
            if not address and args.gpus_per_member:  # checked here too, before Prefect starts
                gpu_slots(visible_gpus(), args.gpus_per_member)
            runner = sweep_task_runner(address, args.workers, args.gpus_per_member)
            sweep.with_options(task_runner=runner)(members, args.name, ".", args.pipeline, args.dvc_remote,
                                                   args.retries, params_files=params_files,
                                                   gpus_per_member=args.gpus_per_member,
                                                   results=args.result_storage, refresh=args.refresh)
    except (ParamsError, StageFailed, PlacementError) as error:
        raise SystemExit(f"error: {error}") from None


if __name__ == "__main__":
    main()
