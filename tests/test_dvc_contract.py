"""The pipeline's contract with DVC:

- every stage's code deps are the ones `make dvc-deps` (pipeline/checks/dvc_deps.py) generates from the files it
  runs, so `dvc status` calls a stage stale when, and only when, a file it runs changed. The generator itself is
  checked on a tiny repository laid out as the task families are (one package each, imported by name);
- with DVC itself, on a clone of HEAD, an edit to one family's module, or to the benchmark timer, stales no stage
  that does not run it (issue 44);
- the sub-packages of `pipeline/` import only the layers below them;
- every committed dvc.lock is fresh for code and params: its tables come from the code in the tree.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from importlib.util import find_spec
from pathlib import Path

import pytest

from pipeline.checks.dvc_deps import PIPELINES, ImportGraph, differences, main, read_stages
from pipeline.checks.fresh_locks import git_tracked, locked_pipelines, stale_reasons, stale_stages

ROOT = Path(__file__).resolve().parents[1]
GRAPH = ImportGraph(ROOT)

# Bottom to top: a sub-package may import the ones before it, never one after it.
LAYERS = ("files", "config", "core", "data", "training", "methods", "run", "report", "tasks", "flows", "checks",
          "studies", "export")


def test_every_pipeline_file_has_its_deps_generated() -> None:
    found = {str(p.relative_to(ROOT)) for p in [*ROOT.glob("dvc.yaml"), *ROOT.glob("*/dvc.yaml")]}
    assert found == set(PIPELINES)
    assert sum(len(read_stages(ROOT, p)) for p in PIPELINES) == 33  # 8 classification, 7 MT, 7 fairseq MT, 11 LM


def test_the_committed_pipeline_files_declare_the_generated_deps() -> None:
    stale = differences()
    assert not stale, "run `make dvc-deps`:\n" + "\n".join(stale)


def test_the_report_code_is_no_dep_of_the_fine_tuning() -> None:
    finetune = next(s for s in read_stages(ROOT, "dvc.yaml") if s.name == "finetune")
    assert not [d for d in finetune.deps if d.startswith("pipeline/report")]


# A tiny repository laid out by the convention of pipeline/config/tasks.py: the stages import no family package;
# at run time a stage imports its family's package P by name and, where it exists, P.<stage>. Each file's source.
FAKE_FILES = {
    "pipeline/__init__.py": "",
    "pipeline/core/__init__.py": "",
    "pipeline/core/models.py": "",
    "pipeline/core/timer.py": "",
    "pipeline/report/__init__.py": "",
    "pipeline/report/build.py": "from pipeline.core import models\n",
    "pipeline/tasks/__init__.py": "",
    "pipeline/tasks/classification/__init__.py": "from . import metrics\nfrom pipeline.core import models\n",
    "pipeline/tasks/classification/metrics.py": "",
    # A function-level import, as the real families defer their heavy ones.
    "pipeline/tasks/language_modeling/__init__.py": "def load():\n    from .perplexity import perplexity\n",
    "pipeline/tasks/language_modeling/perplexity.py": "from pipeline.core import models\n",
    "pipeline/tasks/language_modeling/benchmark.py": "from pipeline.core import timer\n",  # P.<S> for benchmark
    "pipeline/tasks/translation/__init__.py": "from . import bleu\nfrom pipeline.core import models\n",
    "pipeline/tasks/translation/bleu.py": "",
    "stages/__init__.py": "",
    "stages/prepare.py": "import importlib\n\nfrom pipeline.core import models\n",
    "stages/benchmark.py": "import importlib\n",
    "stages/report.py": "from pipeline.report import build\n",
}
FAKE_PACKAGES = {"classification": "pipeline.tasks.classification", "translation": "pipeline.tasks.translation",
                 "language-modeling": "pipeline.tasks.language_modeling"}
FAKE_PIPELINES = ("dvc.yaml", "mt/dvc.yaml", "lm/dvc.yaml")


FAKE_STAGE = """\
  {name}:  # stage {name}
{command}
    deps:
      # the code, then the data
      - stages
      - pipeline
      # read, never written
      - data/${{experiment}}.csv  # the corpus
      - artifacts/${{experiment}}/model
    outs:
      - artifacts/${{experiment}}/{name}
"""


def fake_pipeline(stage_names: Sequence[str], params: str | None) -> str:
    """A pipeline file whose stages depend on all the code, as the files did before issue 44, with comments; with
    `params`, it sits in a folder and its stages run from the root, as mt/dvc.yaml's do."""
    def command(name: str) -> str:
        return f"    wdir: ..\n    cmd: python -m stages.{name} --params {params}" if params else \
            f"    cmd: python -m stages.{name}"
    return "# a fake pipeline\nstages:\n" + "".join(FAKE_STAGE.format(name=n, command=command(n)) for n in stage_names)


@pytest.fixture
def fake_repo(tmp_path: Path) -> Path:
    for path, source in FAKE_FILES.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(source)
    (tmp_path / "params.yaml").write_text("experiment: rt\n")  # no task: classification
    (tmp_path / "dvc.yaml").write_text(fake_pipeline(["prepare", "benchmark", "report"], None))
    for folder, task in (("mt", "translation"), ("lm", "language-modeling")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "params.yaml").write_text(f"experiment: {folder}\ntask: {task}\n")
        (tmp_path / folder / "dvc.yaml").write_text(fake_pipeline(["prepare", "benchmark"], f"{folder}/params.yaml"))
    return tmp_path


def generate(root: Path, check: bool = False) -> None:
    main(["--check"] if check else [], root=root, pipelines=FAKE_PIPELINES, packages=FAKE_PACKAGES)


def code_deps(root: Path) -> dict[str, list[str]]:
    """Each stage's deps under stages/ or pipeline/, keyed pipeline:stage."""
    return {f"{p}:{s.name}": [d for d in s.deps if d.split("/")[0] in ("stages", "pipeline")]
            for p in FAKE_PIPELINES for s in read_stages(root, p)}


def test_the_generated_deps_are_the_files_a_stage_runs_and_its_familys_package(fake_repo: Path) -> None:
    generate(fake_repo)
    deps = code_deps(fake_repo)
    # The family package's folder in full; no other family's, no report code, no timer: no stage runs them.
    assert deps["dvc.yaml:prepare"] == ["pipeline/__init__.py", "pipeline/core/__init__.py", "pipeline/core/models.py",
                                        "pipeline/tasks/__init__.py", "pipeline/tasks/classification",
                                        "stages/__init__.py", "stages/prepare.py"]
    # A function-level import counts; the family's module for another stage (benchmark.py) does not.
    assert deps["lm/dvc.yaml:prepare"] == ["pipeline/__init__.py", "pipeline/core/__init__.py",
                                           "pipeline/core/models.py", "pipeline/tasks/__init__.py",
                                           "pipeline/tasks/language_modeling/__init__.py",
                                           "pipeline/tasks/language_modeling/perplexity.py",
                                           "stages/__init__.py", "stages/prepare.py"]
    # P.benchmark brings the timer: every file of pipeline/core and of the family now runs, so the folders stand.
    assert deps["lm/dvc.yaml:benchmark"] == ["pipeline/__init__.py", "pipeline/core", "pipeline/tasks/__init__.py",
                                             "pipeline/tasks/language_modeling", "stages/__init__.py",
                                             "stages/benchmark.py"]
    assert "pipeline/report" in deps["dvc.yaml:report"]


def test_generating_rewrites_only_the_code_deps_and_keeps_comments_and_the_other_deps(fake_repo: Path) -> None:
    before = (fake_repo / "mt" / "dvc.yaml").read_text()
    generate(fake_repo)
    after = (fake_repo / "mt" / "dvc.yaml").read_text()
    kept = [line for line in before.splitlines() if line.strip() not in ("- stages", "- pipeline")]
    assert [line for line in after.splitlines() if line in kept] == kept  # every other line, in its order
    assert after.count("# the code, then the data\n      - pipeline/__init__.py\n") == 2  # code deps first
    assert "      # read, never written\n      - data/${experiment}.csv  # the corpus\n" in after
    generate(fake_repo, check=True)  # and the files now pass the check


def test_the_check_writes_nothing_and_exits_1_with_one_line_per_stale_stage(fake_repo: Path) -> None:
    texts = {p: (fake_repo / p).read_text() for p in FAKE_PIPELINES}
    with pytest.raises(SystemExit) as stale:
        generate(fake_repo, check=True)
    lines = str(stale.value.code).splitlines()
    assert [line.split(": ")[0] for line in lines] == [f"{p}:{s}" for p, names in
                                                      (("dvc.yaml", ("prepare", "benchmark", "report")),
                                                       ("mt/dvc.yaml", ("prepare", "benchmark")),
                                                       ("lm/dvc.yaml", ("prepare", "benchmark"))) for s in names]
    assert {p: (fake_repo / p).read_text() for p in FAKE_PIPELINES} == texts


def test_a_comment_on_a_code_dep_that_goes_stops_the_generator_instead_of_vanishing(fake_repo: Path) -> None:
    path = fake_repo / "dvc.yaml"
    path.write_text(path.read_text().replace("      - pipeline\n", "      - pipeline  # all of it\n", 1))
    with pytest.raises(SystemExit, match=r"^error: dvc\.yaml:prepare: the dep pipeline goes.*line 8\)$"):
        generate(fake_repo)


def deps_digests(root: Path) -> dict[str, str]:
    """Each stage's digest of the files under its deps, as DVC compares them."""
    digests = {}
    for pipeline in FAKE_PIPELINES:
        for stage in read_stages(root, pipeline):
            files = sorted(f for d in stage.deps if "${" not in d
                           for f in ([stage.wdir / d] if (stage.wdir / d).is_file() else (stage.wdir / d).rglob("*"))
                           if f.is_file())
            digests[f"{pipeline}:{stage.name}"] = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()
    return digests


def test_an_edit_to_one_familys_module_stales_only_that_familys_stages(fake_repo: Path) -> None:
    generate(fake_repo)
    before = deps_digests(fake_repo)
    with (fake_repo / "pipeline/tasks/language_modeling/perplexity.py").open("a") as module:
        module.write("# a comment\n")
    after = deps_digests(fake_repo)
    assert {s for s in after if after[s] != before[s]} == {"lm/dvc.yaml:prepare", "lm/dvc.yaml:benchmark"}


def test_an_import_added_to_one_familys_module_changes_only_that_familys_stage_deps(fake_repo: Path) -> None:
    generate(fake_repo)
    before = code_deps(fake_repo)
    (fake_repo / "pipeline/tasks/translation/bleu.py").write_text("from pipeline.core import timer\n")
    generate(fake_repo)
    after = code_deps(fake_repo)
    assert {s for s in after if after[s] != before[s]} == {"mt/dvc.yaml:prepare", "mt/dvc.yaml:benchmark"}
    assert "pipeline/core" in after["mt/dvc.yaml:prepare"]


# With DVC, on a clone of HEAD: what `dvc status` calls stale after a comment is appended to one module.

def dvc_command() -> str:
    """DVC's command: <root>/.venv's, this interpreter's or the one on PATH. Skips without one, or without DVC's
    package in this interpreter (RECORD_DEPS runs on it)."""
    candidates = (ROOT / ".venv" / "bin" / "dvc", Path(sys.executable).parent / "dvc")
    found = next((str(c) for c in candidates if c.is_file()), shutil.which("dvc"))
    if found is None or find_spec("dvc") is None:
        pytest.skip("dvc not found: neither <root>/.venv/bin/dvc nor this interpreter's nor one on PATH, with its "
                    "package importable here")
    return found


ENV = {**os.environ, "DVC_NO_ANALYTICS": "1", "TQDM_DISABLE": "1"}
# A clone's dvc.lock records the code of the last run, not of HEAD: every code dep edited or added since would
# read as changed both before and after the edit, and hide it. So the clone's lock first records HEAD's deps as
# run (DVC's own hashing; the missing outputs keep their recorded hashes), and only the edit can change a dep.
RECORD_DEPS = """
from dvc.repo import Repo
with Repo(".") as repo:
    for stage in repo.index.stages:
        stage.save_deps(allow_missing=True)
        stage.dump(update_pipeline=False)
"""


def changed_deps(dvc: str, clone: Path, pipelines: Sequence[str]) -> dict[str, dict[str, str]]:
    """Each stage's "changed deps" in `dvc status --json`, keyed pipeline:stage."""
    result = subprocess.run([dvc, "status", "--json", *pipelines], cwd=clone, env=ENV, capture_output=True,
                            text=True, check=True)
    return {(name if ":" in name else f"dvc.yaml:{name}"): entry["changed deps"]
            for name, entries in json.loads(result.stdout).items()
            for entry in entries if isinstance(entry, dict) and "changed deps" in entry}


def stages_staled_by(tmp_path: Path, module: Callable[[Path], Path], pipelines: Sequence[str]) -> set[str]:
    """The stages of `pipelines` whose changed deps grow when a comment is appended to `module(clone)`."""
    dvc, clone = dvc_command(), tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    # Every pipeline on, the fairseq one included, as a user who enables it has them (mt-fairseq/.dvcignore).
    (clone / "mt-fairseq" / ".dvcignore").unlink(missing_ok=True)
    subprocess.run([sys.executable, "-c", RECORD_DEPS], cwd=clone, env=ENV, capture_output=True, check=True)
    before = changed_deps(dvc, clone, pipelines)
    with module(clone).open("a") as source:
        source.write("# an edit that changes no behaviour\n")
    after = changed_deps(dvc, clone, pipelines)
    return {stage for stage, deps in after.items() if deps != before.get(stage)}


def first_module_of(package: str, before_the_move: str) -> Callable[[Path], Path]:
    """The first file of the family package `package` (pipeline/tasks/<family>/), or the module that only the
    family imports while the restructure has not landed."""
    def pick(clone: Path) -> Path:
        folder = clone / "pipeline" / "tasks" / package
        return sorted(folder.rglob("*.py"))[0] if folder.is_dir() else clone / before_the_move
    return pick


@pytest.mark.slow
def test_an_edit_to_a_language_modelling_module_stales_no_classification_stage(tmp_path: Path) -> None:
    staled = stages_staled_by(tmp_path, first_module_of("language_modeling", "pipeline/lm/llama.py"),
                              ["dvc.yaml", "llm/dvc.yaml"])
    assert any(s.startswith("llm/") for s in staled), f"no language-modelling stage staled, so no edit seen: {staled}"
    assert not sorted(s for s in staled if not s.startswith("llm/"))


@pytest.mark.slow
def test_an_edit_to_a_translation_module_stales_no_classification_or_language_modelling_stage(tmp_path: Path
                                                                                              ) -> None:
    staled = stages_staled_by(tmp_path, first_module_of("translation", "pipeline/mt/bleu.py"),
                              ["dvc.yaml", "mt/dvc.yaml", "llm/dvc.yaml"])
    assert any(s.startswith("mt/") for s in staled), f"no translation stage staled, so no edit seen: {staled}"
    assert not sorted(s for s in staled if not s.startswith("mt/"))


@pytest.mark.slow
def test_an_edit_to_the_timer_stales_only_the_stages_that_time_something(tmp_path: Path) -> None:
    """The benchmark stages time the models; the prune stages time layers too (the budgeted methods' latency budget
    and FFN width probe, pipeline/methods/budgeted_costs.py and widths.py). No other stage runs the timer."""
    staled = stages_staled_by(tmp_path, lambda clone: clone / "pipeline" / "core" / "timer.py", PIPELINES)
    assert {s for s in staled if s.endswith(":benchmark")} == {f"{p}:benchmark" for p in PIPELINES}
    assert not sorted(s for s in staled if not s.endswith((":benchmark", ":prune")))


def _layer_modules() -> list[str]:
    return sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                  for p in (ROOT / "pipeline").rglob("*.py"))


def test_pipeline_is_sub_packages_in_layers() -> None:
    top = {p.name for p in (ROOT / "pipeline").iterdir() if p.name != "__pycache__"}
    assert top == {"__init__.py", *LAYERS}


@pytest.mark.parametrize("module", [m for m in _layer_modules() if m.count(".") >= 1])
def test_sub_packages_import_only_the_layers_below(module: str) -> None:
    layer = LAYERS.index(module.split(".")[1])
    upward = sorted(m for m in GRAPH.direct_imports(module)
                    if m.count(".") >= 1 and LAYERS.index(m.split(".")[1]) > layer)
    assert not upward, f"{module} imports layers above its own: {upward}"


# --- every committed lock fresh for code and params (pipeline/checks/fresh_locks.py) -----------------------------


def test_a_stage_is_stale_for_its_command_params_and_tracked_code_not_for_outputs_or_other_stages_outputs() -> None:
    status = {
        "llm/dvc.yaml:score": [{"changed deps": {"pipeline/core/timer.py": "modified",
                                                 "artifacts/x/finetuned": "deleted",
                                                 "llm/params.yaml": {"runtime.precision": "modified"}}},
                               {"changed outs": {"reports/x/importance.csv": "not in cache"}}],
        "llm/dvc.yaml:prepare": [{"changed outs": {"artifacts/x/data": "not in cache"}}],
        "llm/dvc.yaml:report": ["changed command"],
        "llm/dvc.yaml:ablate": [{"changed deps": {"artifacts/x/data": "deleted"}}],
    }
    assert stale_reasons(status, tracked={"pipeline/core/timer.py"}) == {
        "llm/dvc.yaml:score": ["pipeline/core/timer.py (modified)", "param runtime.precision (modified)"],
        "llm/dvc.yaml:report": ["its command"],
    }


def test_git_tracked_paths_are_the_code_deps_and_untracked_ones_are_outputs() -> None:
    assert git_tracked(["pipeline/core", "stages/score.py", "artifacts/smollm2-wikitext/data"]) == {
        "pipeline/core", "stages/score.py"}


def test_every_committed_lock_is_fresh_for_code_and_params() -> None:
    """A change to a module a stage runs lands with that pipeline's rerun (`make repro`, `make repro-mt`, `make
    repro-llm`) and its committed dvc.lock, or this fails."""
    assert locked_pipelines() == ["dvc.yaml", "mt/dvc.yaml", "llm/dvc.yaml"]
    stale = {pipeline: stale_stages(pipeline) for pipeline in locked_pipelines()}
    assert stale == {pipeline: {} for pipeline in locked_pipelines()}, stale
