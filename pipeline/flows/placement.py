"""Where a sweep's members run, and what a rerun of the sweep can skip.

Placement: a GPU is a Dask worker resource named "GPU". Each member asks for `gpus_per_member` of it
(`dask.annotate(resources=...)` around the submission; the Dask client merges the annotation into the task it
sends the scheduler), so the scheduler never starts a member on a worker whose GPUs are all held, whatever its
thread count. A worker owns its GPUs: the local cluster built here names each worker after the GPUs it was given
("gpus:0", "gpus:2,3"); any other worker (a Kubernetes pod, a `dask worker` process) owns the GPUs its process
sees. A member's stages see exactly its worker's GPUs through CUDA_VISIBLE_DEVICES, and none when it asked for 0.

Persistence: a member's result (its stage statuses and DVC metrics) is persisted by Prefect under a key made of
everything that decides it: the sweep's and the member's names, its overrides, params file and pipeline, and
the source it runs (git commit plus the uncommitted changes a member's workspace copies). A rerun of the sweep
reads the finished members' results instead of running them; a member that failed or was killed persisted
nothing, so it runs again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import dask
from distributed import LocalCluster, get_worker
from prefect.filesystems import RemoteFileSystem, WritableFileSystem
from prefect_dask import DaskTaskRunner

from pipeline.config.params import ParamsError

GPU = "GPU"  # the Dask worker resource one GPU counts as (`dask worker --resources GPU=1`)
GPU_WORKER_PREFIX = "gpus:"  # a local worker's name: the GPUs it owns, as CUDA_VISIBLE_DEVICES names them
# What a sweep writes into the project itself: not part of what its members run.
SWEEP_OUTPUTS = "reports/sweeps/"


class PlacementError(RuntimeError):
    """A member landed on a worker that does not have the GPUs it asked for (a misdeclared resource)."""


# --- GPUs and workers ------------------------------------------------------------------------------


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them: that variable's list when it is set,
    else one per GPU that `nvidia-smi -L` lists (none without a driver). No torch import: flows stay light."""
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return [d.strip() for d in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    listed = subprocess.run([smi, "-L"], capture_output=True, text=True)
    count = sum(line.startswith("GPU ") for line in listed.stdout.splitlines()) if listed.returncode == 0 else 0
    return [str(i) for i in range(count)]


def gpu_slots(gpus: Sequence[str], gpus_per_member: int) -> list[list[str]]:
    """`gpus` cut into disjoint groups of `gpus_per_member`, one per local worker (a remainder stays unused);
    ParamsError when not even one group fits."""
    if gpus_per_member < 0:
        raise ParamsError(f"gpus per member: {gpus_per_member}; give 0 (CPU members) or more")
    slots = [list(gpus[i:i + gpus_per_member]) for i in range(0, len(gpus) - gpus_per_member + 1, gpus_per_member)]
    if not slots:
        raise ParamsError(f"{gpus_per_member} GPU(s) per member, but this machine has {len(gpus)}; "
                          f"give --gpus-per-member 0 for CPU members")
    return slots


def local_sweep_cluster(workers: int | None = None, gpus_per_member: int | None = None,
                        gpus: Sequence[str] | None = None, threads_per_worker: int = 1) -> LocalCluster:
    """A LocalCluster of thread workers for a sweep. With GPUs (`gpus`, default those this process sees), one
    worker per group of `gpus_per_member` of them (at most `workers`), named after the group and declaring it as
    its GPU resource; without (`gpus_per_member` 0, or none seen), `workers` (default 2) workers and no resource.
    `gpus_per_member` None: 1 when there are GPUs, else 0. Threads suffice because a member's work runs in
    `dvc repro` subprocesses, and they share the flow process's Prefect API (worker processes could not reach an
    ephemeral server)."""
    gpus = visible_gpus() if gpus is None else list(gpus)
    per_member = (1 if gpus else 0) if gpus_per_member is None else gpus_per_member
    if per_member == 0:
        return LocalCluster(n_workers=workers or 2, threads_per_worker=threads_per_worker, processes=False)
    slots = gpu_slots(gpus, per_member)[:workers] if workers else gpu_slots(gpus, per_member)
    cluster = LocalCluster(n_workers=0, threads_per_worker=threads_per_worker, processes=False,
                           resources={GPU: per_member})
    # Named workers (LocalCluster numbers its own), so that each knows which GPUs are its; then started.
    for owned in slots:
        cluster.worker_spec[GPU_WORKER_PREFIX + ",".join(owned)] = dict(cluster.new_spec)
    cluster.scale(len(cluster.worker_spec))
    cluster.wait_for_workers(len(slots), timeout=120)
    return cluster


def worker_gpus() -> list[str]:
    """The GPUs of the Dask worker this runs on: those its name gives on a local sweep cluster, else those its
    process sees (one GPU per worker pod or process is the mapping this relies on)."""
    try:
        name = str(get_worker().name)
    except ValueError:  # not on a Dask worker
        name = ""
    if name.startswith(GPU_WORKER_PREFIX):
        return name[len(GPU_WORKER_PREFIX):].split(",")
    return visible_gpus()


def member_gpu_env(gpus: Sequence[str], gpus_per_member: int) -> dict[str, str]:
    """A member's stages' CUDA_VISIBLE_DEVICES: the first `gpus_per_member` of its worker's `gpus` (the worker
    owns exactly that many when its resources are declared right), or none at all for a CPU member, so that it
    cannot take a GPU it did not ask for."""
    if gpus_per_member == 0:
        return {"CUDA_VISIBLE_DEVICES": ""}
    if len(gpus) < gpus_per_member:
        raise PlacementError(f"a member needs {gpus_per_member} GPU(s) but its Dask worker has {len(gpus)} "
                             f"({','.join(gpus) or 'none'}); declare `--resources GPU=N` with N the GPUs it sees")
    return {"CUDA_VISIBLE_DEVICES": ",".join(gpus[:gpus_per_member])}


def declared_gpus(client: Any) -> list[float]:
    """The GPU resource each worker of the cluster behind `client` (a distributed.Client) declares."""
    workers = client.scheduler_info(n_workers=-1)["workers"].values()
    return [worker.get("resources", {}).get(GPU, 0) for worker in workers]


def resolve_gpus_per_member(requested: int | None, declared: Sequence[float]) -> int:
    """The GPUs each member asks for: `requested`, or when None, 1 if any worker declares a GPU, else 0.
    ParamsError when workers are up and none declares enough (the members would wait forever)."""
    if requested is not None and requested < 0:
        raise ParamsError(f"gpus per member: {requested}; give 0 (CPU members) or more")
    per_member = (1 if any(declared) else 0) if requested is None else requested
    if per_member and declared and max(declared) < per_member:
        raise ParamsError(f"each member asks for {per_member} GPU(s), but no Dask worker declares that many "
                          f"(most: {max(declared):g}); start workers with `--resources GPU={per_member}`, or give "
                          f"--gpus-per-member 0")
    return per_member


@contextlib.contextmanager
def gpu_request(gpus_per_member: int) -> Iterator[None]:
    """Within it, a task submitted to Dask asks for `gpus_per_member` GPU resources (nothing for 0)."""
    if not gpus_per_member:
        yield
        return
    with dask.annotate(resources={GPU: gpus_per_member}):
        yield


# --- persisted results -----------------------------------------------------------------------------


def result_storage(location: str) -> Path | WritableFileSystem:
    """Where members' results persist: a local folder (a path or file://), or any fsspec URL (s3://bucket/prefix,
    gs://..., needing that filesystem's package, as the DVC remote does). Prefect takes a folder as a Path, and
    any other storage only as a block saved on its server (so that every worker can load it): saved here, named
    after the URL, which calls within a flow run can do."""
    if "://" not in location or location.startswith("file://"):
        return Path(location.removeprefix("file://")).expanduser().resolve()
    block = RemoteFileSystem(basepath=location)
    block.save(f"sweep-results-{hashlib.sha256(location.encode()).hexdigest()[:12]}", overwrite=True)
    return block


def working_tree_changes(root: Path) -> tuple[list[str], list[str]]:
    """The files of `root`'s working tree that differ from its commit: (modified or untracked, deleted)."""
    git_files = ["git", "ls-files", "-z", "--exclude-standard"]
    changed, deleted = (subprocess.run([*git_files, *which], cwd=root, check=True, capture_output=True,
                                       text=True).stdout.split("\0")
                        for which in (["--modified", "--others"], ["--deleted"]))
    return sorted(filter(None, changed)), sorted(filter(None, deleted))


def source_identity(root: Path) -> str:
    """What a member of a sweep started in `root` runs: the commit, and a digest of the uncommitted changes a
    member's workspace copies (the sweeps' own reports left out), so any edit to code or params changes it."""
    head = subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=root, capture_output=True,
                          text=True).stdout.strip() or "no-commit"
    changed, deleted = working_tree_changes(root)
    digest = hashlib.sha256()
    for name in changed:
        if not name.startswith(SWEEP_OUTPUTS) and (root / name).is_file():
            digest.update(f"changed {name}\0".encode() + (root / name).read_bytes() + b"\0")
    for name in deleted:
        digest.update(f"deleted {name}\0".encode())
    return f"{head}+{digest.hexdigest()[:16]}"


# The parameters of a member task that decide its result; the rest (workspace path, DVC remote, retries, GPUs)
# only say where and how it runs.
RESULT_INPUTS = ("sweep_name", "member", "overrides", "params_file", "pipeline", "source")


def member_cache_key(_context: Any, parameters: Mapping[str, Any]) -> str:
    """Prefect's cache key of a sweep member (a `cache_key_fn`): a digest of its RESULT_INPUTS."""
    inputs = {name: parameters.get(name) for name in RESULT_INPUTS}
    text = json.dumps(inputs, sort_keys=True, default=str)
    return f"sweep-member-{hashlib.sha256(text.encode()).hexdigest()[:32]}"


def persisted(member_task: Any, storage: Path | WritableFileSystem, refresh: bool = False) -> Any:
    """`member_task` (a Prefect task taking RESULT_INPUTS) with its results persisted to `storage` as JSON under
    member_cache_key, so that a finished member is read back instead of run; `refresh` runs every member anew
    (and overwrites what was stored)."""
    return member_task.with_options(persist_result=True, result_storage=storage, result_serializer="json",
                                    cache_key_fn=member_cache_key, refresh_cache=refresh)


def submit_members(member_task: Any, calls: Mapping[str, Mapping[str, Any]], gpus_per_member: int) -> dict[str, Any]:
    """Submit `member_task` once per member ({member: its keyword arguments}), each asking for its GPUs;
    {member: its Prefect future}."""
    with gpu_request(gpus_per_member):
        return {member: member_task.submit(**kwargs) for member, kwargs in calls.items()}


def task_runner_client(task_runner: Any) -> Any | None:
    """The Dask client of a flow run's task runner when it is a DaskTaskRunner, else None."""
    return task_runner.client if isinstance(task_runner, DaskTaskRunner) else None



def sweep_task_runner(address: str | None = None, workers: int | None = None, gpus_per_member: int | None = None,
                      gpus: Sequence[str] | None = None, threads_per_worker: int = 1) -> DaskTaskRunner:
    """A Dask cluster at `address` (or $DASK_SCHEDULER_ADDRESS, Dask's own setting), whose workers declare their
    GPU resources themselves; else a local_sweep_cluster, built when the flow starts (so importing the flows
    counts no GPUs)."""
    address = address or os.environ.get("DASK_SCHEDULER_ADDRESS")
    if address:
        return DaskTaskRunner(address=address)
    return DaskTaskRunner(cluster_class=local_sweep_cluster, cluster_kwargs={
        "workers": workers, "gpus_per_member": gpus_per_member, "gpus": None if gpus is None else list(gpus),
        "threads_per_worker": threads_per_worker})
