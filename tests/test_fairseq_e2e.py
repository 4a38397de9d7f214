"""The MT experiment on a fairseq checkpoint, end to end: `dvc repro mt-fairseq/dvc.yaml` with this repo's stage
code on the tiny fairseq model of tests/fairseq_toy.py (trained with fairseq-train) and its fairseq-preprocess
folder: prepare, finetune (evaluation only), ablate, score, prune, benchmark and report, with fairseq's
SequenceGenerator and sacrebleu, writing the tables of the Marian path and fairseq checkpoints of the pruned models.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from tests.tiny_project import MT_COLUMNS, make_pipeline_repo, ran_stages, run, traced_env, undeclared_params

if importlib.util.find_spec("fairseq") is None:
    if os.environ.get("CI"):
        raise ImportError("CI must install the fairseq extra (make setup) so that tests/test_fairseq_e2e.py runs")
    pytest.skip("the fairseq extra is not installed", allow_module_level=True)

from pipeline.core.importance import head_importance  # noqa: E402
from pipeline.core.sites import attention_sites  # noqa: E402
from pipeline.run.experiment import Experiment  # noqa: E402
from pipeline.tasks.translation import fairseq as fb  # noqa: E402
from stages import prepare  # noqa: E402

pytestmark = pytest.mark.slow  # runs `dvc repro mt-fairseq/dvc.yaml`

ROOT = Path(__file__).resolve().parents[1]
STAGES = ["prepare", "finetune", "ablate", "score", "prune", "benchmark", "report"]


def tiny_fairseq_params() -> dict:
    params = yaml.safe_load((ROOT / "mt-fairseq" / "params.yaml").read_text())
    params["experiment"] = "tiny-fairseq"
    params["model"].update(checkpoint="toy/checkpoint_last.pt", data_bin="toy/data-bin", post_process=None,
                           detokenize="moses")
    # Raw references for test (the toy corpus's own target file); dev scores the binarised targets.
    params["data"].update(max_train_pairs=200, max_eval_pairs=40, references={"test": "toy/test.tgt"})
    params["translate"].update(num_beams=2, batch_size=32, max_new_tokens=12)
    params["ablate"].update(split="test", max_examples=20, n_resamples=100)
    params["score"].update(split="train", max_examples=32, batch_size=16)
    params["prune"].update(step=0.25, max_fraction=0.75, save_fractions=[0.25, 0.5], max_examples=20,
                           random_seeds=[0], checkpoints=True)
    params["benchmark"].update(batch_sizes=[1, 4], new_tokens=4, repeats=1, turn_seconds=0)
    return params


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("params-trace")


@pytest.fixture(scope="module")
def repo(tmp_path_factory, fairseq_toy_checkpoint, trace_dir) -> Path:
    root = make_pipeline_repo(tmp_path_factory.mktemp("fairseq_repo"), "mt-fairseq", tiny_fairseq_params())
    # The user's checkpoint and data-bin, inside the repository as the README suggests (prepare's deps).
    (root / "toy").mkdir()
    shutil.copy(fairseq_toy_checkpoint, root / "toy" / "checkpoint_last.pt")
    shutil.copytree(fairseq_toy_checkpoint.parents[1] / "data-bin", root / "toy" / "data-bin")
    shutil.copy(fairseq_toy_checkpoint.parents[1] / "test.tgt", root / "toy" / "test.tgt")
    output = run(["dvc", "repro", "mt-fairseq/dvc.yaml"], root, traced_env(trace_dir))
    assert [s.removeprefix("mt-fairseq/dvc.yaml:") for s in ran_stages(output)] == STAGES
    return root


def test_every_stage_declares_the_params_it_reads(repo, trace_dir):
    stages = yaml.safe_load((repo / "mt-fairseq/dvc.yaml").read_text())["stages"]
    assert len(list(trace_dir.glob("*.json"))) == len(stages)
    assert undeclared_params(repo, "mt-fairseq/dvc.yaml", trace_dir) == {}


@pytest.fixture
def exp(repo, monkeypatch) -> Experiment:
    monkeypatch.chdir(repo)  # the params' paths are relative to the repository root
    return Experiment.from_params_file("mt-fairseq/params.yaml")


def test_the_checkpoint_is_evaluated_not_trained_with_sacrebleu(repo):
    finetune = json.loads((repo / "reports" / "tiny-fairseq" / "finetune.json").read_text())
    about = json.loads((repo / "reports" / "tiny-fairseq" / "about.json").read_text())
    assert about["metric"] == "bleu" and finetune["train_steps"] == 0 and about["num_beams"] == 2
    assert about["bleu_signature"].startswith("nrefs:1")
    assert finetune["dev"] >= 50 and finetune["test"] >= 50  # the toy task was learned
    assert about["model"].startswith("fairseq transformer toy/checkpoint_last.pt (2+2 layers, 4 heads")
    task = json.loads((repo / "artifacts" / "tiny-fairseq" / "data" / "task.json").read_text())
    assert task["sizes"] == {"train": 200, "dev": 20, "test": 40}  # valid has 20 pairs; the others are capped
    print(f"tiny fairseq model, beam 2: BLEU dev {finetune['dev']:.2f}, test {finetune['test']:.2f}")


def test_references_are_the_raw_file_or_the_detokenised_binarised_targets(repo, exp):
    raw = (repo / "toy" / "test.tgt").read_text().splitlines()
    test, dev = exp.split("test"), exp.split("dev")
    assert set(test["target"]) <= set(raw) and len(test) == 40
    model = exp.load(exp.base_model_dir)
    assert dev["target"][:] == [fb.to_text(model, torch.tensor(ids)) for ids in dev["labels"][:]]
    with pytest.raises(ValueError, match=r"test.tgt has 100 lines but the valid split has 20 sentence pairs"):
        fb.translation_splits(model, "toy/data-bin", references={"dev": "toy/test.tgt"})


def test_moses_detokenisation_joins_what_the_tokenizer_split():
    assert fb.detokenizer("moses", "fr")("C' est la vie , non ?") == "C'est la vie, non ?"
    assert fb.detokenizer(None, "fr") is None


def test_the_tables_have_the_columns_of_the_marian_path(repo):
    reports = repo / "reports" / "tiny-fairseq"
    for name, columns in MT_COLUMNS.items():
        assert pd.read_csv(reports / name).columns.tolist() == columns, name
    ablation = pd.read_csv(reports / "ablation.csv")
    assert ablation.groupby("kind").size().to_dict() == {"cross": 8, "decoder": 8, "encoder": 8}
    assert ablation.metric.between(0, 100).all() and ablation.p_value.between(0, 1).all()
    assert set(ablation.examples) == {20}
    curve = pd.read_csv(reports / "pruning_curve.csv")
    assert set(curve.method) == {"importance", "random", "importance-encoder", "importance-decoder",
                                 "importance-cross", "checkpoint-0"}
    assert curve.metric.between(0, 100).all()


def test_a_pruned_checkpoint_reloads_and_scores_what_the_curve_says(repo, exp):
    curve = pd.read_csv(repo / "reports" / "tiny-fairseq" / "pruning_curve.csv")
    expected = curve[(curve.method == "importance") & (curve.fraction_pruned == 0.5)].metric.item()
    # With the backend's own loader, as a user would: a fairseq checkpoint beside its dictionaries.
    folder = exp.pruned_dir(0.5)
    model = fb.load_checkpoint(folder / "checkpoint.pt", data_bin=folder, trust_checkpoint=True)
    assert sum(site.num_heads for site in attention_sites(model)) == 12  # of 24
    task_eval = exp.task.evaluation("test", exp.params.prune.max_examples)
    assert task_eval(model)[0] == pytest.approx(expected, abs=1e-9)


def test_the_benchmark_times_the_pruned_models(repo):
    bench = pd.read_csv(repo / "reports" / "tiny-fairseq" / "benchmark.csv")
    assert sorted(bench.fraction_pruned.unique()) == [0.0, 0.25, 0.5] and set(bench.attn_implementation) == {"eager"}
    assert (bench.ideal_speedup[bench.fraction_pruned > 0] > 1).all() and (bench.examples_per_s > 0).all()
    assert bench.params[bench.fraction_pruned == 0.5].max() < bench.params[bench.fraction_pruned == 0].min()
    md = (repo / "reports" / "tiny-fairseq" / "report.md").read_text()
    assert "BLEU" in md and "cross-attention" in md


def test_the_same_seed_gives_the_same_importance_and_a_second_repro_is_a_no_op(repo, exp):
    # The score stage's computation again, in this process: the seeded subset and the gradients must agree.
    table = pd.read_csv(repo / "reports" / "tiny-fairseq" / "importance.csv")
    raw = head_importance(exp.load(exp.finetuned_dir), exp.task.score_batches(), progress=False)
    assert torch.cat(raw).tolist() == pytest.approx(table.importance_raw.tolist(), rel=1e-6)
    assert ran_stages(run(["dvc", "repro", "mt-fairseq/dvc.yaml"], repo)) == []


def test_an_untrusted_checkpoint_stops_prepare_with_the_key_to_set(repo, tmp_path, monkeypatch):
    params = tiny_fairseq_params()
    params["model"].update(trust_checkpoint=False, checkpoint=str(repo / "toy" / "checkpoint_last.pt"),
                           data_bin=str(repo / "toy" / "data-bin"))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        prepare.main(["--params", "params.yaml"])
    message = str(stop.value.code)
    assert message.startswith("error: model.trust_checkpoint:") and "argparse.Namespace" in message
    assert "set model.trust_checkpoint: true only if you trust" in message and "\n" not in message
    assert not (tmp_path / "artifacts").exists()
