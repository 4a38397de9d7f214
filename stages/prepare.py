"""Stage prepare: fetch the model and the task (offline default, hub or local), tokenise, save the splits.

What each family fetches and how it tokenises is its `prepare` (pipeline/tasks/<family>/prepare.py); this stage
writes the data folder, all or nothing.
"""

from __future__ import annotations

from pipeline.run.preflight import preflight

if __name__ == "__main__":  # the params and inputs in a second or two, before the imports below load torch
    preflight("prepare")

import shutil

from pipeline.data.local_files import InputError
from pipeline.files.atomic import staged_dir, write_json
from pipeline.files.schema import TASK_FILE
from pipeline.run.experiment import Experiment


def main(argv: list[str] | None = None) -> None:
    exp = Experiment.from_cli(argv)
    try:
        prepared = exp.task.stage("prepare").prepare(exp)
        with staged_dir(exp.data_dir) as staging:
            prepared.splits.save_to_disk(str(staging))
            write_json(staging / TASK_FILE, {**prepared.info,
                                             "sizes": {name: len(ds) for name, ds in prepared.splits.items()}})
            if prepared.extra is not None:
                prepared.extra(staging)
    except BaseException as error:
        # All or nothing: a prepare that fails leaves neither output (the base model is written first).
        for output in (exp.base_model_dir, exp.data_dir):
            shutil.rmtree(output, ignore_errors=True)
        if isinstance(error, InputError):  # what only the whole data shows, e.g. a hub dataset's columns
            raise SystemExit(f"error: {error}") from None
        raise


if __name__ == "__main__":
    main()
