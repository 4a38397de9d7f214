"""Stage zero_shot: what users of pretrained LLMs read beside perplexity, for the unpruned model, every pruned model
the prune stage saved and every recovered one (language models only).

- Zero-shot accuracy through lm-evaluation-harness: its own task YAMLs over the local files prepare wrote (no hub),
  run through its Hugging Face model class on the loaded model (zero_shot.csv, zero_shot.json).
- Greedy completions of fixed prompts, dense beside pruned (generations.csv).
"""

from __future__ import annotations

from pipeline.run.preflight import preflight

if __name__ == "__main__":  # the params in a second or two, before the imports below load torch
    preflight("zero_shot")

import tempfile

import pandas as pd
import torch

from pipeline.files.atomic import write_csv, write_json
from pipeline.files.schema import (
    GENERATIONS_TABLE,
    TABLE_COLUMNS,
    TASK_MODEL,
    ZERO_SHOT_DIR,
    ZERO_SHOT_SUMMARY,
    ZERO_SHOT_TABLE,
)
from pipeline.lm.zero_shot import check_prefix_tokenization, write_task_configs, zero_shot_accuracy
from pipeline.run.experiment import Experiment, log


def models(exp: Experiment) -> dict:
    """The models to read, by label: the unpruned and saved pruned ones, then each recovered one."""
    saved = exp.saved_models()
    recovered = {f"{label}, recovered ({exp.params.recover.method})": exp.recovered_root / path.name
                 for label, path in list(saved.items())[1:] if (exp.recovered_root / path.name).is_dir()}
    return {**saved, **recovered}


@torch.inference_mode()
def completions(exp: Experiment, model: torch.nn.Module, tokenizer) -> list[str]:
    """Each of zero_shot.prompts completed greedily by `model`, zero_shot.new_tokens tokens at most."""
    z, out = exp.params.zero_shot, []
    for prompt in z.prompts:
        inputs = tokenizer(prompt, return_tensors="pt").to(exp.runtime.device)
        with exp.runtime.autocast():
            ids = model.generate(**inputs, max_new_tokens=z.new_tokens, do_sample=False,
                                 pad_token_id=exp.pad_token_id)
        out.append(tokenizer.decode(ids[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip())
    return out


def main() -> None:
    exp = Experiment.from_cli()
    z, tokenizer = exp.params.zero_shot, exp.tokenizer()
    try:
        check_prefix_tokenization(lambda text: tokenizer(text)["input_ids"])
    except ValueError as error:  # a tokenizer trained from scratch here ends every text with </s>
        log.warning("zero_shot: no zero-shot accuracy or completions for %s: %s", exp.task()[TASK_MODEL], error)
        write_csv(exp.reports / ZERO_SHOT_TABLE, pd.DataFrame(columns=TABLE_COLUMNS[ZERO_SHOT_TABLE]))
        write_csv(exp.reports / GENERATIONS_TABLE, pd.DataFrame(columns=TABLE_COLUMNS[GENERATIONS_TABLE]))
        write_json(exp.reports / ZERO_SHOT_SUMMARY, {"mean_accuracy": {}})
        return
    tables, generated = [], []
    # lm-eval's task YAMLs name their data by absolute path, so they are written here, beside no output, for the
    # samples that prepare wrote into the data folder.
    with tempfile.TemporaryDirectory() as task_dir:
        write_task_configs(task_dir, exp.data_dir / ZERO_SHOT_DIR)
        for label, path in models(exp).items():
            model = exp.load(path)
            with exp.runtime.autocast():
                table = zero_shot_accuracy(model, task_dir, tokenizer=tokenizer, batch_size=z.batch_size,
                                           device=str(exp.runtime.device), seed=exp.params.seed)
            tables.append(table.rename(columns={"n": "items"}).assign(model=label))
            generated += [dict(model=label, prompt=p, completion=c)
                          for p, c in zip(z.prompts, completions(exp, model, tokenizer), strict=True)]
            accuracy = table[table["metric"] == "acc"]
            log.info("zero_shot: %s: %s", label, ", ".join(f"{r.task} {100 * r.value:.1f}%"
                                                         for r in accuracy.itertuples()))
    table = pd.concat(tables, ignore_index=True)[["model", "task", "metric", "value", "stderr", "items"]]
    write_csv(exp.reports / ZERO_SHOT_TABLE, table)
    write_csv(exp.reports / GENERATIONS_TABLE, pd.DataFrame(generated))
    # The headline for `dvc metrics`: each model's mean accuracy (lm-eval's acc) over the tasks.
    accuracy = table[table["metric"] == "acc"]
    write_json(exp.reports / ZERO_SHOT_SUMMARY, {"mean_accuracy": {
        label: round(float(rows["value"].mean()), 4) for label, rows in accuracy.groupby("model", sort=False)}})


if __name__ == "__main__":
    main()
