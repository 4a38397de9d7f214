"""Stage ablate: every head masked alone (Table 1) and every layer reduced to one head (Tables 2/3).

Translation: BLEU of the decoded split (greedy by default, translate.sweep_num_beams), per attention kind.

With ABLATE_WORKERS=N (N > 1) the attention sites are shards spread over Dask workers: a Dask cluster
at $DASK_SCHEDULER_ADDRESS, else a LocalCluster of N processes. The tables equal the serial run's,
so this is an execution setting like OMP_NUM_THREADS, not a param DVC tracks.
"""

from __future__ import annotations

import functools
import os

import pandas as pd
import torch
from tqdm.auto import tqdm

from pipeline.core.sites import attention_sites
from pipeline.files.atomic import write_csv
from pipeline.methods.ablation import ablation_tables
from pipeline.run.experiment import Experiment, log
from pipeline.tasks.evaluation import ClassificationEval, TaskEval


@functools.cache
def _model_and_eval(params_file: str) -> tuple[torch.nn.Module, TaskEval]:
    exp = Experiment.from_params_file(params_file)
    p = exp.params
    model = exp.load(exp.finetuned_dir)
    if exp.is_translation:
        return model, exp.translation_eval(p.ablate.split, p.ablate.max_examples)
    eval_set = exp.eval_sets((p.ablate.split,), p.ablate.max_examples)[p.ablate.split]
    return model, ClassificationEval(eval_set, exp.task()["metric"])


def ablate_site(params_file: str, site_index: int, threads: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One shard, on a Dask worker (which loads the model once and keeps it for its next sites)."""
    torch.set_num_threads(threads)
    model, task_eval = _model_and_eval(params_file)
    p = Experiment.from_params_file(params_file).params
    return ablation_tables(model, task_eval, p.ablate.n_resamples, p.seed, progress=False,
                           site_indices=[site_index])


def sharded_tables(params_file: str, num_sites: int, workers: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    from distributed import Client, LocalCluster, as_completed

    address = os.environ.get("DASK_SCHEDULER_ADDRESS")
    threads = 1 if address else max(1, (os.cpu_count() or 1) // workers)
    with (Client(address) if address else Client(LocalCluster(n_workers=workers, threads_per_worker=1))) as client:
        futures = [client.submit(ablate_site, params_file, i, threads, pure=False) for i in range(num_sites)]
        # A tqdm bar like every other long loop here (Dask's own bar redraws every 100 ms, flooding logs).
        for _ in tqdm(as_completed(futures), total=len(futures), desc="ablate (sites)"):
            pass
        parts = client.gather(futures)
    return (pd.concat([a for a, _ in parts], ignore_index=True),
            pd.concat([o for _, o in parts], ignore_index=True))


def main() -> None:
    exp = Experiment.from_cli()
    p = exp.params
    workers = int(os.environ.get("ABLATE_WORKERS", "1"))
    model, task_eval = _model_and_eval(exp.params_file)
    if workers > 1:
        ablation, one_head = sharded_tables(exp.params_file, len(attention_sites(model)), workers)
    else:
        ablation, one_head = ablation_tables(model, task_eval, p.ablate.n_resamples, p.seed)
    ablation["examples"] = len(task_eval)
    write_csv(exp.reports / "ablation.csv", ablation)
    write_csv(exp.reports / "one_head.csv", one_head)
    significant = ablation[ablation.p_value < 0.05]
    log.info("ablate (%s, %d examples): %d of %d single-head removals significant (p<0.05), %d of them "
             "improve; worst delta %.2f, worst one-head layer delta %.2f", p.ablate.split, len(task_eval),
             len(significant), len(ablation), int((significant.delta > 0).sum()), ablation.delta.min(),
             one_head.delta.min())


if __name__ == "__main__":
    main()
