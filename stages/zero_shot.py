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

from pipeline.files.atomic import write_csv, write_json
from pipeline.files.schema import ZERO_SHOT_SUMMARY
from pipeline.run.experiment import Experiment


def main(argv: list[str] | None = None) -> None:
    exp = Experiment.from_cli(argv)
    tables, summary = exp.task.stage("zero_shot").zero_shot(exp)
    for name, table in tables.items():
        write_csv(exp.reports / name, table)
    write_json(exp.reports / ZERO_SHOT_SUMMARY, exp.metrics(summary))


if __name__ == "__main__":
    main()
