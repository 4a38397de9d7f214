"""Stage ablate: every head masked alone (Table 1) and every layer reduced to one head (Tables 2/3).

The score is the family's sweep evaluation (`Task.evaluation`): the metric of a classification split, the BLEU of
a decoded one (greedy by default, translate.sweep_num_beams), or perplexity (lower is better; the tables' delta is
positive where masking helped). Under grouped-query attention (language models) also one key/value group per layer.

With ABLATE_WORKERS=N (N > 1) the attention sites are shards spread over Dask workers: a Dask cluster
at $DASK_SCHEDULER_ADDRESS, else a LocalCluster of N processes. The tables equal the serial run's,
so this is an execution setting like OMP_NUM_THREADS, not a param DVC tracks.
"""

from __future__ import annotations

from pipeline.run.preflight import preflight

if __name__ == "__main__":  # the params in a second or two, before the imports below load torch
    preflight("ablate")

import functools
import os

import torch

from pipeline.core.sites import attention_sites
from pipeline.data.evaluation import TaskEval
from pipeline.files.atomic import write_csv, write_json
from pipeline.files.schema import (
    ABLATE_SUMMARY,
    ABLATION_TABLE,
    ALPHA,
    ONE_GROUP_TABLE,
    ONE_HEAD_TABLE,
    SIGNIFICANT,
    SIGNIFICANT_IMPROVING,
    WORST_DELTA,
    WORST_ONE_GROUP_DELTA,
    WORST_ONE_HEAD_DELTA,
)
from pipeline.methods.ablation import ablation_tables, one_group_table, sharded_ablation_tables
from pipeline.run.experiment import Experiment, log


@functools.cache  # once per process: a Dask worker keeps the model for its next sites
def model_and_eval(params_file: str) -> tuple[torch.nn.Module, TaskEval]:
    exp = Experiment.from_params_file(params_file)
    a = exp.params.ablate
    return exp.load(exp.finetuned_dir), exp.task.evaluation(a.split, a.max_examples)


def main(argv: list[str] | None = None) -> None:
    exp = Experiment.from_cli(argv)
    p = exp.params
    workers = int(os.environ.get("ABLATE_WORKERS", "1"))
    model, task_eval = model_and_eval(exp.params_file)
    if workers > 1:
        ablation, one_head = sharded_ablation_tables(functools.partial(model_and_eval, exp.params_file),
                                                     len(attention_sites(model)), workers, p.ablate.n_resamples,
                                                     p.seed, p.ablate.one_head)
    else:
        ablation, one_head = ablation_tables(model, task_eval, p.ablate.n_resamples, p.seed,
                                             one_head=p.ablate.one_head)
    ablation["examples"] = len(task_eval)
    write_csv(exp.reports / ABLATION_TABLE, ablation)
    write_csv(exp.reports / ONE_HEAD_TABLE, one_head)
    significant = ablation[ablation.p_value < ALPHA]
    # The headline for `dvc metrics`, numbers only: a key with no value (no one-head table) is left out.
    summary = {SIGNIFICANT: len(significant), SIGNIFICANT_IMPROVING: int((significant.delta > 0).sum()),
               WORST_DELTA: round(float(ablation.delta.min()), 4)}
    if len(one_head):
        summary[WORST_ONE_HEAD_DELTA] = round(float(one_head.delta.min()), 4)
    if exp.task.one_group_table:  # grouped-query attention: Tables 2/3 with a whole key/value group per layer kept
        one_group = one_group_table(model, task_eval)
        write_csv(exp.reports / ONE_GROUP_TABLE, one_group)
        if len(one_group):
            summary[WORST_ONE_GROUP_DELTA] = round(float(one_group.delta.min()), 4)
    write_json(exp.reports / ABLATE_SUMMARY, exp.metrics(summary))
    log.info("ablate (%s, %d examples): %d of %d single-head removals significant (p<%g), %d of them improve; "
             "worst delta %.2f, worst one-head layer delta %s", p.ablate.split, len(task_eval),
             summary[SIGNIFICANT], len(ablation), ALPHA, summary[SIGNIFICANT_IMPROVING],
             ablation.delta.min(), summary.get(WORST_ONE_HEAD_DELTA, "none"))


if __name__ == "__main__":
    main()
