"""The LM experiment end to end on a tiny configuration: `dvc repro llm/dvc.yaml` with this repo's stage code on a
few hundred generated sentences and a tiny grouped-query Llama trained from scratch: perplexity, ablation, scoring,
pruning in whole query units, recovery and the report, every stage declaring the params it reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pipeline.files.schema import WIDTH_METHODS
from tests.test_language_modeling import corpus, tiny_lm_params
from tests.tiny_project import make_pipeline_repo, ran_stages, run, traced_env, undeclared_params

pytestmark = pytest.mark.slow  # runs `dvc repro llm/dvc.yaml`

ROOT = Path(__file__).resolve().parents[1]
STAGES = ["prepare", "finetune", "ablate", "score", "prune", "width", "recover", "zero_shot", "benchmark", "export",
          "report"]


def tiny_llm_pipeline_params() -> dict:
    params = tiny_lm_params()
    params["eval"]["batch_size"] = 16
    params["ablate"].update(max_examples=20, n_resamples=100)
    params["score"].update(max_examples=32, batch_size=16)
    params["prune"].update(step=0.25, max_fraction=0.75, save_fractions=[0.25, 0.5], max_examples=20,
                           random_seeds=[0, 1])
    params["prune"]["budgeted"].update(levels=[0.2], fisher_examples=32, tune_examples=16, max_examples=20)
    params["prune"]["refit"] = True
    params["width"].update(methods=list(WIDTH_METHODS), compensations=["none", "bias", "refit"], levels=[0.25],
                           calibration_examples=8, window_tokens=8, eval_examples=4, batch_size=4,
                           held_out="held_out.txt", save_levels=[0.25])
    # Distillation (the KL and, as llm/params.yaml's, the next token) beside the next-token baseline, 5 steps of 16
    # windows of 12 tokens each.
    params["recover"].update(method="kd-lora", baselines=["lora"], tokens=960, batch_size=16, warmup_steps=1,
                             next_token_weight=1.0)
    params["benchmark"].update(batch_sizes=[1, 2], prompt_tokens=8, new_tokens=4, repeats=1, turn_seconds=0)
    return params


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("params-trace")


@pytest.fixture(scope="module")
def repo(tmp_path_factory, trace_dir) -> Path:
    root = make_pipeline_repo(tmp_path_factory.mktemp("llm_repo"), "llm", tiny_llm_pipeline_params())
    (root / "corpus.txt").write_text("\n".join(corpus(400)) + "\n")
    (root / "held_out.txt").write_text("\n".join(corpus(100, seed=3)) + "\n")
    first = run(["dvc", "repro", "llm/dvc.yaml"], root, traced_env(trace_dir))
    assert [s.removeprefix("llm/dvc.yaml:") for s in ran_stages(first)] == STAGES
    return root


def test_every_stage_declares_the_params_it_reads(repo, trace_dir):
    assert len(list(trace_dir.glob("*.json"))) == len(STAGES)
    assert undeclared_params(repo, "llm/dvc.yaml", trace_dir) == {}


def test_the_tables_speak_perplexity_with_positive_deltas_better(repo):
    reports = repo / "reports" / "tiny-lm"
    finetune = json.loads((reports / "finetune.json").read_text())
    assert json.loads((reports / "about.json").read_text())["metric"] == "perplexity" and finetune["train_steps"] == 20
    ablation = pd.read_csv(reports / "ablation.csv")
    assert set(ablation["kind"]) == {"decoder"} and len(ablation) == 8  # 2 layers x 4 query heads
    base = ablation["metric"] + ablation["delta"]  # delta = base - masked: the fall in perplexity
    assert base.round(6).nunique() == 1
    curve = pd.read_csv(reports / "pruning_curve.csv")
    assert set(curve["split"]) == {"dev", "test"} and {"importance", "random"} <= set(curve["method"])
    # Whole query units under grouped-query attention: one head from each of a layer's two groups at a time.
    assert set(curve["heads_pruned"]) <= {0, 2, 4, 6}
    assert "within 5% perplexity" in (reports / "report.md").read_text()


def test_a_second_repro_runs_nothing(repo):
    assert ran_stages(run(["dvc", "repro", "llm/dvc.yaml"], repo)) == []


def test_other_tools_criteria_and_budgeted_methods_are_compared_at_equal_heads_and_flops(repo):
    reports = repo / "reports" / "tiny-lm"
    curve = pd.read_csv(reports / "pruning_curve.csv")
    by_method = {m: sorted(set(rows.heads_pruned)) for m, rows in curve.groupby("method")}
    assert by_method["magnitude"] == by_method["activation"] == by_method["importance"]
    budgeted = pd.read_csv(reports / "budgeted_curve.csv")
    assert {"paper", "budgeted-heads", "budgeted", "budgeted-tuned"} <= set(budgeted.method)


def test_the_serving_shape_halves_the_kv_cache_and_loads_with_stock_transformers(repo):
    reports = repo / "reports" / "tiny-lm"
    bench = pd.read_csv(reports / "llm_benchmark.csv")
    kv = bench.drop_duplicates("model").set_index("model").kv_bytes_per_token
    assert kv["50% of KV groups"] * 2 == kv["unpruned"]
    assert set(bench.phase) == {"prefill", "decode"} and set(bench.batch_size) == {1, 2}
    shapes = pd.read_csv(reports / "kv_groups.csv")
    assert shapes.fraction_removed.tolist() == [0.5, 0.5] and shapes.kv_heads.tolist() == [1, 1] and shapes.stock.all()
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(repo / "artifacts/tiny-lm/pruned/kv-groups-50")
    assert model.config.num_key_value_heads == 1 and model.config.num_attention_heads == 2


def test_the_prune_stage_refuses_a_uniform_level_the_shape_cannot_take_in_one_line_and_writes_nothing(repo):
    """The checks refuse it before prepare when they know the shape; the prune stage, which always does, refuses it
    too, before it saves a model: 4 query heads in 2 groups a layer lose 2 or none alike, so 30% is no level."""
    import yaml

    params = yaml.safe_load((repo / "llm" / "params.yaml").read_text())
    params["prune"].update(uniform=True, save_fractions=[0.5, 0.3])
    (repo / "llm" / "uniform.yaml").write_text(yaml.safe_dump(params))
    written = [repo / "artifacts" / "tiny-lm" / "pruned", repo / "reports" / "tiny-lm"]
    before = {p: p.stat().st_mtime_ns for folder in written for p in folder.rglob("*")}
    result = subprocess.run([sys.executable, "-m", "stages.prune", "--params", "llm/uniform.yaml"], cwd=repo,
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(repo)})
    assert result.returncode == 1 and result.stderr.strip().splitlines()[-1] == (
        "error: prune.save_fractions: 0.3 of the heads cannot go alike from 2 attention layers of 4 query heads in 2 "
        "key/value groups, taken in whole units of 2 (one from each group); the levels it can save are 0.5")
    assert "Traceback" not in result.stderr
    assert {p: p.stat().st_mtime_ns for folder in written for p in folder.rglob("*")} == before


def test_recovery_saves_every_pruned_model_by_each_method_and_recovers_the_unpruned_one_alike_as_the_control(repo):
    recovery = pd.read_csv(repo / "reports" / "tiny-lm" / "recovery.csv")
    controls = recovery[recovery["model"] == "unpruned"]
    assert list(controls["method"]) == ["kd-lora", "lora"] and (controls["fraction_pruned"] == 0).all()
    assert (controls["metric_before"] == controls["metric_unpruned"]).all()
    # Distilled with the next token beside the KL (recover.next_token_weight: 1), the control, whose KL from itself is
    # 0, still learns the next token: both controls move.
    kd, lora = controls.iloc[0], controls.iloc[1]
    assert kd["metric_after"] != kd["metric_before"] and lora["metric_after"] != lora["metric_before"]
    assert (recovery["params_removed"][recovery["model"] != "unpruned"] > 0).all()
    assert set(recovery["tokens"]) == {5 * 16 * 12} and set(recovery["steps"]) == {5}  # the budget, in full windows
    recovered = repo / "artifacts" / "tiny-lm" / "recovered"
    for method in ("kd-lora", "lora"):
        assert {p.name for p in (recovered / method).iterdir()} == {"25", "50", "kv-groups-50", "width-25"}
    report = (repo / "reports" / "tiny-lm" / "report.md").read_text()
    assert "adaptation to the fine-tuning data" in report and "net of the control" in report


def test_every_width_method_is_compared_at_equal_parameters_on_both_corpora_and_ours_is_saved_stock(repo):
    reports = repo / "reports" / "tiny-lm"
    table = pd.read_csv(reports / "width_curve.csv")
    pruned = table[table["method"] != "unpruned"]
    assert set(pruned["method"]) == {"llm-pruner", "flap", "wanda-sp", "minitron", "magnitude", "paper-importance",
                                     "ours"}
    assert set(table["corpus"]) == {"test", "held_out.txt"}
    # FLAP's bias adds a bias to every projection of every layer: a few percent of this tiny model, 0.15% of SmolLM2.
    unbiased = pruned["compensation"] != "bias"
    assert (pruned[unbiased]["params_removed"] >= 0.25).all() and (pruned["params_removed"] >= 0.2).all()
    assert set(pruned[pruned["method"] == "flap"]["compensation"]) == {"bias", "none", "refit"}
    assert set(json.loads((reports / "width.json").read_text())) == {"unpruned", "ours", "best_peer", "precision"}
    record = json.loads((repo / "artifacts" / "tiny-lm" / "width" / "width-25" / "head_pruning.json").read_text())
    assert record["stock"]
    assert "25% of parameters (width)" in set(pd.read_csv(reports / "recovery.csv")["model"])
    assert "importance+refit" in set(pd.read_csv(reports / "pruning_curve.csv")["method"])


def test_the_export_stage_lists_every_saved_model_with_its_gguf_file_or_one_line_why_not(repo):
    # The scratch Llama's own BPE tokenizer is neither of the two GGUF export writes (tests/test_gguf_export.py
    # exports and reads back real ones): each saved model is listed, refused in one line, never half-written.
    table = pd.read_csv(repo / "reports" / "tiny-lm" / "gguf.csv")
    assert set(table["model"]) == {"25% of heads (query)", "50% of heads (query)", "50% of KV groups",
                                   "25% of parameters (width)"}
    reasons = dict(zip(table["model"], table["not_exported_because"], strict=True))
    assert "layers differ" in reasons["25% of heads (query)"]
    assert "tokenizer" in reasons["25% of parameters (width)"] and "\n" not in reasons["50% of KV groups"]
    assert not list((repo / "artifacts" / "tiny-lm" / "gguf").glob("*.gguf"))
