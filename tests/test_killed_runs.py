"""Killed runs: a `dvc repro`, or a Prefect flow run's worker, SIGKILLed mid-stage (the whole process group, as
an OOM kill or a lost node takes it), then run again, completes with the outputs of an uninterrupted run; and
two runs of the tiny pipeline in separate processes write byte-identical tables.

Two full runs in all, to keep this cheap: one uninterrupted repro is the reference of every comparison, and one
killed project is killed in finetune (dvc repro), resumed and killed in prune (dvc repro), resumed by the Prefect
flow and its worker killed in report, then run again by the flow to the end.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import yaml

from pipeline.files.atomic import remove_stale_scratch, staged_dir, write_bytes
from pipeline.files.schema import BENCHMARK_TIMINGS, TABLE_COLUMNS
from tests.tiny_project import STAGES, make_tiny_project, ran_stages, run, tiny_params, with_budgeted

pytestmark = pytest.mark.slow  # kills and reruns `dvc repro` and flow runs

EXPERIMENT = "tiny"
REPORTS = Path("reports") / EXPERIMENT
# The values that are wall-clock measurements, so no two runs agree on them: per file, the CSV columns or the
# JSON keys (at any depth) left out of the comparisons. Everything else is compared byte for byte.
TIMING = {
    REPORTS / "benchmark.csv": BENCHMARK_TIMINGS,
    REPORTS / "benchmark_budgeted.csv": BENCHMARK_TIMINGS,
    REPORTS / "benchmark.json": BENCHMARK_TIMINGS,
    REPORTS / "budgeted_curve.csv": {"seconds"},
    REPORTS / "prune_seconds.csv": {"seconds"},
    REPORTS / "budgeted.json": {"seconds"},  # a latency budget's per-layer timings
    REPORTS / "finetune.json": {"train_seconds"},
}
# The report renders the benchmark's timings, so it is checked against a render of the run's own tables.
REPORT_OUTS = [REPORTS / "report.md", REPORTS / "report.html", REPORTS / "figures"]
KILL_TIMEOUT_S = 600


def tables(root: Path) -> dict[str, object]:
    """Every table and summary of the run, and the pruned models' head lists: raw bytes, or with the TIMING
    values left out (CSV cells as the text written, JSON as parsed, which keeps every digit written)."""
    paths = sorted([*(root / REPORTS).glob("*.csv"), *(root / REPORTS).glob("*.json"),
                    *(root / "artifacts" / EXPERIMENT / "pruned").glob("*/head_pruning.json")])
    found: dict[str, object] = {}
    for path in paths:
        relative = path.relative_to(root)
        timing = TIMING.get(relative)
        if timing is None:
            found[str(relative)] = path.read_bytes()
        elif path.suffix == ".csv":
            rows = list(csv.DictReader(io.StringIO(path.read_text())))
            # The timing columns this table must have (tokens_per_s is translation's).
            required = timing & set(TABLE_COLUMNS.get(relative.name, timing))
            assert rows and required <= set(rows[0]), f"{relative}: timing columns renamed?"
            found[str(relative)] = [{k: v for k, v in row.items() if k not in timing} for row in rows]
        else:
            found[str(relative)] = _without_keys(json.loads(path.read_text()), timing)
    return found


def _without_keys(value: object, keys: set[str]) -> object:
    if isinstance(value, dict):
        return {k: _without_keys(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [_without_keys(v, keys) for v in value]
    return value


def out_hashes(root: Path) -> dict[str, str]:
    """The md5 that dvc.lock records of every output (models and data too), but those that hold timings."""
    skipped = {str(p) for p in [*TIMING, *REPORT_OUTS]}
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    return {out["path"]: out["md5"] for stage in lock.values() for out in stage.get("outs", [])
            if out["path"] not in skipped}


def locked_stages(root: Path) -> set[str]:
    lock = root / "dvc.lock"
    return set(yaml.safe_load(lock.read_text())["stages"]) if lock.exists() else set()


def scratch_left(root: Path) -> list[Path]:
    """Staging files and folders of pipeline/files/atomic.py anywhere in the outputs."""
    return [p for top in ("artifacts", "reports") for p in (root / top).rglob(".*")
            if p.name.endswith((".tmp", ".old"))]


def stage_process(leader: int, stage: str) -> psutil.Process | None:
    """The process running `python -m stages.<stage>` among `leader`'s descendants, if it has started."""
    try:
        children = psutil.Process(leader).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for child in children:
        try:
            if f"stages.{stage}" in child.cmdline():
                return child
        except psutil.NoSuchProcess:
            continue
    return None


def kill_midway(cmd: list[str], root: Path, stage: str, ready: Callable[[psutil.Process], bool],
                env: dict[str, str] | None = None) -> str:
    """Start `cmd` in its own process group, wait until `stage`'s process runs and `ready(process)` holds, then
    SIGKILL the whole group (the command, DVC, the stage). Returns what the command printed."""
    from tests.tiny_project import tool_env

    with tempfile.TemporaryFile("w+") as output:
        process = subprocess.Popen(cmd, cwd=root, env=tool_env(env), stdout=output, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            deadline = time.monotonic() + KILL_TIMEOUT_S
            while True:
                stage_run = stage_process(process.pid, stage)
                if stage_run is not None and ready(stage_run):
                    break
                if process.poll() is not None or time.monotonic() > deadline:
                    output.seek(0)
                    pytest.fail(f"{' '.join(cmd)} ended (rc {process.returncode}) before {stage} could be killed "
                                f"midway:\n{output.read()[-3000:]}")
                time.sleep(0.05)
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        assert process.returncode == -signal.SIGKILL
        output.seek(0)
        return output.read()


def running_for(seconds: float) -> Callable[[psutil.Process], bool]:
    return lambda process: time.time() - process.create_time() >= seconds


def exists(path: Path) -> Callable[[psutil.Process], bool]:
    return lambda _: path.exists()


def rendered_report(root: Path, into: Path) -> dict[str, bytes]:
    """report.md, report.html and the figures, rendered afresh from the tables in `root`'s reports folder."""
    from pipeline.report.build import build_report

    shutil.copytree(root / REPORTS, into, ignore=shutil.ignore_patterns("report.*", "figures"))
    build_report(into)  # titled as stages/report.py titles it, from finetune.json
    return report_files(into, Path("."))


def report_files(root: Path, reports: Path = REPORTS) -> dict[str, bytes]:
    folder = root / reports
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in [folder / "report.md", folder / "report.html", *sorted((folder / "figures").glob("*"))]}


@pytest.fixture(scope="module")
def params() -> dict:
    # The budgeted methods on, so the budgeted models and the `seconds` of prune.json are compared too.
    return with_budgeted(tiny_params())


@pytest.fixture(scope="module")
def reference(tiny_reproduced) -> Path:
    """One uninterrupted `dvc repro` of the same params (conftest.py; its untouched copy)."""
    return tiny_reproduced[1]


FLOW = [sys.executable, "-m", "pipeline.flows", "experiment", "--retries", "0"]  # no retry may hide a failure


@pytest.fixture(scope="module")
def resumed(tmp_path_factory, params, prefect_home) -> tuple[Path, dict[str, dict]]:
    """A project whose `dvc repro` is killed in finetune, then (resuming) in prune, then whose Prefect flow run is
    killed in report, and whose flow is run again to the end; with what each kill left and what each run did.
    The flow runs as `python -m pipeline.flows` does on a worker: the process a process worker starts for a flow
    run, or a Kubernetes job's, and its kill takes its `dvc repro` and the stage with it (the process group)."""
    root = make_tiny_project(tmp_path_factory.mktemp("killed"), params=params)
    reports, pruned = root / REPORTS, root / "artifacts" / EXPERIMENT / "pruned"
    kills = {
        "finetune": (["dvc", "repro"], running_for(1.0)),  # in its imports or training: nothing of it written yet
        "prune": (["dvc", "repro"], exists(pruned)),  # the first pruned model being saved, the curves not yet
        "report": (FLOW, exists(reports / "figures")),  # while it writes the figures
    }
    evidence = {}
    for stage, (cmd, ready) in kills.items():
        output = kill_midway(cmd, root, stage, ready)
        evidence[stage] = {"started": ran_stages(output), "locked": locked_stages(root), "pruned": pruned.exists(),
                           "curve": (reports / "pruning_curve.csv").exists(), "output": output}
    output = run(FLOW, root)
    evidence["end"] = {"started": ran_stages(output), "output": output}
    return root, evidence


def test_a_run_killed_midway_through_finetune_prune_and_report_reruns_to_identical_outputs(reference, resumed):
    root, evidence = resumed
    # Each kill landed mid-stage (the stage had started, DVC had recorded all before it but not it), and each
    # run after a kill started again at the killed stage.
    killed = ["finetune", "prune", "report"]
    for stage in killed:
        assert evidence[stage]["locked"] == set(STAGES[:STAGES.index(stage)]), f"{stage} was not killed mid-stage"
    assert evidence["finetune"]["started"] == STAGES[:STAGES.index("finetune") + 1]
    assert evidence["prune"]["started"] == STAGES[STAGES.index("finetune"):STAGES.index("prune") + 1]
    assert evidence["report"]["started"] == STAGES[STAGES.index("prune"):]
    assert evidence["prune"]["pruned"] and not evidence["prune"]["curve"]  # part of prune's outputs written
    # A SIGKILLed dvc leaves its entries in .dvc/tmp/rwlock; the next dvc drops those of pids that no longer run
    # (its repo lock is an flock, gone with the process), so nothing needs removing by hand.
    assert "had been killed. Auto removed it from the lock file" in evidence["prune"]["output"]
    assert "up to date" in run(["dvc", "status"], root).lower()
    assert out_hashes(root) == out_hashes(reference)  # the models and data too, not only the tables
    assert tables(root) == tables(reference)
    with tempfile.TemporaryDirectory() as scratch:
        assert report_files(root) == rendered_report(root, Path(scratch) / "reports")
    assert scratch_left(root) == []


def test_two_runs_of_the_tiny_pipeline_in_separate_processes_write_byte_identical_tables(reference, resumed):
    """The killed project's stages each ran in processes of their own, none shared with the reference's."""
    ours, theirs = tables(resumed[0]), tables(reference)
    assert "reports/tiny/importance.csv" in ours and any(name.endswith("head_pruning.json") for name in ours)
    assert sorted(ours) == sorted(theirs)
    for name in ours:
        assert ours[name] == theirs[name], name


def test_a_flow_run_whose_worker_is_killed_mid_stage_completes_when_run_again(reference, resumed):
    root, evidence = resumed
    killed, rerun = evidence["report"], evidence["end"]
    assert killed["locked"] == set(STAGES[:-1])  # mid-report: every stage before it recorded, not it
    assert "report: ran" in rerun["output"] and rerun["started"] == ["report"]
    assert all(f"{stage}: up to date" in rerun["output"] for stage in STAGES[:-1])
    assert "up to date" in run(["dvc", "status"], root).lower()
    assert tables(root) == tables(reference)
    with tempfile.TemporaryDirectory() as scratch:
        assert report_files(root) == rendered_report(root, Path(scratch) / "reports")


def test_a_write_removes_what_killed_writers_of_its_target_left_and_spares_live_ones(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    target = tmp_path / "finetuned"
    stale = [target.with_name(f".finetuned.{dead.pid}.0123456789ab.tmp"),
             target.with_name(f".finetuned.{dead.pid}.0123456789ab.old")]
    live = target.with_name(f".finetuned.{os.getpid()}.ba9876543210.tmp")  # a writer that still runs
    other = target.with_name(f".finetuned-2.{dead.pid}.0123456789ab.tmp")  # another target's
    for folder in (*stale, live, other):
        (folder / "model.safetensors").parent.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"half")
    with staged_dir(target) as staging:
        (staging / "model.safetensors").write_bytes(b"whole")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["finetuned", live.name, other.name])
    # A temp file named as before the random part was added is scratch too.
    stale_files = [tmp_path / f".table.csv.{dead.pid}.0123456789ab.tmp", tmp_path / f".table.csv.{dead.pid}.tmp"]
    for stale_file in stale_files:
        stale_file.write_text("half")
    write_bytes(tmp_path / "table.csv", b"whole\n")
    assert not any(p.exists() for p in stale_files) and (tmp_path / "table.csv").read_bytes() == b"whole\n"
    assert remove_stale_scratch(tmp_path / "table.csv") == []
