"""`python -m pipeline.checks.dvc_deps [--check]`: each DVC stage's code deps, generated from the imports it runs.

A stage `python -m stages.<S> [--params FILE]` runs stages/<S>.py and every project module it imports, at module
level or inside a function, transitively (`ImportGraph.closure`). It also runs code no import statement names: its
task family's package P (pipeline/config/tasks.py, picked by the params' `task`), its entry modules (P.params,
P.inputs, P.task) and, where the family has one, P.<S>, all imported by name at run time. Those files, and nothing
else of `stages/` or `pipeline/`, are the stage's code deps, so an edit reruns exactly the stages that run the
edited file (issue 44: with whole sub-packages as deps, a comment in one language-modelling module staled 20 of 23
stages).

Without `--check` it rewrites the code-dep entries of each stage's `deps:` in place (`make dvc-deps`), editing the
text so every comment and all formatting stay; with `--check` it writes nothing and exits 1 with one line per
stage whose deps differ (tests/test_dvc_contract.py runs it on the committed files).
"""

from __future__ import annotations

import argparse
import ast
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeline.config.tasks import ENTRY_MODULES, TASK_PACKAGES
from pipeline.files.schema import CLASSIFICATION

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = ("dvc.yaml", "mt/dvc.yaml", "mt-fairseq/dvc.yaml", "llm/dvc.yaml")
PROJECT_PACKAGES = ("pipeline", "stages")


def _with_parents(module: str) -> list[str]:
    """Importing a.b.c runs a/__init__, a/b/__init__ and a/b/c."""
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _run_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of `tree` but those under `if TYPE_CHECKING:` (imports for annotations only)."""
    nodes, todo = [], [tree]
    while todo:
        node = todo.pop()
        nodes.append(node)
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return nodes


class ImportGraph:
    """The project modules under `root` and the project modules each one's source imports.

    Memoised per instance rather than with functools.cache, so a test's fake repository, or a file edited between
    two runs, never reads another graph's answers."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._imports: dict[str, frozenset[str]] = {}

    def module_file(self, module: str) -> Path | None:
        """The file that defines `module` (a package's __init__.py), or None if it is not a project module."""
        base = self.root.joinpath(*module.split("."))
        if base.with_suffix(".py").is_file():
            return base.with_suffix(".py")
        if (base / "__init__.py").is_file():
            return base / "__init__.py"
        return None

    def direct_imports(self, module: str) -> frozenset[str]:
        """Project modules that `module`'s source imports anywhere: at module level, in functions, lazily; not those
        under `if TYPE_CHECKING:`, which only a type checker runs."""
        if module not in self._imports:
            self._imports[module] = self._parse_imports(module)
        return self._imports[module]

    def _parse_imports(self, module: str) -> frozenset[str]:
        path = self.module_file(module)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found: set[str] = set()
        for node in _run_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                # `from pipeline.tasks.translation import fairseq` imports the module ...translation.fairseq.
                names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            for name in names:
                if name.split(".")[0] in PROJECT_PACKAGES:
                    found.update(m for m in _with_parents(name) if self.module_file(m) is not None)
        return frozenset(found - {module})

    def closure(self, module: str) -> set[str]:
        """`module`, its parent packages and every project module they import, transitively."""
        seen, todo = set(), [*_with_parents(module)]
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo.extend(self.direct_imports(m))
        return seen


@dataclass(frozen=True)
class Stage:
    pipeline: str  # the pipeline file, from the repository root
    name: str
    module: str  # stages.<S>
    wdir: Path  # absolute: the stage's paths are relative to it
    params: Path  # absolute: the params file its command reads
    deps: tuple[str, ...]


def read_stages(root: Path, pipeline: str) -> list[Stage]:
    """The stages of the pipeline file `pipeline`, each with the module and params file its command names."""
    spec = yaml.safe_load((root / pipeline).read_text())
    found = []
    for name, stage in spec["stages"].items():
        words = stage["cmd"].split()
        form = len(words) == 3 or (len(words) == 5 and words[3] == "--params")
        if not (form and words[:2] == ["python", "-m"] and words[2].startswith("stages.")):
            raise ValueError(f"{pipeline}:{name}: cmd is not `python -m stages.<name> [--params FILE]`: {stage['cmd']}")
        wdir = ((root / pipeline).parent / stage.get("wdir", ".")).resolve()
        params = wdir / (words[4] if len(words) == 5 else "params.yaml")
        found.append(Stage(pipeline, name, words[2], wdir, params, tuple(stage.get("deps", []))))
    return found


def code_files(graph: ImportGraph, stage: Stage, packages: Mapping[str, str]) -> set[Path]:
    """Every project file the stage runs: its script's import closure, its family's package's, and those of the
    family's entry modules (ENTRY_MODULES: P.params, P.inputs, P.task) and its module for this stage (P.<S>), where
    the family has them."""
    if not stage.params.is_file():
        raise ValueError(f"{stage.pipeline}:{stage.name}: no params file {stage.params}")
    task = (yaml.safe_load(stage.params.read_text()) or {}).get("task", CLASSIFICATION)
    if task not in packages:
        raise ValueError(f"{stage.pipeline}:{stage.name}: task {task!r} is not in pipeline/config/tasks.py")
    family = packages[task]
    modules = graph.closure(stage.module) | graph.closure(family)
    for name in (*ENTRY_MODULES, stage.module.rpartition(".")[2]):
        if graph.module_file(f"{family}.{name}") is not None:
            modules |= graph.closure(f"{family}.{name}")
    return {graph.module_file(m) for m in modules}


def _python_files(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*.py") if "__pycache__" not in p.parts}


def compress(root: Path, files: set[Path]) -> list[Path]:
    """`files` with each folder whose .py files are all there listed as the folder: as narrow (the project's
    folders hold only Python; .dvcignore drops __pycache__) and much shorter."""

    def walk(folder: Path) -> list[Path]:
        if _python_files(folder) <= files:
            return [folder]
        found = [f for f in files if f.parent == folder]
        for sub in folder.iterdir():
            if sub.is_dir() and _python_files(sub) & files:  # a __pycache__ holds no .py file
                found += walk(sub)
        return found

    return sorted(p for package in PROJECT_PACKAGES if _python_files(root / package) & files
                  for p in walk(root / package))


def is_code_dep(root: Path, wdir: Path, dep: str) -> bool:
    """Whether a dep entry names project code (under stages/ or pipeline/), as opposed to data or a report."""
    if "${" in dep:
        return False
    path = (wdir / dep).resolve()
    return path.is_relative_to(root) and path != root and path.relative_to(root).parts[0] in PROJECT_PACKAGES


def generated_deps(root: Path, graph: ImportGraph, stage: Stage, packages: Mapping[str, str]) -> list[str]:
    """The stage's deps as they should read: the generated code deps, sorted, then its other deps in their order."""
    code = sorted(os.path.relpath(p, stage.wdir) for p in compress(root, code_files(graph, stage, packages)))
    return code + [d for d in stage.deps if not is_code_dep(root, stage.wdir, d)]


def _deps_node(document: yaml.Node, pipeline: str, name: str) -> yaml.SequenceNode:
    stages = next(v for k, v in document.value if k.value == "stages")
    stage = next(v for k, v in stages.value if k.value == name)
    deps = [v for k, v in stage.value if k.value == "deps"]
    if not deps or not isinstance(deps[0], yaml.SequenceNode) or deps[0].flow_style or not deps[0].value:
        raise ValueError(f"{pipeline}:{name}: no block list `deps:` to write the code deps into")
    return deps[0]


def rewrite(text: str, pipeline: str, deps: Mapping[str, list[str]]) -> str:
    """`text` (a pipeline file) with each named stage's deps list replaced by `deps[name]`, line by line.

    Only the list's lines change: a dep that stays keeps its line and the comment lines above it (they move with
    it), so comments, quoting and the rest of the file stay as written; a new dep gets a line like the first one."""
    lines = text.splitlines(keepends=True)
    document = yaml.compose(text, Loader=yaml.SafeLoader)
    # Bottom up, so the line numbers of the stages still to edit stay valid.
    edits = sorted(((_deps_node(document, pipeline, name), name) for name in deps), key=lambda e: -e[0].start_mark.line)
    for node, name in edits:
        items, kept, previous = node.value, {}, None
        prefix = lines[items[0].start_mark.line][: items[0].start_mark.column]
        for item in items:
            line = item.start_mark.line
            if not isinstance(item, yaml.ScalarNode) or item.end_mark.line != line:
                raise ValueError(f"{pipeline}:{name}: a dep is not a one-line path (line {line + 1})")
            above = lines[previous + 1: line] if previous is not None else []
            kept[item.value] = [*above, lines[line]]
            if item.value not in deps[name] and (any(s.strip() for s in above)
                                                 or lines[line][item.end_mark.column:].strip()):
                raise ValueError(f"{pipeline}:{name}: the dep {item.value} goes, and with it its comment; move the "
                                 f"comment above `deps:` (line {line + 1})")
            previous = line
        block = ["".join(kept[dep]) if dep in kept else f"{prefix}{dep}\n" for dep in deps[name]]
        lines[items[0].start_mark.line: items[-1].start_mark.line + 1] = block
    return "".join(lines)


def _listed(what: str, deps: list[str], shown: int = 3) -> str:
    """`deps` in a few words: a whole list would make the check's one line per stage hundreds of characters."""
    if not deps:
        return ""
    more = f" and {len(deps) - shown} more" if len(deps) > shown else ""
    return f"{len(deps)} {what} ({', '.join(deps[:shown])}{more})"


def differences(root: Path = ROOT, pipelines: Sequence[str] = PIPELINES,
                packages: Mapping[str, str] = TASK_PACKAGES, write: bool = False) -> list[str]:
    """One line per stage whose deps are not the generated ones; with `write`, the pipeline files are rewritten
    so that they are."""
    root = root.resolve()  # deps resolve against it (is_code_dep)
    graph, found = ImportGraph(root), []
    for pipeline in pipelines:
        stages = read_stages(root, pipeline)
        wanted = {s.name: generated_deps(root, graph, s, packages) for s in stages}
        stale = {s.name: s for s in stages if list(s.deps) != wanted[s.name]}
        for name, stage in stale.items():
            now = {d for d in stage.deps if is_code_dep(root, stage.wdir, d)}
            new = {d for d in wanted[name] if is_code_dep(root, stage.wdir, d)}
            change = [_listed("to add", sorted(new - now)), _listed("to drop", sorted(now - new))]
            found.append(f"{pipeline}:{name}: code deps {', '.join(c for c in change if c) or 'out of order'}")
        if write and stale:
            path = root / pipeline
            path.write_text(rewrite(path.read_text(), pipeline, {name: wanted[name] for name in stale}))
    return found


def main(argv: list[str] | None = None, root: Path = ROOT, pipelines: Sequence[str] = PIPELINES,
         packages: Mapping[str, str] = TASK_PACKAGES) -> None:
    """The command line; `root`, `pipelines` and `packages` let the tests run it on a repository of their own."""
    parser = argparse.ArgumentParser(description="Generate each DVC stage's code deps from the imports it runs "
                                                 "(`make dvc-deps`).")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 listing the stages whose deps are not the generated ones")
    check = parser.parse_args(argv).check
    try:
        found = differences(root, pipelines, packages, write=not check)
    except ValueError as error:  # a pipeline file this cannot edit safely: say where, no traceback
        raise SystemExit(f"error: {error}") from None
    if check and found:
        raise SystemExit("\n".join(found))
    print("\n".join(f"rewrote {line}" for line in found) or "ok: every stage's code deps are the generated ones")


if __name__ == "__main__":
    main()
