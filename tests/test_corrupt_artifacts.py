"""A damaged or missing artifact of an earlier stage ends a stage with one line naming the file and the stage to
rerun, and no traceback; a genuine bug keeps its traceback. And the user's model runs its own code only when
`model.trust_remote_code` says so."""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import transformers
import yaml

from pipeline.checks.tiny_project import make_tiny_project, tool_env, write_tiny_assets
from pipeline.config.params import load_params
from pipeline.core.checkpoint import load_model, save_model
from pipeline.core.surgery import prune_heads
from pipeline.files.artifacts import (
    DamagedArtifact,
    MissingArtifact,
    artifact_excepthook,
    producing_stage,
)
from pipeline.files.schema import FAIRSEQ_CHECKPOINT, PRUNING_FILE, TASK_FILE
from pipeline.methods.pruning import importance_by_site
from pipeline.report.inputs import Inputs
from pipeline.run.experiment import Experiment
from pipeline.tasks.classification.finetune import base_classifier, checkpoint_classifier
from tests.tiny_models import tiny_model

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = yaml.safe_load((ROOT / "params.yaml").read_text())["experiment"]
MT_EXPERIMENT = yaml.safe_load((ROOT / "mt" / "params.yaml").read_text())["experiment"]


@pytest.fixture(autouse=True)
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory with this repository's pipelines (dvc.yaml and params files), where stages run."""
    for name in ("dvc.yaml", "params.yaml", "mt/dvc.yaml", "mt/params.yaml"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def line(error: DamagedArtifact | MissingArtifact, params_file: str = "params.yaml") -> str:
    """The line a stage run with `params_file` prints for `error`."""
    return error.line(producing_stage(error.path, params_file))


@pytest.fixture
def pruned() -> Path:
    """A pruned model folder where the prune stage writes one (artifacts/<experiment>/pruned/30)."""
    model = prune_heads(tiny_model("bert"), {0: [1, 3], 1: [0]})
    return save_model(model, Path("artifacts", EXPERIMENT, "pruned", "30"))


# --- models -------------------------------------------------------------------------------------
def test_a_truncated_safetensors_names_the_file_and_the_stage_to_rerun(pruned: Path) -> None:
    weights = pruned / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])  # the end of the tensors lost
    with pytest.raises(DamagedArtifact) as caught:
        load_model(pruned)
    assert caught.value.path == weights
    assert "deserializing header" in caught.value.what
    assert line(caught.value) == (
        f"error: artifacts/{EXPERIMENT}/pruned/30/model.safetensors is damaged (Error while deserializing "
        f"header: incomplete metadata, file not fully covered); it is an output of stage 'prune': rerun it with "
        f"dvc repro -f -s prune")


def test_a_truncated_safetensors_of_an_unpruned_folder_is_damaged_too(tmp_path: Path) -> None:
    tiny_model("bert").save_pretrained(tmp_path / "finetuned")
    weights = tmp_path / "finetuned" / "model.safetensors"
    weights.write_bytes(b"")
    with pytest.raises(DamagedArtifact, match="header too small") as caught:
        load_model(tmp_path / "finetuned")
    assert caught.value.path == weights


def test_a_truncated_fairseq_checkpoint_of_a_stage_names_the_stage(tmp_path: Path) -> None:
    pytest.importorskip("fairseq")
    for name in ("mt-fairseq/dvc.yaml", "mt-fairseq/params.yaml"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    exp = Experiment(load_params("mt-fairseq/params.yaml"), "mt-fairseq/params.yaml")
    exp.finetuned_dir.mkdir(parents=True)
    (exp.finetuned_dir / FAIRSEQ_CHECKPOINT).write_bytes(b"PK\x03\x04 cut short")
    with pytest.raises(DamagedArtifact) as caught:
        exp.load(exp.finetuned_dir)
    assert line(caught.value, "mt-fairseq/params.yaml").endswith(
        "it is an output of stage 'mt-fairseq/dvc.yaml:finetune': rerun it with dvc repro -f -s "
        "mt-fairseq/dvc.yaml:finetune")


@pytest.mark.parametrize("damage", ["{not json", json.dumps({"format_version": 2, "sites": []}), "[]"])
def test_a_damaged_head_pruning_json_names_the_file(pruned: Path, damage: str) -> None:
    (pruned / PRUNING_FILE).write_text(damage)
    with pytest.raises(DamagedArtifact) as caught:
        load_model(pruned)
    assert caught.value.path == pruned / PRUNING_FILE
    assert str(pruned) not in caught.value.what  # named once, by the line, not again in the parenthesis


def test_a_damaged_record_is_still_a_value_error_for_the_callers_that_catch_one(pruned: Path) -> None:
    (pruned / PRUNING_FILE).write_text("{not json")
    with pytest.raises(ValueError, match=PRUNING_FILE):
        load_model(pruned)


# --- data, task.json, tables ----------------------------------------------------------------------
@pytest.fixture
def experiment() -> Experiment:
    """An experiment of the repository's params, with none of its artifacts yet."""
    return Experiment(load_params("params.yaml"), "params.yaml")


def test_a_damaged_task_json_names_the_prepare_stage(experiment: Experiment) -> None:
    experiment.data_dir.mkdir(parents=True)
    (experiment.data_dir / TASK_FILE).write_text('{"num_labels": 2, "lab')
    with pytest.raises(DamagedArtifact) as caught:
        experiment.task_info()
    assert line(caught.value).startswith(f"error: artifacts/{EXPERIMENT}/data/task.json is damaged (")
    assert line(caught.value).endswith("it is an output of stage 'prepare': rerun it with dvc repro -f -s prepare")


def test_damaged_splits_name_the_data_folder(experiment: Experiment) -> None:
    experiment.data_dir.mkdir(parents=True)
    (experiment.data_dir / "dataset_dict.json").write_text("{trunc")
    with pytest.raises(DamagedArtifact) as caught:
        experiment.splits()
    assert caught.value.path == experiment.data_dir


def test_a_stage_run_out_of_order_names_the_stage_to_run_first_with_what_it_needs(experiment: Experiment) -> None:
    with pytest.raises(MissingArtifact) as caught:
        experiment.load(experiment.finetuned_dir)
    assert line(caught.value) == (f"error: artifacts/{EXPERIMENT}/finetuned is missing; it is an output of stage "
                                  f"'finetune': run it with dvc repro finetune")


@pytest.mark.parametrize(("text", "what"), [
    ('kind,layer,head,importance\nencoder,0,0,"0.5', "EOF inside string"),
    ("", "No columns to parse from file"),
    ("kind,layer,head\nencoder,0,0\n", "missing columns importance"),
    ("kind,layer,head,importance\nencoder,0,0,0.5\n", r"1 heads for encoder layer 0, the model has 4"),
])
def test_a_damaged_csv_names_the_file_and_the_stage_that_writes_it(experiment: Experiment, text: str,
                                                                   what: str) -> None:
    experiment.reports.mkdir(parents=True)
    (experiment.reports / "importance.csv").write_text(text)
    with pytest.raises(DamagedArtifact, match=what) as caught:
        importance_by_site(tiny_model("bert"), experiment.reports / "importance.csv")  # what the prune stage reads
    assert line(caught.value).endswith("it is an output of stage 'score': rerun it with dvc repro -f -s score")


def test_the_report_refuses_a_damaged_table_and_a_damaged_metrics_file(tmp_path: Path) -> None:
    (tmp_path / "recovery.csv").write_text("fraction_pruned,metric_before\n0.5,0.9\n")
    with pytest.raises(DamagedArtifact, match="missing columns metric_after"):
        Inputs.load(tmp_path)
    (tmp_path / "recovery.csv").unlink()
    (tmp_path / "finetune.json").write_text('{"metric": ')
    with pytest.raises(DamagedArtifact) as caught:
        Inputs.load(tmp_path)
    assert caught.value.path == tmp_path / "finetune.json"


def test_the_stage_is_found_in_the_pipeline_of_the_params_file() -> None:
    checkpoint = f"artifacts/{MT_EXPERIMENT}/checkpoints/step-000100/model.safetensors"
    # Addressed as `dvc repro` takes a stage of another pipeline's dvc.yaml from the repository root.
    assert producing_stage(checkpoint, "mt/params.yaml") == "mt/dvc.yaml:finetune"
    assert producing_stage(f"reports/{MT_EXPERIMENT}/pruning_curve.csv", "mt/params.yaml") == "mt/dvc.yaml:prune"
    assert producing_stage("somewhere/else.csv", "params.yaml") is None
    assert MissingArtifact("somewhere/else.csv").line(None) == ("error: somewhere/else.csv is missing; rerun the "
                                                                "stage that writes it")


# --- the entry point ------------------------------------------------------------------------------
def test_the_hook_prints_one_line_for_an_artifact_and_leaves_a_bug_its_traceback(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    seen = []
    monkeypatch.setattr(sys, "excepthook", lambda *exc: seen.append(exc[1]))
    hook = artifact_excepthook("params.yaml")
    hook(MissingArtifact, MissingArtifact(f"artifacts/{EXPERIMENT}/data"), None)
    assert capsys.readouterr().err == (f"error: artifacts/{EXPERIMENT}/data is missing; it is an output of stage "
                                       f"'prepare': run it with dvc repro prepare\n")
    bug = KeyError("a genuine bug")
    hook(KeyError, bug, None)
    assert seen == [bug]  # handed to the previous hook: Python's, which prints the traceback


def test_an_artifact_error_survives_the_trip_back_from_a_dask_worker() -> None:
    for error in (DamagedArtifact("reports/x/importance.csv", "no columns"), MissingArtifact("artifacts/x/data")):
        back = pickle.loads(pickle.dumps(error))
        assert (type(back), back.path, back.what) == (type(error), error.path, error.what)


@pytest.mark.slow  # runs stages in subprocesses on a tiny project
def test_a_stage_on_a_truncated_model_exits_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    project = tmp_path / "tiny"
    project.mkdir()
    make_tiny_project(project)
    env = tool_env()

    def stage(name: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", f"stages.{name}"], cwd=project, env=env, capture_output=True,
                              text=True)

    assert stage("prepare").returncode == 0
    artifacts = project / "artifacts" / "tiny"
    # The prepared model stands in for the fine-tuned one: what the score stage reads is a model folder.
    shutil.copytree(artifacts / "base_model", artifacts / "finetuned")
    weights = artifacts / "finetuned" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-500])
    result = stage("score")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    errors = [text for text in result.stderr.splitlines() if text.startswith("error:")]
    assert errors == ["error: artifacts/tiny/finetuned/model.safetensors is damaged (Error while deserializing "
                      "header: incomplete metadata, file not fully covered); it is an output of stage 'finetune': "
                      "rerun it with dvc repro -f -s finetune"]


# --- trust ------------------------------------------------------------------------------------------
@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """The kwargs of every Hugging Face `from_pretrained` (configs, tokenizers, models), which still load."""
    calls: list[dict] = []
    for owner in (transformers.AutoConfig, transformers.AutoTokenizer, transformers.PreTrainedModel,
                  transformers.AutoModelForSequenceClassification):
        original = owner.from_pretrained.__func__

        def spy(cls, *args, _original=original, **kwargs):
            calls.append(kwargs)
            return _original(cls, *args, **kwargs)

        monkeypatch.setattr(owner, "from_pretrained", classmethod(spy))
    return calls


def model_loading_experiment(tmp_path: Path, **model: object) -> Experiment:
    """An experiment whose base model and fine-tuned model are tiny folders, with `model` params set."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["model"].update(model)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    exp = Experiment(load_params(tmp_path / "params.yaml"), "params.yaml")
    write_tiny_assets(tmp_path)
    shutil.copytree(tmp_path / "tiny_model", exp.base_model_dir)
    shutil.copytree(tmp_path / "tiny_model", exp.finetuned_dir)
    exp.data_dir.mkdir(parents=True)
    (exp.data_dir / TASK_FILE).write_text(json.dumps({"num_labels": 2, "label_names": None, "model": "tiny"}))
    return exp


def load_everything(exp: Experiment) -> None:
    exp.tokenizer()
    base_classifier(exp)
    checkpoint_classifier(exp)
    exp.load(exp.finetuned_dir)
    exp.load(save_model(exp.load(exp.finetuned_dir), exp.pruned_dir(0.0)))


def test_by_default_no_load_trusts_remote_code(tmp_path: Path, loads: list[dict]) -> None:
    load_everything(model_loading_experiment(tmp_path))
    assert len(loads) >= 5
    assert all(call.get("trust_remote_code") is False for call in loads), loads


def test_trust_remote_code_reaches_every_load_when_the_user_sets_it(tmp_path: Path, loads: list[dict]) -> None:
    load_everything(model_loading_experiment(tmp_path, trust_remote_code=True))
    assert len(loads) >= 5
    assert all(call.get("trust_remote_code") is True for call in loads), loads
