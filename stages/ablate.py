"""Stage ablate: every head masked alone (Table 1) and every layer reduced to one head (Tables 2/3).

Translation: BLEU of the decoded split (greedy by default, translate.sweep_num_beams), per attention kind.
"""

from __future__ import annotations

from pipeline.ablation import ablation_tables
from pipeline.atomic import write_csv
from pipeline.evaluation import ClassificationEval
from pipeline.experiment import Experiment, log


def main() -> None:
    exp = Experiment.from_cli()
    p = exp.params
    model = exp.load(exp.finetuned_dir)
    if exp.is_translation:
        task_eval = exp.translation_eval(p.ablate.split, p.ablate.max_examples)
    else:
        eval_set = exp.eval_sets((p.ablate.split,), p.ablate.max_examples)[p.ablate.split]
        task_eval = ClassificationEval(eval_set, exp.task()["metric"])
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
