"""`make gpu-check` (pipeline/checks/gpu.py) and the benchmark's device and precision columns, on the CPU:
the GPU run itself needs a GPU, but its code path runs here at a tiny shape."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from pipeline.checks import gpu as gpu_check
from pipeline.core.runtime import resolve_runtime
from pipeline.methods.bench import measure_throughput, random_encoder, random_inputs
from tests.tiny_project import ROOT


@pytest.fixture(scope="module")
def table():
    return gpu_check.benchmark_table("cpu", tiny=True)


def test_the_gpu_check_benchmark_prints_one_row_per_precision_batch_and_pruned_share(table):
    assert list(table.columns) == list(gpu_check.COLUMNS.values())
    assert len(table) == len(gpu_check.PRECISIONS) * len(gpu_check.TINY["batch_sizes"]) * len(gpu_check.FRACTIONS)
    assert list(dict.fromkeys(table["precision"])) == ["fp32", "bf16"] and set(table["device"]) == {"cpu"}
    assert sorted(table["heads pruned"].unique()) == gpu_check.FRACTIONS


def test_its_speedups_compare_models_at_the_same_precision_and_batch(table):
    unpruned = table[table["heads pruned"] == 0.0]
    assert (unpruned["speedup"] == 1.0).all() and (unpruned["ideal (FLOPs)"] == 1.0).all()
    assert len(unpruned) == len(gpu_check.PRECISIONS) * len(gpu_check.TINY["batch_sizes"])
    pruned = table[table["heads pruned"] > 0]
    assert (pruned["ideal (FLOPs)"] > 1).all()  # pruning heads removes FLOPs
    assert ((pruned["speedup/ideal"] - pruned["speedup"] / pruned["ideal (FLOPs)"]).abs() < 1e-9).all()
    assert (table["examples/s"] > 0).all() and (table["peak MiB"] > 0).all()
    text = gpu_check.format_table(table)
    assert "speedup/ideal" in text and "70%" in text and len(text.splitlines()) == len(table) + 1


def test_the_gpu_check_refuses_in_one_line_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    result = subprocess.run([sys.executable, "-m", "pipeline.checks.gpu"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "no CUDA GPU" in result.stderr and "Traceback" not in result.stderr


def test_every_benchmark_row_names_its_device_and_precision():
    model = random_encoder("tiny", "sdpa")
    rows = measure_throughput({0.0: model}, [random_inputs(model, 2, 8)], repeats=1,
                              runtime=resolve_runtime("cpu", "bf16"))
    assert rows[0]["device"] == "cpu" and rows[0]["precision"] == "bf16"


def test_a_sweep_member_sees_only_its_workers_gpus_and_a_cpu_member_sees_none():
    from pipeline.flows.placement import PlacementError, member_gpu_env

    assert member_gpu_env(["6"], 1) == {"CUDA_VISIBLE_DEVICES": "6"}  # the GPU its Dask worker owns
    assert member_gpu_env(["2", "3"], 2) == {"CUDA_VISIBLE_DEVICES": "2,3"}
    assert member_gpu_env(["0", "1"], 0) == {"CUDA_VISIBLE_DEVICES": ""}  # hidden: it asked for none
    with pytest.raises(PlacementError, match="needs 2 GPU"):
        member_gpu_env(["0"], 2)


def test_the_visible_gpus_are_those_cuda_visible_devices_names(monkeypatch):
    from pipeline.flows.placement import visible_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3")
    assert visible_gpus() == ["2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == []
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi: no GPUs
    assert visible_gpus() == []


def test_the_llm_part_scores_the_default_whole_and_a_larger_llama_layerwise_beside_the_plan(capsys):
    from pipeline.checks.gpu_llm import score_runs

    runs = score_runs("cpu", tiny=True)
    assert [(r.placement, r.precision) for r in runs] == [("whole", "bf16"), ("layerwise", "bf16")]
    assert all(r.seconds > 0 and r.plan_mib > 0 and r.peak_mib is None for r in runs)
    assert gpu_check.main(["--device", "cpu", "--tiny", "--parts", "llm"]) == 0
    out = capsys.readouterr().out
    assert "SmolLM2-135M-Instruct, whole, bf16" in out and "Llama-3.2-1B shape, random, layerwise, bf16" in out
    assert "plan" in out and "llm: ok" in out
