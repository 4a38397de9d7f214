"""The Prefect flows over the DVC pipeline, run in-process with real Prefect (ephemeral, no server):
overrides, a sweep on a Dask LocalCluster, sharded ablation, retries and failures, and a DVC remote.

DVC is the cache of record: whatever a flow run did, `dvc status` agrees with, and the reverse."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from pipeline.config.params import ParamsError
from pipeline.flows import dvc_flows as flows
from tests.tiny_project import ROOT, STAGES, commit_all, make_tiny_project, run

# slow: runs the Prefect flows over the tiny pipeline
pytestmark = [pytest.mark.usefixtures("prefect_home"), pytest.mark.slow]


@pytest.fixture(scope="module")
def done(tmp_path_factory) -> Path:
    """A committed tiny project after a plain `dvc repro`."""
    root = make_tiny_project(tmp_path_factory.mktemp("project"))
    commit_all(root, "tiny project")
    run(["dvc", "repro"], root)
    return root


def statuses(result: dict) -> dict[str, str]:
    return {r["stage"]: r["status"] for r in result["stages"]}


# --- params overrides -------------------------------------------------------------------------------


def test_overrides_parse_like_dvc_exp_run_set():
    assert flows.parse_overrides(["prune.step=0.05", "seed=1", "data.text_pair_column=null"]) == {
        "prune.step": 0.05, "seed": 1, "data.text_pair_column": None}
    with pytest.raises(ParamsError, match="expected KEY=VALUE"):
        flows.parse_overrides(["prune.step"])


def test_overrides_keep_comments_and_are_validated_before_anything_is_written(tmp_path):
    params = tmp_path / "params.yaml"
    shutil.copy(ROOT / "params.yaml", params)
    before = params.read_text()
    flows.apply_overrides(params, {"prune.step": 0.05, "seed": 3})
    after = params.read_text()
    assert "# per-layer L2 normalisation" in after  # comments survive, as with `dvc exp run -S`
    assert "text_pair_column: null" in after
    loaded = yaml.safe_load(after)
    assert loaded["prune"]["step"] == 0.05 and loaded["seed"] == 3
    assert after.count("\n") == before.count("\n")
    for bad, message in [({"prune.stepp": 0.1}, "prune.stepp"), ({"prune.step": "big"}, "prune.step"),
                         ({"nosuch.step": 1}, "no section 'nosuch'")]:
        with pytest.raises(ParamsError, match=message):
            flows.apply_overrides(params, bad)
        assert params.read_text() == after
    mtime = params.stat().st_mtime_ns
    flows.apply_overrides(params, {"seed": 3})  # no change: the file is not rewritten
    assert params.stat().st_mtime_ns == mtime


def test_stage_status_comes_from_what_dvc_printed():
    assert flows.stage_status("Running stage 'prune':\n> python -m stages.prune", "prune") == "ran"
    assert flows.stage_status("Stage 'prepare' is cached - skipping run, checking out outputs", "prepare") == \
        "restored"
    assert flows.stage_status("Stage 'mt/dvc.yaml:score' didn't change, skipping", "mt/dvc.yaml:score") == \
        "up to date"
    with pytest.raises(flows.StageFailed):
        flows.stage_status("Running stage 'prepare':", "prune")


def test_pipeline_stages_in_file_order_with_dvc_addresses():
    assert flows.pipeline_stages(ROOT) == STAGES
    mt = flows.pipeline_stages(ROOT, "mt/dvc.yaml")
    assert mt[0] == "mt/dvc.yaml:prepare" and mt[-1] == "mt/dvc.yaml:report"


# --- workspaces ------------------------------------------------------------------------------------


def test_a_workspace_is_the_working_tree_sharing_the_cache_and_replaces_the_old_one_only_when_complete(
        tmp_path, monkeypatch):
    root = tmp_path / "project"
    root.mkdir()
    run(["git", "init", "-q"], root)
    run(["dvc", "init", "-q"], root)
    for name in ("kept.txt", "edited.txt", "deleted.txt"):
        (root / name).write_text(f"{name} as committed\n")
    commit_all(root, "project")
    (root / "edited.txt").write_text("edited, not committed\n")
    (root / "deleted.txt").unlink()
    (root / "new" / "untracked.txt").parent.mkdir()
    (root / "new" / "untracked.txt").write_text("not yet added\n")
    dest = tmp_path / "sweeps" / "member"

    assert flows.make_workspace(root, dest) == dest
    assert (dest / "kept.txt").read_text() == "kept.txt as committed\n"
    assert (dest / "edited.txt").read_text() == "edited, not committed\n"
    assert (dest / "new" / "untracked.txt").read_text() == "not yet added\n"
    assert not (dest / "deleted.txt").exists()
    cache = run(["dvc", "cache", "dir"], root).strip().splitlines()[-1]
    assert run(["dvc", "cache", "dir"], dest).strip().splitlines()[-1] == cache

    (dest / "left by a run.txt").write_text("the old workspace's\n")
    real = flows.run_dvc

    def killed_before_the_cache_is_shared(args, cwd, env=None):
        if args[:3] == ["cache", "dir", "--local"]:
            raise KeyboardInterrupt  # as a kill would, after the clone and the copies
        return real(args, cwd, env)

    monkeypatch.setattr(flows, "run_dvc", killed_before_the_cache_is_shared)
    with pytest.raises(KeyboardInterrupt):
        flows.make_workspace(root, dest)
    assert (dest / "left by a run.txt").exists()  # the previous workspace, whole
    assert sorted(p.name for p in dest.parent.iterdir()) == ["member"]  # no half-built one beside it
    monkeypatch.setattr(flows, "run_dvc", real)
    flows.make_workspace(root, dest)
    assert not (dest / "left by a run.txt").exists() and (dest / "edited.txt").exists()


# --- runs ------------------------------------------------------------------------------------------


def test_an_ephemeral_flow_run_skips_what_dvc_repro_did(done):
    run(["dvc", "repro", "--force", "--single-item", "report"], done)  # work done outside Prefect
    result = flows.experiment(workspace=str(done))
    assert set(statuses(result).values()) == {"up to date"}
    assert result["metrics"]["finetune.test"] > 0


def test_a_dvc_remote_lets_a_fresh_clone_restore_instead_of_recompute(done, tmp_path):
    remote = tmp_path / "remote"
    flows.experiment(workspace=str(done), dvc_remote=str(remote))  # pushes outputs and the run-cache
    # Another machine: a clone of the committed project (no dvc.lock, no results) with a cache of its
    # own, so every stage must come from the remote's cache and run-cache.
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(done), str(clone)], check=True)
    assert not (clone / "dvc.lock").exists()
    result = flows.experiment(workspace=str(clone), dvc_remote=str(remote))
    # The report's markdown and HTML live in git, not the cache, so it alone re-renders (seconds).
    restored = statuses(result)
    assert restored.pop("report") == "ran"
    assert set(restored.values()) <= {"restored", "up to date"}, restored
    assert (clone / "artifacts" / "tiny" / "finetuned").is_dir()
    assert "up to date" in run(["dvc", "status"], clone).lower()


def test_sweep_on_a_dask_local_cluster_gives_one_row_per_member(done):
    members = {"step-0.25": {"prune.step": 0.25}, "step-0.5": {"prune.step": 0.5, "prune.max_fraction": 0.5}}
    runner = flows.sweep_task_runner(workers=2)
    table_path = flows.sweep.with_options(task_runner=runner)(members, "steps", str(done))
    table = pd.read_csv(table_path)
    assert list(table.member) == list(members) and "finetune.test" in table
    assert table.loc[0, "stages_ran"] == 0  # the project's own settings: all restored from the shared cache
    assert 0 < table.loc[1, "stages_ran"] < len(STAGES)  # only prune and what follows reran
    assert (done / "reports" / "sweeps" / "steps" / "comparison.md").read_text().startswith("| member")
    assert table.loc[0, "finetune.test"] == table.loc[1, "finetune.test"]


def test_sharded_ablation_equals_the_serial_one(done, tmp_path):
    serial = (done / "reports" / "tiny" / "ablation.csv").read_bytes()
    serial_one_head = (done / "reports" / "tiny" / "one_head.csv").read_bytes()
    env = {**os.environ, "ABLATE_WORKERS": "2", "TQDM_DISABLE": "1"}
    subprocess.run([sys.executable, "-m", "stages.ablate"], cwd=done, env=env, check=True, capture_output=True)
    assert (done / "reports" / "tiny" / "ablation.csv").read_bytes() == serial
    assert (done / "reports" / "tiny" / "one_head.csv").read_bytes() == serial_one_head


def test_a_stage_that_fails_once_is_retried_and_the_flow_completes(done, monkeypatch):
    real, calls = flows.run_dvc, []

    def flaky(args, cwd, env=None):
        calls.append(args[-1])
        if args[0] == "repro" and args[-1] == "score" and calls.count("score") == 1:
            raise flows.StageFailed("connection reset by peer (simulated transient failure)")
        return real(args, cwd, env)

    monkeypatch.setattr(flows, "run_dvc", flaky)
    result = flows.experiment(workspace=str(done), retries=1)
    assert calls.count("score") == 2 and set(statuses(result).values()) == {"up to date"}


def test_a_stage_that_keeps_failing_fails_the_flow_with_its_error_and_writes_nothing(done, tmp_path):
    workspace = flows.make_workspace(done, tmp_path / "broken")
    run(["dvc", "checkout"], workspace)
    (workspace / "data.csv").unlink()
    lock_before = (workspace / "dvc.lock").read_text()
    with pytest.raises(flows.StageFailed) as failure:
        flows.experiment(overrides={"data.max_length": 15}, workspace=str(workspace), retries=1)
    headline = str(failure.value).splitlines()[0]
    assert "dvc repro --single-item prepare" in headline and "data.source: no file or folder data.csv" in headline
    assert not (workspace / "artifacts" / "tiny" / "data").exists()  # DVC removed the old; nothing half-new
    assert (workspace / "dvc.lock").read_text() == lock_before
