"""Adding a task family is one package and one registry entry: a toy family, written here into a temporary package
and registered in `pipeline.config.tasks.TASK_PACKAGES`, is validated, checked, run by the generic stages (prepare,
finetune, score), and no shared module changes. (That its stages' DVC deps hold its modules and no other family's:
tests/test_dvc_contract.py, on a repository laid out the same way.)"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from pipeline.checks.tiny_project import write_tiny_assets
from pipeline.config import tasks
from pipeline.config.params import ParamsError, load_params
from pipeline.files.schema import FINETUNE_SUMMARY, IMPORTANCE_TABLE
from pipeline.run.experiment import Experiment
from pipeline.run.preflight import check_all
from pipeline.run.task import Task, UnknownStage
from stages import finetune, prepare, score

# The whole toy family: its params, its input checks, its Task and the two stages it has code of its own for.
TOY_FAMILY = {
    "__init__.py": '"""Toy sentiment: a tiny BERT on generated sentences, to show what a family is made of."""\n',
    "params.py": """
        from typing import Literal

        from pipeline.config.params import EvalParams, ExperimentSection, ScoreParams, Section


        class ToyModelParams(Section):
            attn_implementation: str = "eager"
            trust_remote_code: bool = False


        class ToyParams(ExperimentSection):
            task: Literal["toy"]
            experiment: str = "toy"
            seed: int = 0
            model: ToyModelParams = ToyModelParams()
            eval: EvalParams = EvalParams(batch_size=16)
            score: ScoreParams = ScoreParams(max_examples=32, batch_size=16)


        PARAMS = ToyParams
    """,
    "inputs.py": """
        from pathlib import Path


        def problems(params) -> list[str]:
            return [] if Path("data.csv").is_file() else ["data.csv: no such file; the toy task reads it"]
    """,
    "task.py": """
        from pipeline.data.evaluation import ClassificationEval, labelled_batches, make_eval_set
        from pipeline.run.task import Task


        class ToyTask(Task):
            name = "toy"

            def batches(self, data, batch_size):
                return labelled_batches(data, self.exp.tokenizer(), batch_size)

            def evaluation(self, split, max_examples=None):
                data = make_eval_set(self.exp.split(split), self.exp.tokenizer(), self.exp.params.eval.batch_size)
                return ClassificationEval(data, "accuracy", self.exp.runtime)


        TASK = ToyTask
    """,
    "prepare.py": """
        import shutil

        import datasets
        import pandas as pd

        from pipeline.run.task import Prepared


        def prepare(exp):
            shutil.copytree("tiny_model", exp.base_model_dir)
            rows = pd.read_csv("data.csv")
            tokenizer = exp.tokenizer()
            splits = datasets.DatasetDict({name: datasets.Dataset.from_pandas(part, preserve_index=False)
                                           for name, part in (("train", rows[:96]), ("dev", rows[96:128]),
                                                              ("test", rows[128:]))})
            tokenized = splits.map(lambda batch: tokenizer(batch["text"]), batched=True, remove_columns=["text"])
            tokenized = tokenized.rename_column("label", "labels")
            return Prepared(tokenized, {"metric": "accuracy", "num_labels": 2, "model": "tiny", "data": "toy",
                                        "data_attribution": None})
    """,
    "finetune.py": """
        from transformers import AutoModelForSequenceClassification

        from pipeline.run.task import Finetuned


        def finetune(exp):
            model = AutoModelForSequenceClassification.from_pretrained(exp.base_model_dir)
            scores = {split: exp.task.evaluation(split)(model)[0] for split in ("dev", "test")}
            return Finetuned(model, scores)
    """,
}


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder whose params name the toy task, with the toy family importable and registered."""
    package = tmp_path / "toy_family" / "toy"
    package.mkdir(parents=True)
    (package.parent / "__init__.py").write_text("")
    for name, source in TOY_FAMILY.items():
        (package / name).write_text(textwrap.dedent(source).lstrip())
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(tasks.TASK_PACKAGES, "toy", "toy_family.toy")
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    write_tiny_assets(project)
    (project / "params.yaml").write_text(yaml.safe_dump({"task": "toy", "experiment": "toy"}))
    yield project
    for module in [m for m in sys.modules if m.split(".")[0] == "toy_family"]:
        del sys.modules[module]


def test_the_registry_names_every_family_by_its_task() -> None:
    assert set(tasks.TASK_PACKAGES) == {"classification", "translation", "language-modeling"}
    for task in tasks.TASK_PACKAGES:
        assert tasks.family_module(task, "task").TASK.name == task
        assert tasks.family_module(task, "params").PARAMS.model_fields["task"].annotation.__args__ == (task,)


def test_a_registered_toy_family_is_validated_checked_and_run_by_the_generic_stages(toy: Path) -> None:
    params = load_params("params.yaml")
    assert type(params).__name__ == "ToyParams"
    assert check_all("params.yaml") == []
    for stage in (prepare, finetune, score):
        stage.main(["--params", "params.yaml"])
    exp = Experiment.from_params_file("params.yaml")
    assert isinstance(exp.task, Task) and exp.task.name == "toy"
    assert set(json.loads((exp.reports / FINETUNE_SUMMARY).read_text())) >= {"dev", "test"}
    assert (exp.reports / IMPORTANCE_TABLE).read_text().count("\n") == 2 * 4 + 1  # 2 layers x 4 heads, a header


def test_a_toy_family_keeps_its_params_one_line_errors_and_its_own_input_checks(toy: Path) -> None:
    (toy / "params.yaml").write_text(yaml.safe_dump({"task": "toy", "seed": "one"}))
    with pytest.raises(ParamsError, match=r"^invalid params: seed: .*\(got 'one'\)$"):
        load_params("params.yaml")
    (toy / "data.csv").unlink()
    (toy / "params.yaml").write_text(yaml.safe_dump({"task": "toy"}))
    assert check_all("params.yaml") == ["data.csv: no such file; the toy task reads it"]


def test_a_stage_the_toy_family_has_no_code_for_is_named_in_one_line(toy: Path) -> None:
    exp = Experiment.from_params_file("params.yaml")
    with pytest.raises(UnknownStage, match="^the toy task has no recover stage$"):
        exp.task.stage("recover")
