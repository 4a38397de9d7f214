"""Fixtures shared by the flow tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def prefect_home(tmp_path_factory):
    """The module's own Prefect database and settings (nothing from ~/.prefect), ephemeral by default."""
    saved = {k: os.environ.get(k) for k in ("PREFECT_HOME", "PREFECT_API_URL")}
    os.environ["PREFECT_HOME"] = str(tmp_path_factory.mktemp("prefect-home"))
    os.environ.pop("PREFECT_API_URL", None)
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
