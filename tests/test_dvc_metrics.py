"""`dvc metrics show` is one table people can read and diff (issue 44): every declared metrics file holds a few
numbers from one small vocabulary of keys (files/schema.py's METRICS_KEYS), with the precision its models ran at
beside them, and a fresh clone shows them with no warning in at most 30 columns."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml

from pipeline.files.schema import (
    BUDGETED_BENCHMARK_TABLE,
    METRICS_KEYS,
    METRICS_PER_FILE,
    METRICS_UNION,
    PRECISION_METRIC,
    PRECISIONS,
    ROUNDED_WIDTHS,
    SEARCHED_WIDTHS,
    TABLE_COLUMNS,
    UNPRUNED_MODEL,
    kv_groups_label,
)
from pipeline.methods.speedups import headline_speedups
from pipeline.run.task import training_summary

ROOT = Path(__file__).resolve().parents[1]
PIPELINES = ("dvc.yaml", "mt/dvc.yaml", "mt-fairseq/dvc.yaml", "llm/dvc.yaml")
ENV = {**os.environ, "DVC_NO_ANALYTICS": "1", "TQDM_DISABLE": "1"}


def flattened(value: object, prefix: str = "") -> Iterator[tuple[str, object]]:
    """(key, leaf) pairs of a metrics file as `dvc metrics show` flattens them: "dev.prunable_fraction"."""
    if isinstance(value, Mapping):
        for key, inner in value.items():
            yield from flattened(inner, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, value


def declared_metrics(pipeline: str) -> list[Path]:
    """The metrics files a pipeline file declares, its ${experiment} from the params.yaml beside it."""
    path = ROOT / pipeline
    experiment = yaml.safe_load((path.parent / "params.yaml").read_text())["experiment"]
    found = []
    for stage in yaml.safe_load(path.read_text())["stages"].values():
        for entry in stage.get("metrics") or []:
            name = next(iter(entry)) if isinstance(entry, Mapping) else entry
            found.append(ROOT / name.replace("${experiment}", experiment))
    return found


def committed_metrics() -> list[Path]:
    return [path for pipeline in PIPELINES for path in declared_metrics(pipeline) if path.is_file()]


def assert_numbers_only_and_few(name: str, content: Mapping) -> set[str]:
    leaves = dict(flattened(content))
    # The one string: the precision the stage's models ran at (what runtime.precision: auto resolved to).
    assert leaves.get(PRECISION_METRIC, "fp32") in PRECISIONS, f"{name}: precision not one of {PRECISIONS}"
    bad = {k: v for k, v in leaves.items()
           if k != PRECISION_METRIC and (isinstance(v, bool) or not isinstance(v, (int, float)))}
    assert not bad, f"{name}: not numbers (a table of them is what dvc metrics diff compares): {bad}"
    assert len(leaves) <= METRICS_PER_FILE, f"{name}: {len(leaves)} numbers, more than {METRICS_PER_FILE}"
    assert set(leaves) <= set(METRICS_KEYS[Path(name).name]), f"{name}: keys outside METRICS_KEYS"
    return set(leaves)


def test_the_metrics_vocabulary_is_small_enough_for_one_readable_table():
    keys = {key for names in METRICS_KEYS.values() for key in names}
    assert len(keys) <= METRICS_UNION <= 29  # with the Path column, 30
    assert all(len(names) <= METRICS_PER_FILE for names in METRICS_KEYS.values())


def test_every_declared_metrics_file_is_one_of_the_vocabularys_files():
    names = {path.name for pipeline in PIPELINES for path in declared_metrics(pipeline)}
    assert names <= set(METRICS_KEYS)


def test_every_committed_metrics_file_holds_a_few_numbers_and_their_union_is_at_most_29_keys():
    paths = committed_metrics()
    assert {p.name for p in paths} >= {"finetune.json", "ablate.json", "prune.json", "benchmark.json",
                                       "zero_shot.json"}
    union: set[str] = set()
    for path in paths:
        union |= assert_numbers_only_and_few(str(path.relative_to(ROOT)), json.loads(path.read_text()))
    assert len(union) <= METRICS_UNION


def test_finetune_metrics_leave_out_the_loss_of_a_model_that_was_not_trained():
    assert training_summary([], 3.4) == {"train_steps": 0, "train_seconds": 3}
    trained = training_summary([2.0, 1.5], 10.0)
    assert trained == {"train_steps": 2, "train_seconds": 10, "train_loss_last": 1.5}
    assert_numbers_only_and_few("finetune.json", {"dev": 80.0, "test": 79.0, **trained})


def _speed_rows(levels: list[tuple[float, str]], column: str, **extra) -> list[dict]:
    return [dict(attn_implementation="sdpa", batch_size=batch, precision=precision, **{column: level}, widths=widths,
                 speedup=1 + level + (batch == 64) + (precision == "bf16"), ideal_speedup=1 + 2 * level, **extra)
            for level, widths in levels for batch in (1, 64) for precision in ("fp32", "bf16")]


def test_the_benchmark_headline_is_the_most_pruned_saved_model_at_the_largest_batch_and_the_runtimes_precision():
    table = pd.DataFrame(_speed_rows([(0.0, ""), (0.3, ""), (0.5, "")], "fraction_pruned"))
    budgeted = pd.DataFrame(_speed_rows([(0.0, "full"), (0.4, ROUNDED_WIDTHS), (0.4, SEARCHED_WIDTHS)],
                                        "budget_removed"))
    budgeted.loc[budgeted.widths == SEARCHED_WIDTHS, "speedup"] = 9.0  # the twin as searched is not the saved model
    summary = headline_speedups(table, budgeted, 64, "sdpa", "fp32")
    assert summary == {"fraction_pruned": 0.5, "batch_size": 64, "speedup": 2.5, "ideal_speedup": 2.0,
                       "budgeted": {"budget_removed": 0.4, "speedup": 2.4, "ideal_speedup": 1.8}}
    assert_numbers_only_and_few("benchmark.json", summary)
    # Translation has no budgeted models: the part is left out, not written empty or null.
    empty = pd.DataFrame(columns=TABLE_COLUMNS[BUDGETED_BENCHMARK_TABLE])
    assert "budgeted" not in headline_speedups(table, empty, 64, "sdpa", "fp32")


def _lm_exp(save_fractions: list[float], kv_group_fractions: list[float]) -> SimpleNamespace:
    from pipeline.tasks.language_modeling.task import LanguageModelingTask

    prune = SimpleNamespace(save_fractions=save_fractions, kv_group_fractions=kv_group_fractions, unit="query")
    exp = SimpleNamespace(params=SimpleNamespace(prune=prune, recover=SimpleNamespace(method="lora")))
    exp.task = LanguageModelingTask.__new__(LanguageModelingTask)
    exp.task.exp = exp
    return exp


def test_a_language_models_headline_is_its_most_pruned_saved_model_the_serving_shape_on_a_tie():
    assert _lm_exp([0.25], [0.33]).task.headline_model() == (kv_groups_label(0.33), 0.33)
    assert _lm_exp([0.25, 0.75], [0.5]).task.headline_model() == ("75% of heads (query)", 0.75)
    assert _lm_exp([0.5], [0.5]).task.headline_model() == (kv_groups_label(0.5), 0.5)
    assert _lm_exp([], []).task.headline_model() is None


def test_zero_shot_metrics_are_the_unpruned_the_headline_model_and_it_recovered():
    from pipeline.tasks.language_modeling.zero_shot import headline_accuracy

    exp = _lm_exp([0.25], [0.33])
    kv = kv_groups_label(0.33)
    mean = {UNPRUNED_MODEL: 0.52, "25% of heads (query)": 0.45, kv: 0.39, f"{kv}, recovered (lora)": 0.43}
    summary = headline_accuracy(exp, mean)
    assert summary == {"unpruned": 0.52, "pruned": 0.39, "fraction_pruned": 0.33, "recovered": 0.43}
    assert_numbers_only_and_few("zero_shot.json", summary)
    assert headline_accuracy(exp, {UNPRUNED_MODEL: 0.52}) == {"unpruned": 0.52}  # nothing else read: left out


def dvc_command() -> str:
    candidates = (ROOT / ".venv" / "bin" / "dvc", Path(sys.executable).parent / "dvc")
    found = next((str(c) for c in candidates if c.is_file()), shutil.which("dvc"))
    if found is None:
        pytest.skip("dvc not found")
    return found


@pytest.mark.slow  # a clone and two DVC commands: about 10 s
def test_a_fresh_clone_shows_and_diffs_the_metrics_with_no_warning_in_at_most_30_columns(tmp_path: Path):
    dvc, clone = dvc_command(), tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    shown = subprocess.run([dvc, "metrics", "show"], cwd=clone, env=ENV, capture_output=True, text=True, check=True)
    assert "failed to load" not in shown.stderr.lower() and "warning" not in shown.stderr.lower(), shown.stderr
    header = shown.stdout.splitlines()[0]
    assert header.startswith("Path") and len(re.split(r"\s{2,}", header.strip())) <= 30
    as_json = json.loads(subprocess.run([dvc, "metrics", "show", "--json"], cwd=clone, env=ENV, capture_output=True,
                                        text=True, check=True).stdout)
    files = as_json[""]["data"]
    assert files and not any("error" in result for result in files.values())
    assert len({key for result in files.values() for key, _ in flattened(result["data"])}) <= 29
    diff = subprocess.run([dvc, "metrics", "diff", "HEAD~1"], cwd=clone, env=ENV, capture_output=True, text=True,
                          check=True)
    assert "failed to load" not in diff.stderr.lower(), diff.stderr
