"""`finetune.epochs: 0`: a fine-tuned classifier is evaluated and kept as it is (its own head, reordered to the task's
labels when they are named), and any other model is refused in one line before the stage writes anything.

The stages run in this process, in a tiny project folder (tests/tiny_project.py's model and data), without DVC."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
import transformers
import yaml

from pipeline.checks.tiny_project import write_tiny_assets
from pipeline.config.params import ParamsError, parse_params
from pipeline.config.trace import TracedParams
from pipeline.core.checkpoint import load_model
from pipeline.data.evaluation import evaluate, make_eval_set
from pipeline.files.schema import FINETUNED_DIR
from pipeline.run.experiment import Experiment
from pipeline.tasks.classification.data import HeadMismatch, checkpoint_label_order
from pipeline.tasks.classification.finetune import finetune as finetune_classifier
from stages import finetune, prepare
from tests.tiny_project import ROOT, tiny_params, undeclared_params


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A folder with the tiny model and data, params for `finetune.epochs: 0`, and the stages' cwd set to it."""
    write_tiny_assets(tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write_params(root, model="tiny_model", **finetune_keys) -> None:
    params = tiny_params()
    params["model"]["name_or_path"] = model
    params["finetune"].update(epochs=0, **finetune_keys)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def save_classifier(root, name: str, num_labels: int = 2, id2label: dict | None = None, bare: bool = False):
    """A tiny 'fine-tuned' classifier (or bare encoder) in the tiny model's format, with a head whose predictions
    vary across examples; returns it."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(root / "tiny_model")
    config = transformers.BertConfig.from_pretrained(root / "tiny_model", num_labels=num_labels,
                                                     **({"id2label": id2label} if id2label else {}))
    torch.manual_seed(1)
    model = (transformers.BertModel if bare else transformers.BertForSequenceClassification)(config)
    if not bare:  # centre the logits on the tiny data, so that the predictions split between the labels
        sentences = pd.read_csv(root / "data.csv")["text"].tolist()
        with torch.no_grad():
            model.classifier.weight.mul_(50.0)
            logits = model.eval()(**tokenizer(sentences, return_tensors="pt", padding=True)).logits
            model.classifier.bias.sub_(logits.median(0).values)
    model.save_pretrained(root / name)
    tokenizer.save_pretrained(root / name)
    return model


def run_stages() -> Experiment:
    prepare.main(["--params", "params.yaml"])
    finetune.main(["--params", "params.yaml"])
    return Experiment.from_params_file("params.yaml")


def direct_scores(exp: Experiment, model) -> dict[str, float]:
    data, tokenizer = exp.splits(), exp.tokenizer()
    return {split: evaluate(model.eval(), make_eval_set(data[split], tokenizer, 32), exp.task_info()["metric"])[0]
            for split in ("dev", "test")}


def test_epochs_0_evaluates_the_checkpoint_as_it_is_and_keeps_its_own_head(project):
    original = save_classifier(project, "fine_tuned")
    write_params(project, "fine_tuned")
    exp = run_stages()
    result = json.loads((exp.reports / "finetune.json").read_text())
    assert result["train_steps"] == 0 and "train_loss_last" not in result  # metrics are numbers only, never null
    expected = direct_scores(exp, transformers.BertForSequenceClassification.from_pretrained(project / "fine_tuned"))
    assert (result["dev"], result["test"]) == (expected["dev"], expected["test"])
    assert 0 < np.mean(evaluate(original, make_eval_set(exp.splits()["test"], exp.tokenizer(), 32), "accuracy")[1]) < 1
    saved = load_model(exp.finetuned_dir)
    for name, value in original.state_dict().items():  # the head too: nothing initialised afresh
        assert torch.equal(saved.state_dict()[name], value), name


def test_epochs_0_reorders_a_named_head_to_the_tasks_labels(project):
    frame = pd.read_csv(project / "data.csv")
    frame["label"] = frame["label"].map({0: "neg", 1: "pos"})  # the task's labels: ("neg", "pos")
    frame.to_csv(project / "data.csv", index=False)
    original = save_classifier(project, "fine_tuned", id2label={0: "pos", 1: "neg"})
    write_params(project, "fine_tuned")
    exp = run_stages()
    saved = load_model(exp.finetuned_dir)
    assert saved.config.id2label == {0: "neg", 1: "pos"}
    assert torch.equal(saved.classifier.weight, original.classifier.weight.flip(0))
    batch = exp.tokenizer()(["good great film", "bad awful plot", "the movie was dull"], return_tensors="pt",
                            padding=True)
    assert torch.equal(saved(**batch).logits, original.eval()(**batch).logits.flip(-1))
    data, tokenizer = exp.splits(), exp.tokenizer()
    eval_set = make_eval_set(data["test"], tokenizer, 32)
    flipped = 1 - evaluate(original, eval_set, "accuracy")[1]  # the checkpoint's predictions, in the task's labels
    result = json.loads((exp.reports / "finetune.json").read_text())
    assert result["test"] == pytest.approx(100 * float(np.mean(flipped == eval_set.labels)))


@pytest.mark.parametrize("case", ["bare encoder", "head weights missing", "other num_labels", "other label names"])
def test_epochs_0_refuses_a_model_without_the_tasks_head_in_one_line_before_writing(project, case):
    if case == "bare encoder":
        save_classifier(project, "model", bare=True)
    elif case == "head weights missing":  # a classifier's config over an encoder's weights: the head would be new
        save_classifier(project, "model", bare=True)
        config = json.loads((project / "model" / "config.json").read_text())
        config["architectures"] = ["BertForSequenceClassification"]
        (project / "model" / "config.json").write_text(json.dumps(config))
    elif case == "other num_labels":
        save_classifier(project, "model", num_labels=3)
    else:
        frame = pd.read_csv(project / "data.csv")
        frame["label"] = frame["label"].map({0: "neg", 1: "pos"})
        frame.to_csv(project / "data.csv", index=False)
        save_classifier(project, "model", id2label={0: "negative", 1: "positive"})
    write_params(project, "model")
    prepare.main(["--params", "params.yaml"])
    with pytest.raises(SystemExit) as refused:
        finetune.main(["--params", "params.yaml"])
    message = str(refused.value)
    assert message.startswith("error: finetune.epochs: 0") and "model.name_or_path" in message
    assert "\n" not in message and "allowed:" in message
    if case == "head weights missing":
        assert "classifier." in message and "initialised at random" in message
    exp = Experiment.from_params_file("params.yaml")
    assert not (project / exp.artifacts / FINETUNED_DIR).exists()
    assert not (project / exp.reports / "finetune.json").exists()


def test_checkpoint_label_order_matches_names_case_aside_and_trusts_placeholder_names():
    arch = ["BertForSequenceClassification"]
    nli = ("entailment", "neutral", "contradiction")
    # textattack/bert-base-uncased-MNLI names its outputs LABEL_k, but they mean these (QData/TextAttack#684):
    textattack = ["contradiction", "entailment", "neutral"]
    assert checkpoint_label_order(arch, {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}, 3, 3, nli, textattack) == [1, 2, 0]
    assert checkpoint_label_order(arch, {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}, 3, 3, nli) == [0, 1, 2]
    assert checkpoint_label_order(arch, {0: "CONTRADICTION", 1: "NEUTRAL", 2: "ENTAILMENT"}, 3, 3, nli) == [2, 1, 0]
    assert checkpoint_label_order(arch, {0: "no", 1: "yes"}, 2, 2, None) == [0, 1]  # bare class ids: by order
    with pytest.raises(HeadMismatch, match="no sequence-classification head"):
        checkpoint_label_order(["BertModel"], {}, 2, 2, None)
    with pytest.raises(HeadMismatch, match="names 2 labels"):
        checkpoint_label_order(arch, {}, 3, 3, nli, ["entailment", "neutral"])


def test_head_labels_are_allowed_only_with_epochs_0():
    with pytest.raises(ParamsError, match="finetune.head_labels: only with epochs: 0"):
        parse_params({"finetune": {"epochs": 1, "head_labels": ["a", "b"]}})
    assert parse_params({"finetune": {"epochs": 0, "head_labels": ["a", "b"]}}).finetune.head_labels == ["a", "b"]


def test_head_labels_reorder_a_label_k_head_and_the_stage_reads_only_params_dvc_tracks(project):
    frame = pd.read_csv(project / "data.csv")
    frame["label"] = frame["label"].map({0: "neg", 1: "pos"})
    frame.to_csv(project / "data.csv", index=False)
    original = save_classifier(project, "fine_tuned")  # id2label LABEL_0, LABEL_1: the order is the user's word
    write_params(project, "fine_tuned", head_labels=["pos", "neg"])
    shutil.copy(ROOT / "dvc.yaml", project / "dvc.yaml")
    prepare.main(["--params", "params.yaml"])
    exp = Experiment.from_params_file("params.yaml")
    reads: set[str] = set()
    model = finetune_classifier(dataclasses.replace(exp, params=TracedParams(exp.params, reads))).model
    assert torch.equal(model.classifier.weight, original.classifier.weight.flip(0))
    assert "finetune.head_labels" in reads and "finetune.epochs" in reads
    (project / "trace").mkdir()
    (project / "trace" / "finetune.json").write_text(json.dumps(sorted(reads)))
    assert undeclared_params(project, "dvc.yaml", project / "trace") == {}
