"""Which placement each stage needs on the devices at hand (or on devices named with `--devices 8x80GiB`), and the
plan's table, printed by `python -m pipeline.checks` after its "ok" line for a language-modelling experiment.

Placements (runtime.placement, pipeline/core/runtime.py), lightest first:
- whole: the stage's whole peak on one device;
- sharded: the model's blocks (embedding, layers, head, each with its own activations) packed onto the devices in
  order, as accelerate's device_map places them under `max_memory`;
- layerwise: one block on the device at a time, the weights of the others on the host (CPU RAM, then disk), and the
  hidden states carried between layers kept on the device for the backward.
The plan names the lightest that fits each stage, or says in one line that none does and by how much. runtime.max_memory
caps each device ("0", "1", ...: a GPU; "cpu": the host's RAM; "disk": the offload folder) as accelerate reads it.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass

from pipeline.checks.memory_plan import (
    DecoderShape,
    GiB,
    StageEstimate,
    gib,
    half,
    planned_precision,
    stage_estimates,
)
from pipeline.files.schema import MEMORY_SIZE_PATTERN, PLACEMENTS

USABLE = 0.9  # of each device's memory the plan counts on: the rest for the CUDA context (or the process's own
#               libraries on a CPU) and the allocator's fragmentation
UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}  # accelerate's: GB decimal, GiB binary
# Assumed throughput, stated in the plan: an H100 SXM's dense tensor-core peak (bf16/fp16 989 TFLOP/s; fp32 without
# TF32, torch's default, 67) at 40% utilisation, a plausible share for these batch sizes. A CPU: about what this
# project's 2-core box (AVX512-BF16) reached on the default's prune stage (docs/memory-plan.md).
GPU_PEAK_TFLOPS = {"half": 989.0, "fp32": 67.0}
GPU_UTILISATION = 0.4
CPU_TFLOPS = 0.4


class DevicesError(ValueError):
    """A --devices value that is no list of N x SIZE: one line."""


@dataclass(frozen=True)
class Device:
    name: str
    capacity: int  # bytes, after runtime.max_memory's cap
    gpu: bool

    @property
    def usable(self) -> int:
        return int(self.capacity * USABLE)


def size_bytes(text: str) -> int:
    """`70GiB`, `512 MB`, `2TB` as bytes (runtime.max_memory's and --devices' sizes)."""
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]+)", text.strip())
    if not match or not re.fullmatch(MEMORY_SIZE_PATTERN, text.strip()):
        raise DevicesError(f"{text!r} is not a size such as 80GiB, 512MiB or 2TB")
    return int(float(match.group(1)) * UNITS[match.group(2).upper()])


def parse_devices(text: str) -> list[Device]:
    """GPUs to plan for that this machine need not have: `8x80GiB`, `1x80GiB`, `2x80GiB,2x40GiB`."""
    devices: list[Device] = []
    for item in text.split(","):
        count, _, size = item.strip().replace("X", "x").partition("x")
        if not count.isdigit() or int(count) < 1 or not size:
            raise DevicesError(f"--devices: {item.strip()!r} is not N x SIZE, e.g. 8x80GiB")
        try:
            capacity = size_bytes(size)
        except DevicesError as error:
            raise DevicesError(f"--devices: {error}") from None
        devices += [Device(f"GPU {len(devices) + i} ({size_label(capacity)})", capacity, True)
                    for i in range(int(count))]
    return devices


def size_label(n: int) -> str:
    return f"{n / GiB:.0f}GiB" if n >= 10 * GiB else f"{n / GiB:.1f}GiB"


def host_memory() -> int:
    """This machine's RAM, from /proc/meminfo (psutil where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import psutil

    return int(psutil.virtual_memory().total)


def local_devices(device: str) -> list[Device]:
    """The devices a stage would use here: the CUDA GPUs torch sees (all of them: sharding may use every one), or
    with none, or with runtime.device cpu, the CPU's RAM. torch is imported only where nvidia-smi says a GPU may be
    there, so the checks stay fast on a CPU machine."""
    if device != "cpu" and shutil.which("nvidia-smi") and os.environ.get("CUDA_VISIBLE_DEVICES", "x") != "":
        import torch

        if torch.cuda.is_available():
            return [Device(f"cuda:{i} {torch.cuda.get_device_name(i)}",
                           torch.cuda.get_device_properties(i).total_memory, True)
                    for i in range(torch.cuda.device_count())]
    return [Device("cpu (this machine's RAM)", host_memory(), False)]


def capped(devices: list[Device], max_memory: dict[str, str]) -> tuple[list[Device], int | None]:
    """The devices under runtime.max_memory's caps (GPU i under key "i"; a CPU device under "cpu"), and the host
    memory for offloaded weights: "cpu" plus "disk" (None: no cap on disk, the offload folder takes the rest)."""
    out = []
    for i, d in enumerate(devices):
        key = str(i) if d.gpu else "cpu"
        cap = size_bytes(max_memory[key]) if key in max_memory else None
        out.append(Device(d.name, min(d.capacity, cap) if cap is not None else d.capacity, d.gpu))
    offload = None
    if "disk" in max_memory:
        offload = size_bytes(max_memory["disk"]) + (size_bytes(max_memory["cpu"]) if "cpu" in max_memory
                                                   else host_memory())
    return out, offload


@dataclass(frozen=True)
class Fit:
    mode: str  # one of PLACEMENTS, or "none"
    devices: str  # which devices it uses, or what is short


# The placements each stage runs (pipeline/tasks/language_modeling): scoring runs layer by layer itself
# (pipeline/core/layerwise.py); the stages that only evaluate run "layerwise" as accelerate's offload, each layer's
# weights brought to the device for its forward (pipeline/core/placement.py); recovery trains, so it runs whole, in
# one process or under accelerate launch with FSDP across GPUs (docs/distributed.md).
STAGE_PLACEMENTS = {"score": PLACEMENTS, "prune": PLACEMENTS, "benchmark": PLACEMENTS, "recover": ("whole",)}


def choose(estimate: StageEstimate, devices: list[Device], offload: int | None) -> Fit:
    """The lightest placement of `estimate` that its stage runs and that fits `devices` (each up to USABLE of its
    capacity)."""
    kind = "GPU" if devices[0].gpu else "device"
    modes = STAGE_PLACEMENTS.get(estimate.stage, PLACEMENTS)
    if estimate.total <= devices[0].usable:
        return Fit("whole", f"1 {kind}")
    if "sharded" in modes and len(devices) > 1:
        used = pack(estimate, devices)
        if used is not None:
            return Fit("sharded", f"{used} of {len(devices)} {kind}s")
    if "layerwise" not in modes:
        across = "; across GPUs: accelerate launch with FSDP (docs/distributed.md)" if len(devices) > 1 else ""
        return Fit("none", f"{estimate.stage} trains the whole model: {gib(estimate.total)} on one {kind}, "
                           f"{gib(devices[0].usable)} usable{across}")
    largest = max(devices, key=lambda d: d.usable)
    need = layerwise_bytes(estimate)
    weights = sum(b.weight_bytes for b in estimate.blocks)
    if need <= largest.usable and (offload is None or weights <= offload):
        return Fit("layerwise", f"1 {kind}, weights offloaded")
    if need > largest.usable:
        return Fit("none", f"layerwise needs {gib(need)} on one {kind}, the largest has {gib(largest.usable)} "
                           f"usable: short by {gib(need - largest.usable)}")
    return Fit("none", f"the {gib(weights)} of weights exceed runtime.max_memory's cpu + disk ({gib(offload or 0)})")


def layerwise_bytes(estimate: StageEstimate) -> int:
    """A layerwise run's peak on the device: its largest block and what is carried between blocks."""
    return max(b.total for b in estimate.blocks) + estimate.carried_bytes


def pack(estimate: StageEstimate, devices: list[Device]) -> int | None:
    """How many devices accelerate's sequential device_map fills with the blocks in order, or None if they do not
    all fit."""
    index, free = 0, devices[0].usable
    for block in estimate.blocks:
        while block.total > free:
            index += 1
            if index == len(devices):
                return None
            free = devices[index].usable
        free -= block.total
    return index + 1


def throughput(devices: list[Device], precision: str, tflops: float | None) -> tuple[float, str]:
    """(FLOP/s of one device, the assumption in words). Sharded and layerwise run the layers in turn, so one
    device's throughput is the stage's."""
    if tflops is not None:
        return tflops * 1e12, f"{tflops:g} TFLOP/s a device (--tflops)"
    if devices[0].gpu:
        peak = GPU_PEAK_TFLOPS["half" if half(precision) else "fp32"]
        return (peak * GPU_UTILISATION * 1e12,
                f"{peak * GPU_UTILISATION:.0f} TFLOP/s a device: an H100's dense {precision} peak ({peak:g} TFLOP/s) "
                f"at {GPU_UTILISATION:.0%} utilisation")
    return CPU_TFLOPS * 1e12, f"{CPU_TFLOPS:g} TFLOP/s: what this project's 2-core CPU reached (docs/memory-plan.md)"


def plan_lines(shape: DecoderShape, params, source: str, devices: list[Device], planned: bool,
               tflops: float | None = None) -> list[str]:
    """The plan as printed: the model, the devices, one row per stage (peak estimate, what it is made of, the
    lightest placement that fits and on what), what runtime.placement says, and the hours for scoring and pruning."""
    devices, offload = capped(devices, params.runtime.max_memory)
    setting = params.runtime.precision
    resolved = planned_precision(setting, devices[0].gpu)
    params = params.model_copy(update={"runtime": params.runtime.model_copy(update={"precision": resolved})})
    rt = params.runtime
    kinds = {}
    for d in devices:
        kinds[size_label(d.capacity)] = kinds.get(size_label(d.capacity), 0) + 1
    where = "planned (--devices)" if planned else "this machine"
    what = "GPU" if devices[0].gpu else "CPU RAM"
    lines = [f"memory plan ({where}; estimates, docs/memory-plan.md):",
             f"  model: {shape.params() / 1e6:,.1f}M parameters, {shape.layers} layers x {shape.heads} query heads "
             f"({shape.kv_heads} key/value), hidden {shape.hidden}, vocab {shape.vocab:,}"
             f"{', tied' if shape.tied else ''}; config from {source}",
             f"  devices: {', '.join(f'{n} x {size} {what}' for size, n in kinds.items())}"
             f"{' (runtime.max_memory caps applied)' if rt.max_memory else ''}; the plan counts on {USABLE:.0%} "
             f"of each",
             f"  precision: {rt.precision}{' autocast over fp32 weights' if half(rt.precision) else ''}"
             f"{f' (runtime.precision: {setting}, on these devices)' if setting != rt.precision else ''}"]
    estimates = stage_estimates(shape, params)
    fits = [choose(e, devices, offload) for e in estimates]
    rows = [("stage", "peak", "made of", "mode", "devices")]
    for e, fit in zip(estimates, fits, strict=True):
        parts = ", ".join(f"{k.replace('_', ' ')} {gib(v)}" for k, v in e.parts.items() if v)
        rows.append((e.stage, gib(e.total), parts, fit.mode, fit.devices))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, [*widths, 0], strict=True)).rstrip() for r in rows]
    short = [(e, f) for e, f in zip(estimates, fits, strict=True) if f.mode == "none"]
    for e, fit in short:
        lines.append(f"  nothing fits {e.stage}: {fit.devices}")
    needed = [f for f in fits if f.mode != "none"]
    heaviest = max((PLACEMENTS.index(f.mode) for f in needed), default=0)
    if PLACEMENTS.index(rt.placement) < heaviest:
        lines.append(f"  runtime.placement: {rt.placement}, but {PLACEMENTS[heaviest]} is needed here "
                     f"(set runtime.placement: {PLACEMENTS[heaviest]})")
    elif not short:
        lines.append(f"  runtime.placement: {rt.placement} fits every stage")
    rate, assumption = throughput(devices, rt.precision, tflops)
    timed = [e for e in estimates if e.flops]
    lines.append(f"  time at {assumption}:")
    lines += [f"    {e.stage}: {e.flops:.2g} FLOPs, {hours(e.flops / rate)} ({e.note})" for e in timed]
    return lines


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.2g} h" if seconds >= 360 else f"{seconds:.2g} s"
