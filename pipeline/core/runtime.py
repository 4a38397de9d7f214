"""Where models run and at what precision: the `runtime` params section, resolved once per stage.

`device: auto` is the GPU when there is one (the first), else the CPU. `precision: bf16 | fp16` runs the
forward passes under `torch.autocast`, so weights stay fp32 and only the matrix products drop to half
precision; fp16 training scales its loss (`grad_scaler`) so small gradients do not underflow. Head and neuron
gates are fp32 leaves (pipeline/core/gates.py), so their gradients, and the importance sums built from them,
stay fp32 under either half precision.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from pipeline.files.schema import DEVICES, PLACEMENTS, PRECISIONS

DTYPES = dict(zip(PRECISIONS, (torch.float32, torch.bfloat16, torch.float16), strict=True))


class RuntimeUnavailable(ValueError):
    """A runtime setting this machine cannot honour (a GPU it does not have); one line, naming the key."""


@dataclass(frozen=True)
class Runtime:
    device: torch.device = torch.device("cpu")
    precision: str = "fp32"
    placement: str = "whole"  # one of PLACEMENTS: whole, sharded (accelerate's device_map), layerwise
    max_memory: tuple[tuple[str, str], ...] = ()  # accelerate's caps as (device, size) pairs; empty: no cap

    @property
    def memory_caps(self) -> dict[int | str, str]:
        """`max_memory` as accelerate takes it: GPU indices as ints, "cpu" and "disk" as names."""
        return {int(key) if key.isdigit() else key: size for key, size in self.max_memory}

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of autocast's matrix products (fp32: no autocast)."""
        return DTYPES[self.precision]

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def autocast(self) -> contextlib.AbstractContextManager:
        """The forward passes' precision: `torch.autocast` for bf16/fp16, nothing for fp32."""
        if self.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler:
        """A loss scaler for fp16 training; disabled (a pass-through) for fp32 and bf16, whose range needs none."""
        return torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")

    def synchronize(self) -> None:
        """Wait for the device's queued work (CUDA runs asynchronously; a timer must not stop before it ends)."""
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    @property
    def device_name(self) -> str:
        """What the benchmark's rows and the report name the device by."""
        if self.is_cuda:
            return torch.cuda.get_device_name(self.device)
        return "cpu"

    @contextlib.contextmanager
    def peak_memory(self) -> Iterator[dict[str, float]]:
        """CUDA's peak allocated memory within the block, in MiB, as `{"peak_mib": ...}` once it ends."""
        result: dict[str, float] = {}
        torch.cuda.reset_peak_memory_stats(self.device)
        base = torch.cuda.memory_allocated(self.device)
        yield result
        self.synchronize()
        result["peak_mib"] = (torch.cuda.max_memory_allocated(self.device) - base) / 2**20


def is_main_process() -> bool:
    """Whether this process writes a stage's outputs: always in a plain run; under `accelerate launch` (or torchrun),
    whose processes all train, only the first (RANK 0)."""
    return int(os.environ.get("RANK", "0")) == 0


CPU_FP32 = Runtime()  # the library's default: what a test or a notebook gets without asking


def resolve_runtime(device: str = "auto", precision: str = "fp32", placement: str = "whole",
                    max_memory: dict[str, str] | None = None) -> Runtime:
    """The `Runtime` of the params' `runtime` section on this machine, or one line (`RuntimeUnavailable`) saying
    why this machine cannot run it."""
    if placement not in PLACEMENTS:
        raise RuntimeUnavailable(f"runtime.placement: {placement!r} is not one of {', '.join(PLACEMENTS)}")
    if precision not in DTYPES:
        raise RuntimeUnavailable(f"runtime.precision: {precision!r} is not one of {', '.join(PRECISIONS)}")
    has_cuda = torch.cuda.is_available()
    if device == "auto":
        # Under `accelerate launch` (or torchrun) each process of a node takes its own GPU, LOCAL_RANK's.
        resolved = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0)) % max(torch.cuda.device_count(), 1)}"
                                if has_cuda else "cpu")
    else:
        try:
            resolved = torch.device(device)
        except RuntimeError:
            raise RuntimeUnavailable(f"runtime.device: {device!r} is not a device; allowed: {DEVICES}") from None
        if resolved.type not in ("cpu", "cuda"):
            raise RuntimeUnavailable(f"runtime.device: {device!r} is not a device; allowed: {DEVICES}")
        if resolved.type == "cuda":
            if not has_cuda:
                raise RuntimeUnavailable(f"runtime.device: {device!r} but this machine has no CUDA GPU "
                                         f"(torch {torch.__version__}); use auto or cpu")
            index = resolved.index or 0
            if index >= torch.cuda.device_count():
                raise RuntimeUnavailable(f"runtime.device: {device!r} but this machine has "
                                         f"{torch.cuda.device_count()} GPU(s): cuda:0 to "
                                         f"cuda:{torch.cuda.device_count() - 1}")
            resolved = torch.device("cuda", index)
    if precision == "fp16" and resolved.type == "cpu":
        raise RuntimeUnavailable("runtime.precision: fp16 needs a GPU (CPU autocast is bf16); on the CPU use "
                                 "fp32 or bf16")
    if precision == "bf16" and resolved.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise RuntimeUnavailable(f"runtime.precision: bf16 is not supported by {torch.cuda.get_device_name(resolved)}"
                                 f"; use fp16 or fp32")
    return Runtime(resolved, precision, placement, tuple(sorted((max_memory or {}).items())))
