"""Where models run and at what precision: the `runtime` params section, resolved once per stage.

`device: auto` is the GPU when there is one (the first), else the CPU. `precision: bf16 | fp16` runs the
forward passes under `torch.autocast`, so weights stay fp32 and only the matrix products drop to half
precision; fp16 training scales its loss (`grad_scaler`) so small gradients do not underflow. Head and neuron
gates are fp32 leaves (pipeline/core/gates.py), so their gradients, and the importance sums built from them,
stay fp32 under either half precision.

`precision: auto` is bf16 where the hardware computes it natively and fp32 elsewhere (`auto_precision`). On a CPU,
bf16 autocast is only fast where oneDNN has bf16 dot products (AVX512-BF16, or AMX): a Linear of SmolLM2's MLP shape
at one thread took 0.23x fp32's time on an AVX512-BF16 EPYC, and 4.1x under `ONEDNN_MAX_CPU_ISA=AVX2`, where oneDNN
emulates it (docs/device-and-precision.md). So the choice reads the CPU's flags and the two caps that make a
native-bf16 CPU compute like one without: ATen's (`ATEN_CPU_CAPABILITY`) and oneDNN's (`ONEDNN_MAX_CPU_ISA`). It is
made from flags, not from a timing, so the same machine always makes the same choice.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from pipeline.files.schema import AUTO_PRECISION, DEVICES, PLACEMENTS, PRECISION_SETTINGS, PRECISIONS

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

# oneDNN's ISA names (ONEDNN_MAX_CPU_ISA, or DNNL_MAX_CPU_ISA before it) below its first with bf16 dot products,
# AVX512_CORE_BF16: capped at one of these, oneDNN emulates bf16 matrix products in fp32 (oneDNN's dnnl_cpu_isa_t).
ONEDNN_ISAS_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")


def cpu_bf16_native() -> tuple[bool, str]:
    """Whether this CPU computes bf16 matrix products natively, as torch runs them now, and why in a few words."""
    if not (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()):
        return False, "this CPU has neither AVX512-BF16 nor AMX"
    aten = torch.backends.cpu.get_cpu_capability()
    if not aten.startswith("AVX512"):
        return False, f"ATen runs at {aten} (ATEN_CPU_CAPABILITY)"
    onednn = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    if onednn in ONEDNN_ISAS_WITHOUT_BF16:
        return False, f"oneDNN is capped at {onednn} (ONEDNN_MAX_CPU_ISA)"
    if not torch.backends.mkldnn.is_available():
        return False, "this torch has no oneDNN"
    return True, "this CPU computes bf16 natively (AVX512-BF16 or AMX)"


def auto_precision(device: torch.device) -> tuple[str, str]:
    """What `precision: auto` is on `device`, and why: bf16 where it is native (a CUDA GPU that supports it, a CPU
    with AVX512-BF16 or AMX), fp32 elsewhere. fp16 is never chosen: it needs a loss scale and changes results more."""
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bf16", f"{torch.cuda.get_device_name(device)} supports bf16"
        return "fp32", f"{torch.cuda.get_device_name(device)} has no bf16"
    native, why = cpu_bf16_native()
    return ("bf16" if native else "fp32"), why


def resolve_precision(precision: str, device: torch.device) -> str:
    """`precision` on `device`: itself, or what `auto` chooses there."""
    return auto_precision(device)[0] if precision == AUTO_PRECISION else precision


def resolve_runtime(device: str = "auto", precision: str = "fp32", placement: str = "whole",
                    max_memory: dict[str, str] | None = None) -> Runtime:
    """The `Runtime` of the params' `runtime` section on this machine, or one line (`RuntimeUnavailable`) saying
    why this machine cannot run it."""
    if placement not in PLACEMENTS:
        raise RuntimeUnavailable(f"runtime.placement: {placement!r} is not one of {', '.join(PLACEMENTS)}")
    if precision not in PRECISION_SETTINGS:
        raise RuntimeUnavailable(f"runtime.precision: {precision!r} is not one of {', '.join(PRECISION_SETTINGS)}")
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
    precision = resolve_precision(precision, resolved)
    if precision == "fp16" and resolved.type == "cpu":
        raise RuntimeUnavailable("runtime.precision: fp16 needs a GPU (CPU autocast is bf16); on the CPU use "
                                 "fp32 or bf16")
    if precision == "bf16" and resolved.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise RuntimeUnavailable(f"runtime.precision: bf16 is not supported by {torch.cuda.get_device_name(resolved)}"
                                 f"; use fp16 or fp32")
    return Runtime(resolved, precision, placement, tuple(sorted((max_memory or {}).items())))
