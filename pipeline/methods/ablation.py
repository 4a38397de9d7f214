"""Single-head ablation (the paper's Table 1) and keeping one head per layer (Tables 2/3).

Masking a head in layer l leaves layers 0..l-1 unchanged, so their output is computed once per
layer and replayed: the blocks below l return the recorded output instead of running. Across a
6-layer model that halves the cost of the 2 x 72 masked evaluations.

`sharded_ablation_tables` spreads the attention sites over Dask workers; a site's rows depend only on the
site and the seed, so the tables equal the serial run's.
"""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext

import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from pipeline.core.gates import head_gates
from pipeline.core.sites import AttentionSite, attention_sites, layer_stack
from pipeline.data.evaluation import TaskEval
from pipeline.files.schema import ONE_HEAD_TABLE, TABLE_COLUMNS, improvement


class _StopForward(Exception):
    """Raised by a hook to end a forward pass once the wanted layer output is recorded."""


@torch.inference_mode()
def record_block_outputs(model: nn.Module, block: nn.Module, batches: Sequence[Mapping[str, torch.Tensor]]) -> list:
    """The output of `block` for every one of `batches` (model inputs), running the model only up to `block`."""
    outputs = []

    def keep(_module, _args, output):
        outputs.append(output)
        raise _StopForward

    handle = block.register_forward_hook(keep)
    device = next(model.parameters()).device
    try:
        for batch in batches:
            try:
                model(**{k: v.to(device) for k, v in batch.items()})
            except _StopForward:
                pass
    finally:
        handle.remove()
    return outputs


@contextmanager
def replay_blocks_below(model: nn.Module, stack: nn.ModuleList, layer: int, outputs: list) -> Iterator[None]:
    """Make blocks 0..layer-1 return the recorded output of block layer-1 for the current batch.

    Batches must come in the recorded order; the model's n-th call in the block uses outputs[n % len].
    """
    calls = [-1]

    def count(_module, _args):
        calls[0] += 1

    def replay(_self, *args, **kwargs):
        return outputs[calls[0] % len(outputs)]

    counter = model.register_forward_pre_hook(count)
    saved = [block.forward for block in stack[:layer]]
    for block in stack[:layer]:
        block.forward = types.MethodType(replay, block)
    try:
        yield
    finally:
        counter.remove()
        for block, forward in zip(stack[:layer], saved, strict=True):
            block.forward = forward


def _layers_below_replayed(model: nn.Module, task_eval: TaskEval, site: AttentionSite
                           ) -> contextlib.AbstractContextManager:
    """While `site`'s heads are masked, the layers below it replay their recorded outputs, when `task_eval` calls
    the model once per batch of its `model_inputs` (classification, perplexity; not generate(), whose calls per
    batch vary) and the site's stack is the model's only one."""
    inputs = getattr(task_eval, "model_inputs", None)
    if site.layer == 0 or inputs is None or model.config.is_encoder_decoder:
        return nullcontext()
    stack = layer_stack(model, site.kind)
    with task_eval.runtime.autocast():  # what the unreplayed evaluation would compute
        outputs = record_block_outputs(model, stack[site.layer - 1], inputs)
    return replay_blocks_below(model, stack, site.layer, outputs)


def ablation_tables(
    model: nn.Module, task_eval: TaskEval, n_resamples: int = 1000, seed: int = 0, progress: bool = True,
    site_indices: Sequence[int] | None = None, one_head: bool = True,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(ablation, one_head): every head masked alone, and every layer reduced to each single head.

    ablation: kind, layer, head, metric, delta, p_value (paired bootstrap against the full model).
    one_head: kind, layer, best_head, metric, delta (the best single head kept in that layer).
    delta is the change against the full model in the metric's good direction (`schema.improvement`): positive
    is better, also for a lower-is-better metric such as perplexity.
    `task_eval` is a `ClassificationEval` or a `TranslationEval` (BLEU).
    `site_indices` restricts the tables to those attention sites (a shard): a site's rows depend only on
    the site and the seed, so shards concatenated in site order equal the whole table. `one_head=False` leaves
    one_head empty (its evaluations, as many again as the single heads, are not run).
    """
    base, base_outputs = task_eval(model)
    sites = attention_sites(model)
    chosen = range(len(sites)) if site_indices is None else sorted(site_indices)
    ablation_rows, one_head_rows = [], []
    bar = tqdm(total=(1 + one_head) * sum(sites[i].num_heads for i in chosen), desc="ablate", disable=not progress)
    for index in chosen:
        site = sites[index]
        with head_gates(model) as gates, _layers_below_replayed(model, task_eval, site):
            best = None
            for head in range(site.num_heads):
                gates[index] = torch.ones_like(gates[index])
                gates[index][head] = 0.0
                score, masked_outputs = task_eval(model)
                p = task_eval.pvalue(masked_outputs, base_outputs, n_resamples, seed)
                ablation_rows.append(dict(kind=site.kind, layer=site.layer, head=head, metric=score,
                                          delta=improvement(task_eval.metric, score, base), p_value=p))
                bar.update()
            for head in range(site.num_heads if one_head else 0):
                gates[index] = torch.zeros_like(gates[index])
                gates[index][head] = 1.0
                score = task_eval(model)[0]
                if best is None or improvement(task_eval.metric, score, best[1]) > 0:
                    best = (head, score)
                bar.update()
            if best is not None:
                one_head_rows.append(dict(kind=site.kind, layer=site.layer, best_head=best[0], metric=best[1],
                                          delta=improvement(task_eval.metric, best[1], base)))
    bar.close()
    return pd.DataFrame(ablation_rows), pd.DataFrame(one_head_rows, columns=TABLE_COLUMNS[ONE_HEAD_TABLE])


def one_group_table(model: nn.Module, task_eval: TaskEval, progress: bool = True) -> pd.DataFrame:
    """Tables 2/3 under grouped-query attention: every layer reduced to one key/value group (its key/value head
    and the query heads it serves), each group in turn, the others masked. One row per layer with grouped-query
    attention: kind, layer, best_group, heads (the group's query heads), metric, delta (`schema.improvement`
    against the full model). Empty for a multi-head model."""
    base = task_eval(model)[0]
    sites = attention_sites(model)
    grouped = [(i, site) for i, site in enumerate(sites) if site.original_group_size > 1 and site.num_heads]
    rows = []
    bar = tqdm(total=sum(site.num_kv_heads for _, site in grouped), desc="ablate (one group)", disable=not progress)
    with head_gates(model) as gates:
        for index, site in grouped:
            with _layers_below_replayed(model, task_eval, site):
                best = _best_group(model, task_eval, gates, index, site, bar)
            gates[index] = torch.ones_like(gates[index])
            rows.append(dict(kind=site.kind, layer=site.layer, best_group=best[0], heads=len(best[2]),
                             metric=best[1], delta=improvement(task_eval.metric, best[1], base)))
    bar.close()
    return pd.DataFrame(rows, columns=["kind", "layer", "best_group", "heads", "metric", "delta"])


def _best_group(model: nn.Module, task_eval: TaskEval, gates: list, index: int, site: AttentionSite, bar: tqdm
                ) -> tuple[int, float, list[int]]:
    """(group, metric, its heads) of the best key/value group of `site` kept alone, the site's others masked."""
    best = None
    for g, group in enumerate(site.head_groups):
        gates[index] = torch.zeros_like(gates[index])
        gates[index][group] = 1.0
        score = task_eval(model)[0]
        if best is None or improvement(task_eval.metric, score, best[1]) > 0:
            best = (g, score, group)
        bar.update()
    return best


ModelAndEval = Callable[[], tuple[nn.Module, TaskEval]]


def _ablate_shard(load: ModelAndEval, site_index: int, threads: int, n_resamples: int, seed: int, one_head: bool
                  ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One site's rows, on a Dask worker. `load` should cache its result (functools.cache), so that a worker
    loads the model once and keeps it for its next sites."""
    torch.set_num_threads(threads)
    model, task_eval = load()
    return ablation_tables(model, task_eval, n_resamples, seed, progress=False, site_indices=[site_index],
                           one_head=one_head)


def sharded_ablation_tables(load: ModelAndEval, num_sites: int, workers: int, n_resamples: int = 1000,
                            seed: int = 0, one_head: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`ablation_tables` with one shard per attention site, on the Dask cluster at $DASK_SCHEDULER_ADDRESS, else
    a LocalCluster of `workers` processes. `load` is picklable (a module-level function or a partial of one)."""
    from distributed import Client, LocalCluster, as_completed

    address = os.environ.get("DASK_SCHEDULER_ADDRESS")
    threads = 1 if address else max(1, (os.cpu_count() or 1) // workers)
    with (Client(address) if address else Client(LocalCluster(n_workers=workers, threads_per_worker=1))) as client:
        futures = [client.submit(_ablate_shard, load, i, threads, n_resamples, seed, one_head, pure=False)
                   for i in range(num_sites)]
        # A tqdm bar like every other long loop here (Dask's own bar redraws every 100 ms, flooding logs).
        for _ in tqdm(as_completed(futures), total=len(futures), desc="ablate (sites)"):
            pass
        parts = client.gather(futures)
    return (pd.concat([a for a, _ in parts], ignore_index=True),
            pd.concat([o for _, o in parts], ignore_index=True))
