"""The `runtime` params: where the stages run their models and at what precision (pipeline/core/runtime.py).

This machine has no GPU, so the CUDA paths are checked by `make gpu-check` on one; here: the CPU explicitly,
`auto` falling back to it, bf16 autocast end to end, and the one-line refusals."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from scipy.stats import spearmanr

from pipeline.config.params import ParamsError, parse_params
from pipeline.core.importance import head_importance
from pipeline.core.runtime import Runtime, RuntimeUnavailable, cpu_bf16_native, resolve_runtime
from pipeline.run.experiment import Experiment, log_precision
from tests.tiny_project import STAGES, make_tiny_project, ran_stages, run, tiny_params

# --- resolving and refusing ---------------------------------------------------------------------------------


def test_auto_is_the_cpu_on_a_machine_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert resolve_runtime("auto", "fp32") == Runtime(torch.device("cpu"), "fp32")
    assert resolve_runtime("cpu", "bf16").dtype == torch.bfloat16


@pytest.mark.parametrize(("runtime", "message"), [
    ({"device": "tpu"}, "runtime.device: must be auto, cpu, cuda or cuda:N (got 'tpu')"),
    ({"precision": "int4"}, "runtime.precision: Input should be 'auto', 'fp32', 'bf16' or 'fp16' (got 'int4')"),
    ({"devise": "cpu"}, "runtime.devise: unknown key; allowed here: device, precision, placement, max_memory"),
])
def test_bad_runtime_values_are_refused_in_one_line_naming_the_key(runtime, message):
    with pytest.raises(ParamsError) as error:
        parse_params({"runtime": runtime})
    assert str(error.value) == f"invalid params: {message}"


# --- precision: auto, by hardware --------------------------------------------------------------------------

# The two caps that make a native-bf16 CPU compute as one without (ATen's kernels, oneDNN's matrix products).
ISA_CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
HAS_NATIVE_BF16 = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def auto_in_a_fresh_process(env: dict[str, str]) -> str:
    """What `precision: auto` resolves to on the CPU in a new Python (ATen reads its cap when torch loads)."""
    code = "from pipeline.core.runtime import resolve_runtime; print(resolve_runtime('cpu', 'auto').precision)"
    clean = {k: v for k, v in os.environ.items() if k not in ISA_CAPS}
    done = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                          check=True, cwd=Path(__file__).resolve().parents[1])
    return done.stdout.strip()


@pytest.mark.slow  # two fresh interpreters importing torch
def test_auto_is_fp32_under_the_isa_caps_and_bf16_uncapped_on_a_native_bf16_cpu():
    assert auto_in_a_fresh_process(ISA_CAPS) == "fp32"
    assert auto_in_a_fresh_process({}) == ("bf16" if HAS_NATIVE_BF16 else "fp32")


@pytest.mark.parametrize(("caps", "native"), [
    ({}, True),
    ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, False),
    ({"ONEDNN_MAX_CPU_ISA": "avx512_core"}, False),  # AVX-512 without its bf16 dot products: emulated
    ({"DNNL_MAX_CPU_ISA": "AVX512_CORE_VNNI"}, False),  # oneDNN's older name of the cap
    ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, True),
    ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, True),
])
def test_onednns_cap_decides_whether_bf16_is_native_on_a_cpu_that_has_it(monkeypatch, caps, native):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    for key in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv(key, raising=False)
    for key, value in caps.items():
        monkeypatch.setenv(key, value)
    assert cpu_bf16_native()[0] is native
    assert resolve_runtime("cpu", "auto").precision == ("bf16" if native else "fp32")


def test_auto_is_fp32_on_a_cpu_without_bf16_or_with_aten_capped(monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert cpu_bf16_native() == (False, "this CPU has neither AVX512-BF16 nor AMX")
    assert resolve_runtime("cpu", "auto") == Runtime(torch.device("cpu"), "fp32")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert cpu_bf16_native() == (False, "ATen runs at AVX2 (ATEN_CPU_CAPABILITY)")


def test_an_explicit_precision_is_kept_whatever_the_cpu(monkeypatch):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert resolve_runtime("cpu", "bf16").precision == "bf16"
    assert resolve_runtime("cpu", "fp32").precision == "fp32"


def test_a_stage_says_what_auto_chose_and_warns_of_emulated_bf16(monkeypatch, caplog):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    with caplog.at_level("INFO", logger="pipeline"):
        log_precision("auto", resolve_runtime("cpu", "auto"))
        log_precision("bf16", resolve_runtime("cpu", "bf16"))
    assert "runtime.precision auto: fp32 on cpu (oneDNN is capped at AVX2 (ONEDNN_MAX_CPU_ISA))" in caplog.text
    assert "runtime.precision: auto would choose fp32 here" in caplog.text


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize(("device", "precision", "message"), [
    ("cuda", "fp32", "runtime.device: 'cuda' but this machine has no CUDA GPU"),
    ("cuda:1", "bf16", "runtime.device: 'cuda:1' but this machine has no CUDA GPU"),
    ("cpu", "fp16", "runtime.precision: fp16 needs a GPU (CPU autocast is bf16); on the CPU use fp32 or bf16"),
])
def test_a_runtime_this_machine_cannot_run_is_refused_in_one_line(device, precision, message):
    with pytest.raises(RuntimeUnavailable, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_runtime(device, precision)


@pytest.mark.slow  # a stage in a subprocess
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_stage_asked_for_a_missing_gpu_stops_in_one_line_before_it_writes(tmp_path):
    params = tiny_params()
    params["runtime"] = {"device": "cuda", "precision": "fp32"}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    result = subprocess.run([sys.executable, "-m", "stages.score", "--params", str(tmp_path / "params.yaml")],
                            cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        f"error: runtime.device: 'cuda' but this machine has no CUDA GPU (torch {torch.__version__}); use auto or cpu"]
    assert "Traceback" not in result.stderr


# --- running: the CPU given explicitly, in bf16 --------------------------------------------------------------


@pytest.fixture(scope="module")
def bf16_repo(tmp_path_factory) -> Path:
    """The tiny pipeline, end to end, with `runtime: {device: cpu, precision: bf16}`."""
    params = tiny_params()
    params["runtime"] = {"device": "cpu", "precision": "bf16"}
    root = make_tiny_project(tmp_path_factory.mktemp("bf16"), params=params)
    assert ran_stages(run(["dvc", "repro"], root)) == STAGES
    return root


@pytest.mark.slow  # its fixture runs `dvc repro` of the tiny pipeline
def test_bf16_on_the_cpu_runs_the_tiny_pipeline_end_to_end(bf16_repo):
    reports = bf16_repo / "reports" / "tiny"
    for table in ("ablation.csv", "importance.csv", "pruning_curve.csv", "recovery.csv", "benchmark.csv"):
        assert not pd.read_csv(reports / table).empty, table
    assert (reports / "report.html").is_file()


@pytest.mark.slow  # shares that fixture
def test_bf16_scoring_of_one_model_ranks_heads_as_fp32_scoring_does(bf16_repo, monkeypatch):
    # The estimator alone: the same fine-tuned model scored under bf16 autocast and in fp32. (Whole runs differ
    # more on a tiny random model, whose 8 heads are near-exchangeable: bf16 fine-tuning gives another model.)
    monkeypatch.chdir(bf16_repo)
    exp = Experiment(parse_params(yaml.safe_load((bf16_repo / "params.yaml").read_text())))
    model, batches = exp.load(exp.finetuned_dir), exp.task.score_batches()
    fp32 = torch.cat(head_importance(model, batches))
    with Runtime(torch.device("cpu"), "bf16").autocast():
        bf16 = torch.cat(head_importance(model, batches))
    assert bf16.dtype == torch.float32  # the gates' gradients, and their sums, stay fp32
    print(f"bf16 vs fp32 importance on one model: Spearman {spearmanr(bf16, fp32).statistic:.3f}")
    assert spearmanr(bf16, fp32).statistic >= 0.95
