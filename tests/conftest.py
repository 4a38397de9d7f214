"""Fixtures shared by several test modules: the flow tests' Prefect home, the tiny pipeline reproduced once, and the
tiny fairseq model."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def prefect_home(tmp_path_factory):
    """The module's own Prefect database and settings (nothing from ~/.prefect), ephemeral by default."""
    saved = {k: os.environ.get(k) for k in ("PREFECT_HOME", "PREFECT_API_URL")}
    os.environ["PREFECT_HOME"] = str(tmp_path_factory.mktemp("prefect-home"))
    os.environ.pop("PREFECT_API_URL", None)
    yield
    # Stop the module's ephemeral API server now, while pytest still captures its log line; Prefect's own
    # atexit stop would log to a closed stream (a "--- Logging error ---" traceback after the summary), and the
    # next module would reuse a server that reads this module's PREFECT_HOME. Imported here, not at the top:
    # importing Prefect's server before PREFECT_HOME is set leaves the ephemeral server unable to start.
    # Flow runs' log records still queued for the API go first, while it is up: sent at exit they find no server
    # ("--- Error logging to API --- All connection attempts failed" after the summary).
    from prefect.logging.handlers import APILogHandler
    from prefect.server.api.server import SubprocessASGIServer

    APILogHandler().flush()
    SubprocessASGIServer().stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def fairseq_toy_checkpoint(tmp_path_factory) -> Path:
    """A tiny fairseq Transformer trained with fairseq-train on the toy task (tests/fairseq_toy.py), once per
    session; its fairseq-preprocess folder is `checkpoint.parents[1] / "data-bin"`. Needs the fairseq extra."""
    from tests.fairseq_toy import train_toy_model

    return train_toy_model(tmp_path_factory.mktemp("fairseq"))


@pytest.fixture(scope="session")
def tiny_trace_dir(tmp_path_factory) -> Path:
    """Where the reproduction of `tiny_reproduced` records the params each stage reads."""
    return tmp_path_factory.mktemp("params-trace")


@pytest.fixture(scope="session")
def tiny_reproduced(tmp_path_factory, tiny_trace_dir) -> tuple[Path, Path]:
    """The tiny pipeline (budgeted methods on) after one uninterrupted `dvc repro`, once per session: (the project,
    which tests/test_pipeline_e2e.py goes on to change, and an untouched copy of it as that first run left it, the
    reference of tests/test_killed_runs.py). A full run costs minutes here, mostly the stages' imports."""
    from tests.tiny_project import STAGES, make_tiny_project, ran_stages, run, tiny_params, traced_env, with_budgeted

    root = make_tiny_project(tmp_path_factory.mktemp("repo"), params=with_budgeted(tiny_params()))
    assert ran_stages(run(["dvc", "repro"], root, traced_env(tiny_trace_dir))) == STAGES
    snapshot = tmp_path_factory.mktemp("first-run") / "repo"
    shutil.copytree(root, snapshot, symlinks=True)
    return root, snapshot
