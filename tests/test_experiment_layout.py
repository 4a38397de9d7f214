"""Specification of an experiment's folder names (DVC outputs: a new name would orphan every cached artifact)
and of the shared names' light weight (the flows' command line validates params without torch)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config.params import parse_params
from pipeline.files.schema import WHOLE_PRUNE, at_level, checkpoint_name, checkpoint_step, name_and_level
from pipeline.run.experiment import Experiment

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("raw,artifacts", [({}, "artifacts/rt-minilm"),
                                           ({"task": "translation"}, "artifacts/tatoeba-marian")])
def test_experiment_folders_keep_their_names(raw, artifacts):
    exp = Experiment(parse_params(raw))
    assert exp.artifacts == Path(artifacts)
    assert [exp.base_model_dir, exp.data_dir, exp.finetuned_dir, exp.pruned_root, exp.checkpoints_dir] == [
        Path(artifacts, name) for name in ("base_model", "data", "finetuned", "pruned", "checkpoints")]
    assert [exp.pruned_dir(f) for f in (0.05, 0.3, 0.5, 0.7)] == [
        Path(artifacts, "pruned", name) for name in ("05", "30", "50", "70")]
    assert exp.budgeted_dir(0.4) == Path(artifacts, "pruned", "budgeted-40")


def test_checkpoint_folders_are_found_by_step_and_nothing_else_is(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exp = Experiment(parse_params({"task": "translation"}))
    assert exp.checkpoint_dirs() == {}  # before the finetune stage wrote any
    assert checkpoint_name(50) == "step-000050" and checkpoint_step("step-000050") == 50
    for step in (1000, 50, 250):
        (exp.checkpoints_dir / checkpoint_name(step)).mkdir(parents=True)
    (exp.checkpoints_dir / ".step-000300.x1y2").mkdir()  # a staging folder a killed save left behind
    (exp.checkpoints_dir / "step-000400").write_text("a file, not a checkpoint folder")
    (exp.checkpoints_dir / "step-latest").mkdir()
    assert exp.checkpoint_dirs() == {step: exp.checkpoints_dir / checkpoint_name(step) for step in (50, 250, 1000)}
    assert list(exp.checkpoint_dirs()) == [50, 250, 1000]


def test_summary_keys_give_back_the_name_and_level_they_were_made_of():
    for name, level in (("budgeted-tuned", 0.4), ("test", 0.05), (WHOLE_PRUNE, 0.6), ("budgeted-heads", 0.0)):
        assert name_and_level(at_level(name, level)) == (name, level)
    assert name_and_level("fisher_and_costs") == ("fisher_and_costs", None)  # a part that serves every level


def test_params_validation_imports_no_heavy_library():
    script = ("import sys, pipeline.config.params, pipeline.files.schema; "
              "print(*sorted(m for m in ('torch', 'transformers', 'datasets', 'pandas', 'numpy') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, capture_output=True,
                            text=True).stdout.split()
    assert loaded == []
