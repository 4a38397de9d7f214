"""Fixtures shared by several test modules: the flow tests' Prefect home, and the tiny fairseq model."""

from __future__ import annotations

import os
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
    from prefect.server.api.server import SubprocessASGIServer

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
