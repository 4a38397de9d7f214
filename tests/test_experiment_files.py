"""The paper-scale experiment files (experiments/*.yaml): each is a valid params file of the paper's setup, and the
flows' command line takes each, alone or as a sweep member, without running the pipeline here."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from pipeline.config.params import load_params
from pipeline.flows import dvc_flows as flows

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted((ROOT / "experiments").glob("bert-base-*.yaml"))  # the paper's
# The offline tasks with the default model (`make repro-tasks`): file (= experiment) -> data.source.
OFFLINE_FILES = {"trec-minilm": "trec", "disaster-tweets-minilm": "disaster-tweets"}
PAPER_TASKS = {"glue/mnli": "accuracy", "glue/sst2": "accuracy", "glue/cola": "matthews", "glue/mrpc": "f1"}


@pytest.mark.parametrize("stem", OFFLINE_FILES)
def test_every_offline_task_file_is_params_yaml_on_another_source_on_whole_splits(stem):
    path = ROOT / "experiments" / f"{stem}.yaml"
    params, default = load_params(path), load_params(ROOT / "params.yaml")
    assert (params.experiment, params.data.source) == (stem, OFFLINE_FILES[stem])
    assert params.prune.max_examples is None and params.prune.budgeted.max_examples is None
    assert params.model == default.model and params.score == default.score and params.runtime == default.runtime
    assert set(yaml.safe_load((ROOT / "params.yaml").read_text())) <= set(yaml.safe_load(path.read_text()))
    assert f"experiments/{stem}.yaml" in (ROOT / "Makefile").read_text()  # make repro-tasks runs it


def test_there_is_one_file_per_paper_experiment_and_the_mnli_checkpoint_as_is():
    names = {f.stem for f in FILES}
    assert {"bert-base-mnli", "bert-base-sst2", "bert-base-cola", "bert-base-mrpc", "bert-base-mnli-as-is"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_experiment_file_validates_as_the_papers_setup_on_whole_splits(path):
    params = load_params(path)  # parse_params, one line naming the key on any error
    assert params.task == "classification" and params.experiment == path.stem
    assert params.data.metric == PAPER_TASKS[params.data.source] and params.data.max_length == 128
    assert params.runtime.device == "auto" and params.runtime.precision in ("fp32", "bf16")
    assert params.ablate.max_examples is None and params.prune.max_examples is None
    assert params.prune.budgeted.max_examples is None
    assert params.prune.step == 0.1 and params.prune.max_fraction == 0.9
    if params.finetune.epochs == 0:  # a fine-tuned checkpoint pruned as it is: a hub id, not the base model
        assert params.model.name_or_path != "bert-base-uncased" and "/" in params.model.name_or_path
    else:
        assert params.model.name_or_path == "bert-base-uncased"
        assert (params.finetune.epochs, params.finetune.learning_rate, params.finetune.batch_size) == (3, 2e-5, 32)
    # DVC needs every param a stage declares in the file: the same sections as params.yaml, no fewer.
    assert set(yaml.safe_load((ROOT / "params.yaml").read_text())) <= set(yaml.safe_load(path.read_text()))


@pytest.fixture
def calls(monkeypatch):
    """The flows the command line would start, recorded instead of run."""
    recorded = []

    class Sweep:
        def with_options(self, **options):
            return lambda *args, **kwargs: recorded.append(("sweep", args, kwargs))

    monkeypatch.setattr(flows, "experiment", lambda *args, **kwargs: recorded.append(("experiment", args, kwargs)))
    monkeypatch.setattr(flows, "sweep", Sweep())
    monkeypatch.chdir(ROOT)
    return recorded


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_the_experiment_command_takes_each_file(calls, path):
    relative = str(path.relative_to(ROOT))
    flows.main(["experiment", "--params-file", relative])
    [(name, args, kwargs)] = calls
    assert name == "experiment" and args[:3] == ({}, ".", "dvc.yaml") and kwargs["params_file"] == relative


def test_the_sweep_command_makes_one_member_per_file(calls):
    relative = [str(p.relative_to(ROOT)) for p in FILES]
    flows.main(["sweep", "paper", *[arg for f in relative for arg in ("--member-file", f)]])
    [(name, args, kwargs)] = calls
    members, sweep_name = args[0], args[1]
    assert name == "sweep" and sweep_name == "paper"
    assert members == {Path(f).stem: {} for f in relative}
    assert kwargs["params_files"] == {Path(f).stem: f for f in relative}


def test_the_wmt14_fairseq_setup_runs_on_its_own_pipeline_and_not_on_the_classification_one(calls):
    flows.main(["experiment", "--pipeline", "mt-fairseq/dvc.yaml", "--params-file", "mt-fairseq/params.yaml"])
    assert calls[0][2]["params_file"] == "mt-fairseq/params.yaml"
    with pytest.raises(SystemExit, match=r"^error: mt-fairseq/params.yaml: a translation experiment, but the "
                                         r"pipeline runs classification experiments; give --pipeline mt/dvc.yaml"):
        flows.main(["sweep", "mixed", "--member-file", "experiments/bert-base-sst2.yaml",
                    "--member-file", "mt-fairseq/params.yaml"])
    assert len(calls) == 1  # nothing started for the refused sweep


def test_a_wrong_experiment_file_is_refused_in_one_line_before_any_flow_starts(calls, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "experiments" / "bert-base-sst2.yaml").read_text().replace("step: 0.1", "step: 0.7"))
    with pytest.raises(SystemExit) as refused:
        flows.main(["experiment", "--params-file", str(bad)])
    assert str(refused.value).startswith("error: invalid params: prune.step:") and "\n" not in str(refused.value)
    with pytest.raises(SystemExit, match="not found"):
        flows.main(["sweep", "x", "--member-file", "experiments/no-such-file.yaml"])
    assert calls == []


def test_a_params_file_replaces_the_workspaces_params_then_the_overrides_apply_keeping_comments(tmp_path):
    (tmp_path / "experiments").mkdir()
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    source = ROOT / "experiments" / "bert-base-mrpc.yaml"
    shutil.copy(source, tmp_path / "experiments" / source.name)
    flows.use_params_file(tmp_path, "dvc.yaml", "experiments/bert-base-mrpc.yaml", {"seed": 3})
    written = (tmp_path / "params.yaml").read_text()
    assert yaml.safe_load(written) == {**yaml.safe_load(source.read_text()), "seed": 3}
    assert "# The paper's BERT experiment on MRPC" in written
    before = (tmp_path / "params.yaml").stat().st_mtime_ns
    flows.use_params_file(tmp_path, "dvc.yaml", "experiments/bert-base-mrpc.yaml", {"seed": 3})
    assert (tmp_path / "params.yaml").stat().st_mtime_ns == before  # unchanged: not rewritten
