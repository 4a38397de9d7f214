"""Training a language model, from scratch or to recover after pruning: AdamW, linear warm-up then linear decay to
0, batches of texts grouped by length, the loss the mean NLL over the batch's predicted tokens (so longer texts
weigh more, as in every LM's pre-training).

One loop (`train_language_model`) trains whatever parameters require grad: all of them for training from scratch
and full fine-tuning, only the adapters' for LoRA (`pipeline.tasks.language_modeling.lora`), which
`recover_language_model` wraps around the pruned model for the loop and merges back afterwards. The loop runs on
accelerate, so the same code trains in one plain process or in every process of `accelerate launch` (DDP, FSDP2),
with the same losses (docs/distributed.md)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedDataParallelKwargs, DistributedType
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from pipeline.core.placement import input_device
from pipeline.core.runtime import CPU_FP32, Runtime
from pipeline.data.evaluation import length_grouped_batches
from pipeline.files.schema import RECOVERY_METHODS
from pipeline.tasks.language_modeling.distillation import Objective, Teacher, distillation_objective
from pipeline.tasks.language_modeling.llama import batch_nll, collate_texts
from pipeline.tasks.language_modeling.lora import lora_adapters
from pipeline.training.optim import adamw


@dataclass(frozen=True)
class LanguageModelTrainConfig:
    steps: int
    batch_size: int = 64  # texts per step
    learning_rate: float = 2e-3  # the peak, reached at the end of warm-up
    warmup_steps: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)  # Llama's
    max_grad_norm: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class RecoveryConfig:
    """Brief fine-tuning of a pruned model to win back perplexity: LoRA (LLM-Pruner's recovery; the default) or
    full fine-tuning, on the next token, or (kd-lora, kd-full) on the unpruned model's next-token distribution
    (`pipeline.tasks.language_modeling.distillation`). The defaults suit a 135M-parameter model on two CPU cores
    (about 2 s a step at 8 x 128 tokens) and a GPU alike; they are LoRA's: full fine-tuning wants a learning rate
    some ten times smaller."""

    steps: int = 50
    method: str = "lora"  # one of RECOVERY_METHODS
    temperature: float = 1.0  # kd- only: the softmax temperature of teacher and student (Minitron's: 1)
    next_token_weight: float = 0.0  # kd- only: the next-token NLL's weight beside the KL (0: the KL alone)
    batch_size: int = 8  # texts per step
    learning_rate: float = 5e-4  # the peak
    warmup_steps: int = 5
    weight_decay: float = 0.0  # as LLM-Pruner's LoRA: none
    rank: int = 8  # LoRA only: the rank of each linear's update B A, and its scale alpha / rank
    alpha: float = 16.0
    dropout: float = 0.0  # LoRA only: on each adapter's input
    seed: int = 0

    def __post_init__(self) -> None:
        if self.method not in RECOVERY_METHODS:
            raise ValueError(f"recovery method must be one of {', '.join(RECOVERY_METHODS)}, got {self.method!r}")
        if self.rank < 1 or self.alpha <= 0 or not 0 <= self.dropout < 1:
            raise ValueError(f"LoRA needs rank >= 1, alpha > 0 and 0 <= dropout < 1; got rank {self.rank}, "
                             f"alpha {self.alpha}, dropout {self.dropout}")
        if self.temperature <= 0 or self.next_token_weight < 0:
            raise ValueError(f"distillation needs temperature > 0 and next_token_weight >= 0; got temperature "
                             f"{self.temperature}, next_token_weight {self.next_token_weight}")

    @property
    def distils(self) -> bool:
        """Whether the loss is the KL from the unpruned model (kd-lora, kd-full) rather than the next token."""
        return self.method.startswith("kd-")

    @property
    def adapts(self) -> bool:
        """Whether LoRA adapters train (lora, kd-lora) rather than every weight."""
        return self.method.endswith("lora")

    def train_config(self) -> LanguageModelTrainConfig:
        """The training loop's settings."""
        return LanguageModelTrainConfig(steps=self.steps, batch_size=self.batch_size,
                                        learning_rate=self.learning_rate, warmup_steps=self.warmup_steps,
                                        weight_decay=self.weight_decay, seed=self.seed)


def linear_schedule(warmup_steps: int, steps: int) -> Callable[[int], float]:
    """Multiplier of the peak learning rate at scheduler step `s` (0-based): linear warm-up, then linear decay to
    0 at `steps` (a fixed, short budget)."""
    warmup = max(1, warmup_steps)

    def factor(s: int) -> float:
        step = s + 1
        if step <= warmup:
            return step / warmup
        return max(0.0, (steps - step) / max(1, steps - warmup))

    return factor


def training_accelerator(model: nn.Module, runtime: Runtime) -> Accelerator:
    """The engine the loop runs on: accelerate in one plain process, or in each process of `accelerate launch` (DDP,
    or FSDP2 under an FSDP config; on the CPU, DDP over gloo: accelerate 1.16 shards with FSDP only on accelerators).
    bf16 autocast stays the runtime's (`Runtime.autocast`); fp16 hands accelerate the loss scaling, so that FSDP
    gets its sharded scaler. No device placement in one process: the model stays where the runtime loaded it."""
    cpu = runtime.device.type == "cpu"
    # A layer that pruning emptied keeps zero-width parameters that no loss reaches: DDP must be told to expect them.
    unused = any(param.requires_grad and param.numel() == 0 for param in model.parameters())
    return Accelerator(cpu=cpu, mixed_precision="fp16" if runtime.precision == "fp16" else "no",
                       device_placement=PartialState(cpu=cpu).num_processes > 1,
                       kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=unused)])


def _rows_of_process(rows: np.ndarray, process: int, processes: int) -> tuple[np.ndarray, bool]:
    """This process's share of a global batch (every `processes`-th row from `process`), and whether it is real: a
    process left without a row (a batch shorter than the processes) runs the first row at weight 0, since every
    process must take part in each backward pass."""
    mine = rows[process::processes]
    return (mine, True) if len(mine) else (rows[:1], False)


def _plain_weights(trained: nn.Module, plain: nn.Module) -> None:
    """Copy the weights of `trained`, a copy of `plain` that FSDP2 sharded in place (its parameters DTensors), into
    `plain`, each gathered whole in turn (`full_tensor`), so `plain` stays an ordinary module the caller can merge
    and save. FSDP2 keeps every parameter's name, so the names match."""
    from torch.distributed.tensor import DTensor  # only under FSDP: distributed tensors

    target = dict(plain.named_parameters())
    with torch.no_grad():
        for name, param in trained.named_parameters():
            if param.numel() == 0:  # an emptied layer's: nothing to gather (and DTensor cannot unpad a 0-wide shard)
                continue
            data = param.data.full_tensor() if isinstance(param.data, DTensor) else param.data
            target[name].copy_(data.to(target[name].device))


def train_language_model(
    model: PreTrainedModel,
    sequences: Sequence[Sequence[int]],
    pad_id: int,
    cfg: LanguageModelTrainConfig,
    progress: bool = True,
    runtime: Runtime = CPU_FP32,
    objective: Objective | None = None,
) -> list[float]:
    """Train `model`'s parameters that require grad in place, on its device, for cfg.steps optimisation steps over
    `sequences` (token ids, as tokenize_texts makes them), the forward passes at `runtime`'s precision; returns
    every step's loss. The same model, data, config and seed give the same losses (single-threaded CPU, or
    deterministic kernels). The loss is the next-token NLL, or `objective`'s per-row sums (distillation's).

    Runs on accelerate (`training_accelerator`): as one process, or under `accelerate launch` as several, each
    taking its share of every global batch of cfg.batch_size texts. Each process's loss is its texts' summed NLL
    over the global batch's token count, times the processes (DDP and FSDP average the gradients), so the gradient
    is the global batch's whatever the number of processes, and the loss reported is the global batch's."""
    if cfg.steps < 1 or not sequences:
        raise ValueError(f"training needs steps >= 1 and some sequences; got {cfg.steps} steps, "
                         f"{len(sequences)} sequences")
    longest = max(map(len, sequences))
    if longest > model.config.max_position_embeddings:
        raise ValueError(f"a training sequence has {longest} tokens but the model has "
                         f"{model.config.max_position_embeddings} positions; tokenize with max_length <= that")
    accelerator = training_accelerator(model, runtime)
    processes, process = accelerator.num_processes, accelerator.process_index
    fsdp = accelerator.distributed_type == DistributedType.FSDP
    if fsdp and not accelerator.is_fsdp2:
        raise ValueError("recovery under FSDP needs fsdp_version: 2 in the accelerate config (FSDP1 flattens the "
                         "parameters, whose names the merge back into the model needs)")
    home = input_device(model)
    if fsdp:  # FSDP2 shards a module in place: it shards a CPU copy onto the GPUs; `model` waits on the CPU for the
        model.cpu()  # trained weights, gathered whole at the end, and goes back to its device
        engine_model = copy.deepcopy(model)
    else:
        engine_model = model.to(accelerator.device) if processes > 1 else model
    optimizer = adamw(engine_model, cfg.learning_rate, cfg.weight_decay, cfg.betas)
    # The schedule steps with every optimisation step, as it always did; it is not accelerate's to step.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_schedule(cfg.warmup_steps, cfg.steps))
    prepared, optimizer = accelerator.prepare(engine_model, optimizer)
    generator = np.random.default_rng(cfg.seed)
    torch.manual_seed(cfg.seed)  # attention dropout, if any
    device = home if processes == 1 else accelerator.device
    lengths = np.array([len(s) for s in sequences])
    losses: list[float] = []
    prepared.train()
    with tqdm(total=cfg.steps, desc="train", disable=not progress or not accelerator.is_main_process) as bar:
        while len(losses) < cfg.steps:
            # Every process draws the same global batches (the same seed); accelerate's own batch sharding would drop
            # the short batches that length grouping leaves inside an epoch, so the loop shares them out itself.
            for rows in length_grouped_batches(lengths, cfg.batch_size, generator.permutation):
                tokens = int(np.maximum(lengths[rows] - 1, 0).sum())  # the global batch's predicted tokens
                mine, real = _rows_of_process(rows, process, processes)
                batch = {k: v.to(device) for k, v in collate_texts([sequences[i] for i in mine], pad_id).items()}
                with runtime.autocast():
                    summed = batch_nll(prepared, batch)[0] if objective is None else objective(prepared, batch, mine)
                loss = summed.sum() * processes / max(tokens, 1) if real else summed.sum() * 0.0
                accelerator.backward(loss)
                accelerator.clip_grad_norm_(prepared.parameters(), cfg.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                losses.append(float(accelerator.reduce(loss.detach(), "sum")) / processes)
                bar.update()
                bar.set_postfix(loss=f"{losses[-1]:.3f}", ppl=f"{math.exp(min(losses[-1], 50)):.1f}")
                if len(losses) == cfg.steps:
                    break
    if fsdp:
        _plain_weights(prepared, model)
        model.to(home)
    model.eval()
    return losses


def recover_language_model(
    model: PreTrainedModel,
    sequences: Sequence[Sequence[int]],
    pad_id: int,
    cfg: RecoveryConfig,
    progress: bool = True,
    runtime: Runtime = CPU_FP32,
    teacher: Teacher | None = None,
) -> list[float]:
    """Fine-tune a (pruned) `model` in place for cfg.steps steps over `sequences`, by cfg.method; returns every
    step's loss. LoRA's adapters are merged into the weights at the end, so `model` stays a plain model of the
    same modules, shapes and parameter count, which `pipeline.core.checkpoint.save_model` saves as any other.
    The kd- methods learn from `teacher` (the unpruned model), on the same batches."""
    objective = None
    if cfg.distils:
        if teacher is None:
            raise ValueError(f"recovery method {cfg.method} distils from the unpruned model: pass teacher=")
        objective = distillation_objective(teacher, cfg.temperature, cfg.next_token_weight)
    if not cfg.adapts:
        return train_language_model(model, sequences, pad_id, cfg.train_config(), progress, runtime, objective)
    with lora_adapters(model, cfg.rank, cfg.alpha, cfg.dropout, cfg.seed) as adapted:
        return train_language_model(adapted, sequences, pad_id, cfg.train_config(), progress, runtime, objective)
