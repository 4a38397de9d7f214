"""Stage ablate: every head masked alone (Table 1) and every layer reduced to one head (Table 2)."""

from __future__ import annotations

from pipeline.ablation import ablation_tables
from pipeline.atomic import write_csv
from pipeline.experiment import Experiment, log


def main() -> None:
    exp = Experiment.from_params_file()
    p = exp.params
    model = exp.load(exp.finetuned_dir)
    eval_set = exp.eval_sets((p.ablate.split,), p.ablate.max_examples)[p.ablate.split]
    ablation, one_head = ablation_tables(model, eval_set, exp.task()["metric"], p.ablate.n_resamples, p.seed)
    ablation["examples"] = len(eval_set)
    write_csv(exp.reports / "ablation.csv", ablation)
    write_csv(exp.reports / "one_head.csv", one_head)
    significant = ablation[ablation.p_value < 0.05]
    log.info("ablate (%s, %d examples): %d of %d single-head removals significant (p<0.05), %d of them "
             "improve; worst delta %.2f, worst one-head layer delta %.2f", p.ablate.split, len(eval_set),
             len(significant), len(ablation), int((significant.delta > 0).sum()), ablation.delta.min(),
             one_head.delta.min())


if __name__ == "__main__":
    main()
