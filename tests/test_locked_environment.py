"""The venv holds exactly requirements.lock's versions (`make setup` installs the lock, `make lock` writes it), and
pyproject.toml's ranges still allow them: a stale venv, a lock edited by hand or a range moved past the lock fails
here, in a second, instead of as a pipeline rerun with other versions than the last run's.

GPU users who keep their own CUDA torch (`make setup TORCH=keep`, or TORCH=keep exported) set TORCH=keep for the
tests too (make exports it): torch's line is then not compared, nor the CUDA packages that torch brings."""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"
PROJECT = "sixteen-heads"
# The extras `make setup` installs, hence the ones `make lock` resolves.
LOCKED_EXTRAS = ("dev", "fairseq")


def locked_versions(lock_text: str) -> dict[str, str]:
    """The lock's pins, {PEP 503 name: version}, from its `name==version` lines (uv's `# via` comments skipped)."""
    pins: dict[str, str] = {}
    for number, raw in enumerate(lock_text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        specs = list(requirement.specifier)
        if len(specs) != 1 or specs[0].operator != "==":
            raise ValueError(f"lock line {number} is not one `name==version` pin: {raw.strip()!r}")
        pins[canonicalize_name(requirement.name)] = specs[0].version
    return pins


def version_mismatches(
    locked: Mapping[str, str], installed_version: Callable[[str], str | None], unchecked: Iterable[str] = ()
) -> list[str]:
    """One line for each locked package that is missing or at another version; `installed_version` gives a name's
    version or None when it is not installed; `unchecked` names are left out (a torch the user kept)."""
    skipped = {canonicalize_name(name) for name in unchecked}
    problems = []
    for name, version in sorted(locked.items()):
        if name in skipped:
            continue
        found = installed_version(name)
        if found is None:
            problems.append(f"{name}: locked {version}, not installed")
        elif Version(found) != Version(version):
            problems.append(f"{name}: locked {version}, installed {found}")
    return problems


def unlocked_packages(locked: Mapping[str, str], installed: Iterable[str], allowed: Iterable[str] = ()) -> list[str]:
    """The installed distributions the lock does not list, bar `allowed` (this project; a kept torch's own
    dependencies): left over from an earlier setup, or installed by hand, they would be missing after a fresh one."""
    known = set(locked) | {canonicalize_name(name) for name in allowed}
    return sorted({canonicalize_name(name) for name in installed} - known)


def ranges_refusing(requirements: Iterable[str], locked: Mapping[str, str], extras: Iterable[str]) -> list[str]:
    """One line for each requirement (pyproject.toml's strings) that applies with `extras` and whose package the
    lock lacks or pins outside its range: the lock is stale, `make lock` re-resolves it."""
    environments = [{"extra": extra} for extra in ("", *extras)]
    problems = []
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is not None and not any(requirement.marker.evaluate(env) for env in environments):
            continue
        name = canonicalize_name(requirement.name)
        if name not in locked:
            problems.append(f"{requirement}: not in the lock")
        elif not requirement.specifier.contains(locked[name], prereleases=True):
            problems.append(f"{requirement}: the lock pins {locked[name]}")
    return problems


def installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_kept() -> bool:
    """Whether the user keeps their own torch (TORCH=keep, as `make setup` reads it)."""
    return os.environ.get("TORCH", "cpu") == "keep"


def kept_torch_dependencies() -> set[str]:
    """The packages a kept (CUDA) torch requires, e.g. nvidia-*-cu12 and triton, which the CPU lock does not list."""
    return {Requirement(text).name for text in importlib.metadata.requires("torch") or []}


@pytest.fixture(scope="module")
def locked() -> dict[str, str]:
    return locked_versions(LOCK.read_text())


def test_installed_versions_are_the_locked_ones(locked):
    unchecked = ["torch"] if torch_kept() else []
    problems = version_mismatches(locked, installed_version, unchecked)
    assert not problems, "the venv is not requirements.lock's (run make setup):\n" + "\n".join(problems)


def test_nothing_installed_beyond_the_lock(locked):
    allowed = {PROJECT} | (kept_torch_dependencies() if torch_kept() else set())
    installed = [dist.metadata["Name"] for dist in importlib.metadata.distributions()]
    extra = unlocked_packages(locked, installed, allowed)
    assert not extra, "installed but not in requirements.lock (a fresh make setup lacks them): " + ", ".join(extra)


def test_pyproject_ranges_allow_the_locked_versions(locked):
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in LOCKED_EXTRAS:
        requirements += project["optional-dependencies"][extra]
    problems = ranges_refusing(requirements, locked, LOCKED_EXTRAS)
    assert not problems, "requirements.lock is stale against pyproject.toml (run make lock):\n" + "\n".join(problems)


def test_the_lock_pins_what_make_setup_installs_apart(locked):
    # The Makefile reads these lines for pip (torch, uv) and for fairseq's --no-deps install.
    assert {"torch", "fairseq-fixed", "uv", "pip"} <= set(locked)
    assert "+cpu" in locked["torch"], "the lock's torch must be the CPU build: PyPI's pulls a multi-GB CUDA build"


SAMPLE_LOCK = """\
# This file was autogenerated by uv via the following command:
#    make lock
numpy==2.4.6
    # via sixteen-heads (pyproject.toml)
Torch==2.13.0+cpu
ruamel.yaml==0.19.1
"""


def test_lock_lines_are_read_with_pep_503_names():
    assert locked_versions(SAMPLE_LOCK) == {"numpy": "2.4.6", "torch": "2.13.0+cpu", "ruamel-yaml": "0.19.1"}


def test_a_lock_line_that_is_not_a_pin_is_an_error():
    with pytest.raises(ValueError, match="line 2 is not one `name==version` pin"):
        locked_versions("numpy==2.4.6\nscipy>=1.11\n")


def test_a_mismatching_lock_is_reported_package_by_package():
    installed = {"numpy": "2.4.5", "torch": "2.5.1+cu121", "ruamel-yaml": "0.19.1"}.get
    assert version_mismatches(locked_versions(SAMPLE_LOCK + "scipy==1.17.1\n"), installed) == [
        "numpy: locked 2.4.6, installed 2.4.5",
        "scipy: locked 1.17.1, not installed",
        "torch: locked 2.13.0+cpu, installed 2.5.1+cu121",
    ]


def test_a_kept_torch_is_not_compared_and_equal_versions_pass():
    installed = {"numpy": "2.4.6", "torch": "2.5.1+cu121", "ruamel-yaml": "0.19.1"}.get
    assert version_mismatches(locked_versions(SAMPLE_LOCK), installed, unchecked=["Torch"]) == []


def test_packages_beyond_the_lock_are_listed():
    locked = locked_versions(SAMPLE_LOCK)
    installed = ["numpy", "torch", "ruamel.yaml", "Sixteen_Heads", "nvidia-cudnn-cu12", "leftover"]
    assert unlocked_packages(locked, installed, allowed=["sixteen-heads"]) == ["leftover", "nvidia-cudnn-cu12"]


def test_ranges_the_lock_falls_outside_are_reported():
    locked = locked_versions(SAMPLE_LOCK)
    requirements = ["numpy>=1.21.3", "torch>=2.4", "ruamel.yaml<0.19", "scipy>=1.11", 'docs-only; extra == "docs"']
    assert ranges_refusing(requirements, locked, extras=["dev"]) == [
        "ruamel.yaml<0.19: the lock pins 0.19.1",
        "scipy>=1.11: not in the lock",
    ]
