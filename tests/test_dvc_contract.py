"""The pipeline's contract with DVC, checked statically on every `dvc.yaml`:

- every project module a stage can import (module- or function-level, transitively) lies under one of the
  stage's code deps, so `dvc status` can never call a stage up to date after the code behind it changed;
- every code dep holds at least one module the stage imports, so editing unrelated code (the report, say)
  does not rerun it;
- the sub-packages of `pipeline/` import only the layers below them.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PIPELINES = ("dvc.yaml", "mt/dvc.yaml", "mt-fairseq/dvc.yaml", "llm/dvc.yaml")
PROJECT_PACKAGES = ("pipeline", "stages")

# Bottom to top: a sub-package may import the ones before it, never one after it.
LAYERS = ("files", "config", "core", "data", "training", "methods", "run", "report", "tasks", "flows", "checks",
          "studies")


def module_file(module: str) -> Path | None:
    """The file that defines `module` (a package's __init__.py), or None if it is not a project module."""
    base = ROOT.joinpath(*module.split("."))
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def _with_parents(module: str) -> list[str]:
    """Importing a.b.c runs a/__init__, a/b/__init__ and a/b/c."""
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


@cache
def direct_imports(module: str) -> frozenset[str]:
    """Project modules that `module`'s source imports anywhere: at module level, in functions, lazily."""
    path = module_file(module)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from pipeline.tasks.translation import fairseq` imports the module pipeline.tasks.translation.fairseq.
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            if name.split(".")[0] in PROJECT_PACKAGES:
                found.update(m for m in _with_parents(name) if module_file(m) is not None)
    return frozenset(found - {module})


def closure(module: str) -> set[str]:
    seen, todo = set(), [*_with_parents(module)]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(direct_imports(m))
    return seen


def stages() -> list[tuple[str, str, dict]]:
    found = []
    for pipeline in PIPELINES:
        spec = yaml.safe_load((ROOT / pipeline).read_text())
        found += [(pipeline, name, stage) for name, stage in spec["stages"].items()]
    return found


def stage_module(stage: dict) -> str:
    words = stage["cmd"].split()
    assert words[:3] == ["python", "-m", words[2]] and words[2].startswith("stages."), stage["cmd"]
    return words[2]


def code_deps(pipeline: str, stage: dict) -> list[Path]:
    """The stage's deps that are project code, as paths from the repository root."""
    wdir = (ROOT / pipeline).parent / stage.get("wdir", ".")
    deps = [(wdir / dep).resolve() for dep in stage.get("deps", []) if "${" not in dep]
    return [d for d in deps if d.relative_to(ROOT).parts[0] in PROJECT_PACKAGES]


def covered(path: Path, deps: list[Path]) -> bool:
    return any(path == dep or dep in path.parents for dep in deps)


STAGES = stages()
IDS = [f"{pipeline}:{name}" for pipeline, name, _ in STAGES]


def test_every_pipeline_file_is_checked() -> None:
    assert {p for p, _, _ in STAGES} == set(PIPELINES)
    assert len(STAGES) == 31  # 8 classification, 7 MT, 7 fairseq MT, 9 LM


@pytest.mark.parametrize(("pipeline", "name", "stage"), STAGES, ids=IDS)
def test_every_module_a_stage_imports_is_a_dep_of_it(pipeline: str, name: str, stage: dict) -> None:
    deps = code_deps(pipeline, stage)
    missing = sorted(str(module_file(m).relative_to(ROOT)) for m in closure(stage_module(stage))
                     if not covered(module_file(m), deps))
    assert not missing, f"{pipeline}:{name} runs code that no dep covers: {missing}"


@pytest.mark.parametrize(("pipeline", "name", "stage"), STAGES, ids=IDS)
def test_every_code_dep_of_a_stage_holds_code_it_runs(pipeline: str, name: str, stage: dict) -> None:
    files = [module_file(m) for m in closure(stage_module(stage))]
    loose = [str(d.relative_to(ROOT)) for d in code_deps(pipeline, stage) if not covered_by_any(d, files)]
    assert not loose, f"{pipeline}:{name} depends on code it never imports: {loose}"


def covered_by_any(dep: Path, files: list[Path]) -> bool:
    return any(f == dep or dep in f.parents for f in files)


def test_the_report_code_is_no_dep_of_the_fine_tuning() -> None:
    finetune = [s for p, n, s in STAGES if p == "dvc.yaml" and n == "finetune"][0]
    assert not covered(ROOT / "pipeline" / "report" / "build.py", code_deps("dvc.yaml", finetune))


def _layer_modules() -> list[str]:
    return sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                  for p in (ROOT / "pipeline").rglob("*.py"))


def test_pipeline_is_sub_packages_in_layers() -> None:
    top = {p.name for p in (ROOT / "pipeline").iterdir() if p.name != "__pycache__"}
    assert top == {"__init__.py", *LAYERS}


@pytest.mark.parametrize("module", [m for m in _layer_modules() if m.count(".") >= 1])
def test_sub_packages_import_only_the_layers_below(module: str) -> None:
    layer = LAYERS.index(module.split(".")[1])
    upward = sorted(m for m in direct_imports(module)
                    if m.count(".") >= 1 and LAYERS.index(m.split(".")[1]) > layer)
    assert not upward, f"{module} imports layers above its own: {upward}"
