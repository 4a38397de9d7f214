"""Stage finetune: fine-tune (or train) the base model on train; the metric on dev and test.

What training means is the family's `finetune` (pipeline/tasks/<family>/finetune.py): classification fine-tunes a
new head, translation and language modelling train a model from scratch or take a pretrained one as it is.
"""

from __future__ import annotations

from pipeline.run.preflight import preflight

if __name__ == "__main__":  # the params in a second or two, before the imports below load torch
    preflight("finetune")

import pandas as pd

from pipeline.files.atomic import write_csv, write_json
from pipeline.files.schema import (
    ABOUT_FILE,
    FINETUNE_SUMMARY,
    TASK_DATA,
    TASK_DATA_ATTRIBUTION,
    TASK_METRIC,
    TASK_MODEL,
    TRAINING_LOSS_TABLE,
)
from pipeline.run.experiment import Experiment


def main(argv: list[str] | None = None) -> None:
    exp = Experiment.from_cli(argv)
    result = exp.task.stage("finetune").finetune(exp)
    exp.save(result.model, exp.finetuned_dir)
    if result.losses is not None:  # the loss of every step of a model trained here; empty for one taken as it is
        write_csv(exp.reports / TRAINING_LOSS_TABLE,
                  pd.DataFrame({"step": range(1, len(result.losses) + 1), "loss": result.losses}))
    write_json(exp.reports / FINETUNE_SUMMARY, exp.metrics(result.summary))  # numbers and the precision: DVC metrics
    # What about.json repeats of task.json for the report's title and credits: the metric, the model, the data and
    # its attribution; then the family's own descriptions.
    task = exp.task_info()
    write_json(exp.reports / ABOUT_FILE,
               {**{key: task[key] for key in (TASK_METRIC, TASK_MODEL, TASK_DATA, TASK_DATA_ATTRIBUTION)},
                **result.about})


if __name__ == "__main__":
    main()
