"""Sweeps that place work: members ask Dask for GPUs as a worker resource and see only their worker's, and each
finished member's result persists so that a rerun runs only the members that did not finish.

The flow tests run the real `sweep` flow (validation, workspaces, the Dask cluster, resources, persistence) with
the one thing that takes minutes, the DVC experiment of a member, replaced by a recorder that sleeps briefly."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import pandas as pd
import pytest
import yaml

from pipeline.config.params import ParamsError
from pipeline.flows import dvc_flows as flows
from pipeline.flows import placement
from tests.tiny_project import ROOT, commit_all, run, tiny_params

SLEEP_S = 1.0


# --- placement and keys, without Prefect ----------------------------------------------------------------


def test_gpus_are_cut_into_disjoint_groups_and_too_few_is_one_clear_error():
    assert placement.gpu_slots(["0", "1", "2", "3", "4"], 2) == [["0", "1"], ["2", "3"]]
    assert placement.gpu_slots(["GPU-a", "GPU-b"], 1) == [["GPU-a"], ["GPU-b"]]
    with pytest.raises(ParamsError, match=r"2 GPU\(s\) per member, but this machine has 1"):
        placement.gpu_slots(["0"], 2)
    with pytest.raises(ParamsError, match="give 0"):
        placement.gpu_slots(["0"], -1)


def test_members_ask_for_one_gpu_when_the_cluster_has_some_and_a_request_no_worker_meets_fails_first():
    assert placement.resolve_gpus_per_member(None, [1, 1]) == 1
    assert placement.resolve_gpus_per_member(None, [0, 0]) == 0
    assert placement.resolve_gpus_per_member(None, []) == 0
    assert placement.resolve_gpus_per_member(2, []) == 2  # no worker up yet (an adaptive cluster): trusted
    with pytest.raises(ParamsError, match=r"no Dask worker declares that many \(most: 1\)"):
        placement.resolve_gpus_per_member(2, [1, 1])


def test_the_local_cluster_gives_each_worker_its_own_gpus_as_its_declared_resource():
    with placement.local_sweep_cluster(gpus_per_member=1, gpus=["3", "5"]) as cluster:
        workers = cluster.scheduler_info["workers"].values()
        assert sorted((w["name"], w["resources"]) for w in workers) == [
            ("gpus:3", {"GPU": 1}), ("gpus:5", {"GPU": 1})]
    with placement.local_sweep_cluster(workers=3, gpus_per_member=0, gpus=["0"]) as cluster:
        assert [w["resources"] for w in cluster.scheduler_info["workers"].values()] == [{}, {}, {}]


def test_a_members_key_changes_with_what_decides_its_result_and_not_with_where_it_runs():
    base = {"sweep_name": "s", "member": "m", "overrides": {"seed": 1}, "params_file": None,
            "pipeline": "dvc.yaml", "source": "abc+123", "workspace": "/a", "dvc_remote": None, "retries": 2,
            "gpus_per_member": 1}
    key = placement.member_cache_key(None, base)
    for moved in ({"workspace": "/b"}, {"dvc_remote": "s3://x"}, {"retries": 0}, {"gpus_per_member": 0}):
        assert placement.member_cache_key(None, {**base, **moved}) == key
    for changed in ({"sweep_name": "t"}, {"member": "n"}, {"overrides": {"seed": 2}}, {"pipeline": "mt/dvc.yaml"},
                    {"params_file": "experiments/x.yaml"}, {"source": "abc+124"}):
        assert placement.member_cache_key(None, {**base, **changed}) != key


def test_the_source_identity_follows_uncommitted_edits_but_not_the_sweeps_own_reports(tmp_path):
    (tmp_path / "code.py").write_text("x = 1\n")
    run(["git", "init", "-q"], tmp_path)
    commit_all(tmp_path, "code")
    committed = placement.source_identity(tmp_path)
    (tmp_path / "reports" / "sweeps" / "s").mkdir(parents=True)
    (tmp_path / "reports" / "sweeps" / "s" / "comparison.csv").write_text("member\n")
    assert placement.source_identity(tmp_path) == committed
    (tmp_path / "code.py").write_text("x = 2\n")
    edited = placement.source_identity(tmp_path)
    assert edited != committed
    (tmp_path / "new.py").write_text("")
    assert placement.source_identity(tmp_path) != edited
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "new.py").unlink()
    assert placement.source_identity(tmp_path) == committed
    (tmp_path / "more.py").write_text("")
    commit_all(tmp_path, "more")
    assert placement.source_identity(tmp_path).split("+")[0] != committed.split("+")[0]  # a new commit


def test_results_go_to_a_local_folder_given_as_a_path_or_a_file_url(tmp_path):
    assert placement.result_storage(str(tmp_path / "r")) == tmp_path / "r"
    assert placement.result_storage(f"file://{tmp_path}/r") == tmp_path / "r"
    # Any other URL becomes a block saved on the Prefect server: the GPU test below persists to memory://.


def test_asking_for_more_gpus_than_the_machine_has_is_one_line_before_prefect_starts(monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    with pytest.raises(SystemExit) as exit_:
        flows.main(["sweep", "s", "-m", "seed=1", "--gpus-per-member", "2"])
    assert str(exit_.value) == ("error: 2 GPU(s) per member, but this machine has 1; give --gpus-per-member 0 "
                                "for CPU members")


# --- the sweep flow on a local Dask cluster ---------------------------------------------------------------


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A committed git + DVC repository with valid params: all a sweep reads before its members run."""
    root = tmp_path_factory.mktemp("project")
    (root / "params.yaml").write_text(yaml.safe_dump(tiny_params(), sort_keys=False))
    (root / ".gitignore").write_text(".sweeps/\n")
    run(["git", "init", "-q"], root)
    run(["dvc", "init", "-q"], root)
    commit_all(root, "params")
    return root


@pytest.fixture
def recorded(monkeypatch, tmp_path) -> Path:
    """Each member's experiment, replaced: it records (member, worker, GPUs, start, end, the resources its Dask
    task was restricted to) to a file per execution, sleeps, and fails while a file `fail-<member>` exists."""
    records = tmp_path / "records"
    records.mkdir()

    def fake_experiment(overrides, workspace, pipeline, dvc_remote, retries, params_file=None, env=None):
        from distributed import get_worker

        worker = get_worker()
        member = Path(workspace).name
        start = time.time()
        time.sleep(SLEEP_S)
        end = time.time()
        if (records / f"fail-{member}").exists():
            raise flows.StageFailed(f"{member}: simulated failure midway")
        restrictions = worker.state.tasks[worker.get_current_task()].resource_restrictions
        record = {"member": member, "worker": str(worker.name), "gpus": env["CUDA_VISIBLE_DEVICES"],
                  "start": start, "end": end, "resources": restrictions}
        (records / f"{member}-{time.time_ns()}.json").write_text(json.dumps(record))
        return {"workspace": workspace, "stages": [{"stage": "prepare", "status": "ran", "seconds": SLEEP_S}],
                "metrics": {"finetune.test": overrides.get("seed", 0) / 10}}

    monkeypatch.setattr(flows, "experiment", fake_experiment)
    return records


def executions(records: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(records.glob("*.json"))]


@pytest.mark.slow  # starts Prefect's ephemeral server (about 15 s here)
@pytest.mark.usefixtures("prefect_home")
def test_two_sweep_members_never_share_a_gpu_and_at_most_two_run_at_once(project, recorded):
    # Two threads per worker: only the GPU resource, not the thread count, keeps a second member off a held GPU.
    runner = placement.sweep_task_runner(gpus_per_member=1, gpus=["0", "1"], threads_per_worker=2)
    members = {f"seed-{i}": {"seed": i} for i in range(5)}
    results = f"memory://placement-{time.time_ns()}"  # an fsspec URL: results persist through a saved block
    table = pd.read_csv(flows.sweep.with_options(task_runner=runner)(members, "gpus", str(project),
                                                                     results=results))
    assert list(table.member) == list(members)
    assert len(fsspec.filesystem("memory").ls(results)) == len(members)
    runs = executions(recorded)
    assert sorted(r["member"] for r in runs) == sorted(members)
    for r in runs:
        assert r["resources"] == {"GPU": 1}  # the annotation reached the scheduler
        assert r["worker"] == f"gpus:{r['gpus']}"  # the member sees its own worker's GPU, and only it
    for a, b in itertools.combinations(runs, 2):
        if a["start"] < b["end"] and b["start"] < a["end"]:
            assert a["gpus"] != b["gpus"], (a, b)
    edges = sorted([(r["start"], 1) for r in runs] + [(r["end"], -1) for r in runs], key=lambda e: (e[0], e[1]))
    assert max(itertools.accumulate(step for _, step in edges)) <= 2
    assert {r["gpus"] for r in runs} == {"0", "1"}


@pytest.mark.slow  # starts Prefect's ephemeral server (about 15 s here)
@pytest.mark.usefixtures("prefect_home")
def test_a_rerun_sweep_skips_the_members_that_finished_and_runs_the_one_that_failed(project, recorded, tmp_path):
    members = {"seed-1": {"seed": 1}, "seed-2": {"seed": 2}, "seed-3": {"seed": 3}}
    results = tmp_path / "results"

    def sweep(**options) -> Path:
        runner = placement.sweep_task_runner(workers=2, gpus_per_member=0)
        return Path(flows.sweep.with_options(task_runner=runner)(members, "resume", str(project),
                                                                 results=str(results), **options))

    (recorded / "fail-seed-2").touch()
    failed = r"1 of 3 sweep members failed \(seed-2\).*seed-2: simulated failure midway"
    with pytest.raises(flows.StageFailed, match=failed):
        sweep()
    assert sorted(r["member"] for r in executions(recorded)) == ["seed-1", "seed-3"]
    # The failed member persisted no result (Prefect keeps its exception under a random name, never read back).
    assert len(list(results.glob("sweep-member-*"))) == 2

    (recorded / "fail-seed-2").unlink()
    table = pd.read_csv(sweep())
    assert sorted(r["member"] for r in executions(recorded)) == ["seed-1", "seed-2", "seed-3"]  # only seed-2 ran
    assert list(table["finetune.test"]) == [0.1, 0.2, 0.3]  # the skipped members' metrics, read back
    assert table.stages_ran.tolist() == [1, 1, 1]

    sweep()
    assert len(executions(recorded)) == 3  # all finished: nothing runs
    sweep(refresh=True)
    assert len(executions(recorded)) == 6


KILLED_SWEEP = """
import sys, time
from pathlib import Path
from pipeline.flows import dvc_flows as flows, placement

project, records, results = sys.argv[1:4]

def experiment(overrides, workspace, *args, **kwargs):
    (Path(records) / f"{Path(workspace).name}-{time.time_ns()}").touch()
    time.sleep(3)
    return {"workspace": workspace, "stages": [], "metrics": {"finetune.test": overrides["seed"] / 10}}

flows.experiment = experiment
members = {f"seed-{i}": {"seed": i} for i in range(3)}
runner = placement.sweep_task_runner(workers=1, gpus_per_member=0)
flows.sweep.with_options(task_runner=runner)(members, "killed", project, results=results)
"""


@pytest.mark.slow  # runs two sweeps in processes of their own
@pytest.mark.usefixtures("prefect_home")
def test_a_sweep_killed_midway_reruns_only_the_members_whose_results_were_not_persisted(project, tmp_path):
    """The sweep runs in a process of its own, killed (SIGKILL, its whole process group) once a member has
    persisted its result and the next is midway; a second process reruns the sweep. One member at a time.
    Both talk to this module's ephemeral API server, which the kill does not touch (and which a busy machine
    would otherwise start twice more)."""
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()  # the module's own, as Prefect's ephemeral mode uses it
    server.start(timeout=300)
    script, records, results = tmp_path / "sweep.py", tmp_path / "records", tmp_path / "results"
    script.write_text(KILLED_SWEEP)
    records.mkdir()
    env = {**os.environ, "PREFECT_API_URL": server.api_url, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(script), str(project), str(records), str(results)]
    source = placement.source_identity(project)
    keys = {f"seed-{i}": placement.member_cache_key(None, {
        "sweep_name": "killed", "member": f"seed-{i}", "overrides": {"seed": i}, "params_file": None,
        "pipeline": "dvc.yaml", "source": source}) for i in range(3)}

    def started() -> dict[str, int]:
        return {m: len(list(records.glob(f"{m}-*"))) for m in keys}

    log = tmp_path / "first.log"
    with log.open("w") as out:
        first = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (results.is_dir() and any(results.glob("sweep-member-*")) and sum(started().values()) == 2):
            assert first.poll() is None, f"the sweep ended before it was killed:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "no member finished in 300 s"
            time.sleep(0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    finished = {m for m, key in keys.items() if (results / key).exists()}
    midway = {m for m, n in started().items() if n} - finished
    assert len(finished) == 1 and len(midway) == 1

    subprocess.run(command, env=env, check=True, capture_output=True, timeout=300)
    counts = started()
    assert all(counts[m] == 1 for m in finished)  # not run again
    assert all(counts[m] == 2 for m in midway)  # killed midway: its result never persisted, so it ran again
    assert all(counts[m] == 1 for m in set(keys) - finished - midway)
    assert all((results / key).exists() for key in keys.values())


# --- GPU work pools ---------------------------------------------------------------------------------------


def test_gpu_deployments_carry_a_concurrency_limit_that_queues_the_excess_and_gpu_workers_declare_their_gpu():
    from prefect.cli.deploy._models import PrefectYamlModel

    text = (ROOT / "prefect.yaml").read_text()
    declared = PrefectYamlModel.model_validate(yaml.safe_load(text))  # as `prefect deploy` reads it
    on_gpus = {d.name: d for d in declared.deployments if d.work_pool and d.work_pool.name == "gpu"}
    assert set(on_gpus) == {"gpu-experiment", "gpu-sweep"}
    for deployment in on_gpus.values():
        assert deployment.concurrency_limit.limit >= 1
        assert deployment.concurrency_limit.collision_strategy == "ENQUEUE"  # waits its turn, not cancelled
    assert on_gpus["gpu-sweep"].parameters["gpus_per_member"] == 1
    assert re.search(r"prefect work-pool set-concurrency-limit gpu \d+", text)  # the pool's own limit

    manifest = yaml.safe_load((ROOT / "deploy" / "dask-gpu-workers.yaml").read_text())
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[args.index("--resources") + 1] == "GPU=1" == f"GPU={container['resources']['limits']['nvidia.com/gpu']}"
    assert args[args.index("--nthreads") + 1] == "1"
