"""The flows deployed for real: a local Prefect server and a process worker on loopback run the
experiment deployment of prefect.yaml; the Kubernetes GPU deployment renders a GPU job."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.tiny_project import ROOT, STAGES, commit_all, make_tiny_project, ran_stages, run

# slow: starts a Prefect server and a worker that runs the tiny pipeline
pytestmark = [pytest.mark.usefixtures("prefect_home"), pytest.mark.slow]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = make_tiny_project(tmp_path_factory.mktemp("project"), extra_files=("prefect.yaml",))
    commit_all(root, "tiny project")
    return root


def output_mtimes(root: Path) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime for folder in ("artifacts", "reports")
            for p in (root / folder).rglob("*") if p.is_file()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prefect(args: list[str], cwd: Path, env: dict) -> str:
    result = subprocess.run([str(BIN / "prefect"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"prefect {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def wait_for_run(api: str, flow_run_id: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run_info = httpx.get(f"{api}/flow_runs/{flow_run_id}").json()
        if run_info["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return run_info
        time.sleep(2)
    raise AssertionError(f"flow run {flow_run_id} not finished after {timeout} s")


def stop(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A Prefect server on loopback (its own SQLite database), stopped after the module."""
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_API_URL": api, "PREFECT_UI_ENABLED": "false",
           "PREFECT_PATH": str(BIN), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    log = (tmp_path_factory.mktemp("server") / "server.log").open("w")
    process = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                               env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, Path(log.name).read_text()
            time.sleep(1)
        yield api, env
    finally:
        stop(process)
        log.close()


def test_deployment_on_a_process_worker_runs_every_stage_once_and_dvc_agrees(project, server, tmp_path):
    api, env = server
    env = {**env, "PWD": str(project)}  # what a shell in the project sets; prefect.yaml's pull step reads it
    prefect(["work-pool", "create", "local", "--type", "process"], project, env)
    prefect(["--no-prompt", "deploy", "--name", "local-experiment"], project, env)
    worker = subprocess.Popen([str(BIN / "prefect"), "worker", "start", "--pool", "local", "--type", "process"],
                              cwd=tmp_path, env=env, stdout=(tmp_path / "worker.log").open("w"),
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def trigger() -> dict:
            out = prefect(["deployment", "run", "experiment/local-experiment", "--param", 'overrides={"seed": 0}'],
                          project, env)
            flow_run_id = next(line.split()[-1] for line in out.splitlines() if "UUID" in line)
            return wait_for_run(api, flow_run_id, timeout=900)

        first = trigger()
        assert first["state"]["type"] == "COMPLETED", (tmp_path / "worker.log").read_text()[-5000:]
        assert (project / "reports" / "tiny" / "report.html").exists()
        assert "up to date" in run(["dvc", "status"], project).lower()
        assert ran_stages(run(["dvc", "repro"], project)) == []
        task_runs = httpx.post(f"{api}/task_runs/filter", json={
            "flow_runs": {"id": {"any_": [first["id"]]}}}).json()
        assert sorted(t["name"] for t in task_runs) == sorted(STAGES)
        logs = httpx.post(f"{api}/logs/filter", json={"logs": {"flow_run_id": {"any_": [first["id"]]}}}).json()
        assert any("Running stage 'finetune'" in entry["message"] for entry in logs)  # stage output in Prefect

        before = output_mtimes(project)
        second = trigger()
        assert second["state"]["type"] == "COMPLETED"
        assert output_mtimes(project) == before  # nothing recomputed, nothing rewritten
    finally:
        stop(worker)


def test_kubernetes_gpu_deployment_renders_a_gpu_job_with_image_and_remote(project, server, monkeypatch):
    api, env = server
    prefect(["work-pool", "create", "gpu", "--type", "kubernetes", "--base-job-template",
             str(ROOT / "deploy" / "kubernetes-gpu-pool.json")], project, env)
    gpu_env = {**env, "SIXTEEN_HEADS_IMAGE": "registry.example/sixteen-heads:abc123",
               "SIXTEEN_HEADS_DVC_REMOTE": "s3://bucket/dvc", "DASK_SCHEDULER_ADDRESS": "tcp://dask:8786"}
    prefect(["--no-prompt", "deploy", "--name", "gpu-experiment"], project, gpu_env)
    deployment = httpx.get(f"{api}/deployments/name/experiment/gpu-experiment").json()
    pool = httpx.get(f"{api}/work_pools/gpu").json()

    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    config = asyncio.run(KubernetesWorkerJobConfiguration.from_template_and_values(
        pool["base_job_template"], deployment["job_variables"]))
    container = config.job_manifest["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example/sixteen-heads:abc123"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"name": "SIXTEEN_HEADS_DVC_REMOTE", "value": "s3://bucket/dvc"} in container["env"]
    assert config.env["TOKENIZERS_PARALLELISM"] == "false"
    assert deployment["pull_steps"][0]["prefect.deployments.steps.set_working_directory"]["directory"] == \
        container["workingDir"]


