"""Recovery fine-tuning through accelerate in two processes (DDP over gloo on the CPU, as `accelerate launch` or
torchrun starts them) gives the single process's losses and weights for the same global batches, full fine-tuning,
LoRA and LoRA distilled from the unpruned model alike; and FSDP2's sharded weights come back whole into the plain model
(`_plain_weights`)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from pipeline.core.runtime import CPU_FP32, is_main_process
from pipeline.tasks.language_modeling.distillation import Teacher
from pipeline.tasks.language_modeling.training import RecoveryConfig, _plain_weights, recover_language_model
from tests.test_lora_recovery import FAST, pruned, sequences, unpruned
from tests.tiny_models import PAD

PROCESSES = 2
# 61 texts in batches of 6: each epoch has a batch of 1 (a process with no text) and one of 4 besides the full ones,
# and 12 steps cross into the second epoch.
TEXTS, CONFIG = 61, {**FAST, "batch_size": 6, "steps": 12}
METHODS = ("full", "lora", "kd-lora")


def _recover(method: str) -> tuple[list[float], torch.nn.Module]:
    """A pruned tiny model recovered by `method` (kd-: from the unpruned one) on the test's texts."""
    model, config = pruned(), RecoveryConfig(**CONFIG, method=method)
    losses = recover_language_model(model, sequences(TEXTS), PAD, config, progress=False, runtime=CPU_FP32,
                                    teacher=Teacher(unpruned()) if config.distils else None)
    return losses, model


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, out: Path) -> None:
    """One process of the group, set up as torchrun sets its processes up; rank 0 saves what the test compares."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(PROCESSES), LOCAL_WORLD_SIZE=str(PROCESSES))
    torch.set_num_threads(1)
    results = {}
    for method in METHODS:
        losses, model = _recover(method)
        results[method] = (losses, model.state_dict())
    # FSDP2 on the CPU, by torch itself (accelerate shards with FSDP only on accelerators): each process holds half
    # of every parameter, and _plain_weights gathers them back into a plain copy.
    from torch.distributed.fsdp import fully_shard

    reference, sharded, plain = pruned(), pruned(), pruned()
    with torch.no_grad():
        for param in plain.parameters():
            param.zero_()
    for layer in sharded.model.layers:
        fully_shard(layer)
    fully_shard(sharded)
    _plain_weights(sharded, plain)
    results["fsdp2"] = all(torch.equal(a, b) for a, b in zip(reference.state_dict().values(),
                                                            plain.state_dict().values(), strict=True))
    if rank == 0:
        torch.save(results, out)
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("ddp") / "rank0.pt"
    mp.start_processes(_worker, args=(_free_port(), out), nprocs=PROCESSES, start_method="spawn")
    return torch.load(out, weights_only=False)


@pytest.mark.slow  # two fresh Python processes (about 20 s here)
@pytest.mark.parametrize("method", METHODS)
def test_two_processes_give_the_single_processs_losses_and_weights(two_processes, method):
    single, model = _recover(method)
    losses, weights = two_processes[method]
    assert losses == pytest.approx(single, rel=1e-5, abs=1e-6)
    assert losses[-1] < 0.95 * losses[0]  # it trained
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(weights[name], tensor, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.slow
def test_fsdp2_sharded_weights_come_back_whole_into_the_plain_model(two_processes):
    assert two_processes["fsdp2"]


@pytest.mark.parametrize(("rank", "writes"), [(None, True), ("0", True), ("1", False)])
def test_only_a_plain_process_or_the_first_launched_one_writes_the_stages_outputs(monkeypatch, rank, writes):
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    assert is_main_process() is writes
