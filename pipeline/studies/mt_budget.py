"""BLEU per training minute: which Marian shape and learning rate make the best MT default for a time budget.

The MT experiment trains its model from scratch (mt/params.yaml, `model.name_or_path: scratch`), and its budget is
`make repro-mt` <= 45 minutes on 2 CPU cores. This study trains candidate shapes and learning rates on the
experiment's prepared data (run `dvc repro mt/dvc.yaml:prepare` first) and scores dev and test BLEU at the
experiment's beam (translate.num_beams) every few hundred steps. The inverse-sqrt schedule does not depend on the
total step count, so step k of a long run is the model a k-step run trains: one run per candidate gives its
whole curve.

Commands, so that candidates can run side by side without their timings sharing the cores:

    python -m pipeline.studies.mt_budget time  --d-model 256 --ffn-dim 1024     # seconds a step, alone
    python -m pipeline.studies.mt_budget train --d-model 256 --ffn-dim 1024 --learning-rate 1e-3 \\
        --steps 1200 --eval-steps 300 600 900 1200 --threads 1                  # BLEU by step
    python -m pipeline.studies.mt_budget checkpoints          # the finetune stage's own checkpoints, scored
    python -m pipeline.studies.mt_budget plot                                   # BLEU by minute

`plot` puts each run's steps on the minutes axis with the seconds a step of its shape measured by `time` (run
alone, at the stage's thread count), writes the table `mt_budget.csv` and the figure `mt_budget.png`.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import torch
from transformers import MarianConfig

from pipeline.files.atomic import write_bytes, write_csv
from pipeline.report.figures import png_bytes  # headless matplotlib, byte-identical PNGs for identical rows
from pipeline.run.experiment import Experiment, log
from pipeline.tasks.translation.bleu import bleu
from pipeline.tasks.translation.marian import new_marian
from pipeline.tasks.translation.training import TranslationTrainConfig, train_translation

OUT = Path("reports") / "studies" / "mt-budget"
STEP_SECONDS = "step_seconds.csv"
RUNS = "runs"
TARGET_BLEU = 32.0  # test BLEU, beam 4, on the leak-free split (issue 18)


@dataclasses.dataclass(frozen=True)
class Candidate:
    d_model: int
    ffn_dim: int
    learning_rate: float
    max_tokens: int

    @property
    def shape(self) -> str:
        return f"d{self.d_model}-ffn{self.ffn_dim}"

    @property
    def name(self) -> str:
        return f"{self.shape}-lr{self.learning_rate:g}-tok{self.max_tokens}"


def _model(exp: Experiment, c: Candidate) -> torch.nn.Module:
    """The experiment's Marian (vocabulary, layers, heads, dropout) at the candidate's width."""
    config = MarianConfig.from_pretrained(exp.base_model_dir)
    config.d_model, config.encoder_ffn_dim, config.decoder_ffn_dim = c.d_model, c.ffn_dim, c.ffn_dim
    model = new_marian(config, exp.params.seed).to(exp.runtime.device)
    model.set_attn_implementation(exp.params.model.attn_implementation)
    return model


def _train_config(exp: Experiment, c: Candidate, steps: int) -> TranslationTrainConfig:
    t = exp.params.finetune
    if t.schedule != "inverse_sqrt":
        raise SystemExit(f"error: finetune.schedule is {t.schedule!r}; this study reads a run's curve from its "
                         "checkpoints, which needs inverse_sqrt (a schedule that does not depend on the step count)")
    return TranslationTrainConfig(steps=steps, max_tokens=c.max_tokens, learning_rate=c.learning_rate,
                                  warmup_steps=t.warmup_steps, schedule=t.schedule,
                                  label_smoothing=t.label_smoothing, seed=exp.params.seed)


def time_steps(exp: Experiment, c: Candidate, steps: int, warmup: int, out: Path) -> float:
    """Mean seconds a training step of the candidate's shape, after `warmup` steps; appended to step_seconds.csv."""
    marks: dict[int, float] = {}
    train_translation(_model(exp, c), exp.splits()["train"], exp.tokenizer(), _train_config(exp, c, warmup + steps),
                      (warmup, warmup + steps), lambda step, _: marks.__setitem__(step, time.perf_counter()),
                      runtime=exp.runtime)
    seconds = (marks[warmup + steps] - marks[warmup]) / steps
    row = pd.DataFrame([{"shape": c.shape, "d_model": c.d_model, "ffn_dim": c.ffn_dim, "max_tokens": c.max_tokens,
                         "threads": torch.get_num_threads(), "steps": steps, "seconds_per_step": seconds}])
    path = out / STEP_SECONDS
    table = pd.concat([pd.read_csv(path), row]) if path.exists() else row
    write_csv(path, table.drop_duplicates(["shape", "max_tokens", "threads"], keep="last"))
    log.info("%s, %d tokens a batch: %.3f s a step (%d threads, mean of %d steps)", c.shape, c.max_tokens, seconds,
             torch.get_num_threads(), steps)
    return seconds


class _Scorer:
    """Scores a model as the curve's rows want it: test BLEU (beam translate.num_beams) at every step, dev at the
    last (what chooses the default; a dev decode at every step would double the study's scoring time)."""

    def __init__(self, exp: Experiment, c: Candidate, run: str, last: int):
        self.exp, self.c, self.run, self.last = exp, c, run, last
        self.evals = {split: exp.task.evaluation(split, num_beams=exp.params.translate.num_beams)
                      for split in ("dev", "test")}
        self.rows: list[dict] = []
        self.seconds = 0.0  # spent scoring, not training

    def __call__(self, step: int, model: torch.nn.Module, train_seconds: float | None = None) -> None:
        began = time.perf_counter()
        splits = ("dev", "test") if step == self.last else ("test",)
        with self.exp.runtime.autocast():
            scores = {split: bleu(self.evals[split](model)[1], self.evals[split].references)[0] for split in splits}
        self.seconds += time.perf_counter() - began
        c = self.c
        self.rows.append({"run": self.run, "shape": c.shape, "d_model": c.d_model, "ffn_dim": c.ffn_dim,
                          "parameters": sum(p.numel() for p in model.parameters()),
                          "learning_rate": c.learning_rate, "max_tokens": c.max_tokens, "step": step,
                          "dev_bleu": scores.get("dev"), "test_bleu": scores["test"],
                          "train_seconds": None if train_seconds is None else round(train_seconds, 1),
                          "threads": torch.get_num_threads()})
        log.info("%s step %d: BLEU %s", self.run, step, ", ".join(f"{k} {v:.2f}" for k, v in scores.items()))


def train_run(exp: Experiment, c: Candidate, steps: int, eval_steps: Sequence[int], out: Path,
              suffix: str = "") -> pd.DataFrame:
    """Train one candidate, scoring it at each of `eval_steps`; written to runs/<candidate><suffix>.csv."""
    scorer = _Scorer(exp, c, c.name + suffix, max(eval_steps))
    start = time.perf_counter()
    losses = train_translation(
        _model(exp, c), exp.splits()["train"], exp.tokenizer(), _train_config(exp, c, steps), sorted(set(eval_steps)),
        lambda step, m: scorer(step, m, time.perf_counter() - start - scorer.seconds), runtime=exp.runtime)
    table = pd.DataFrame(scorer.rows)
    # The training loss around each scored step (the mean of the 50 before it): noisy batch to batch.
    table["train_loss"] = [sum(losses[max(0, s - 50):s]) / len(losses[max(0, s - 50):s]) for s in table["step"]]
    write_csv(out / RUNS / f"{scorer.run}.csv", table)
    return table


def checkpoint_run(exp: Experiment, out: Path) -> pd.DataFrame:
    """Score the finetune stage's own training checkpoints (artifacts/<experiment>/checkpoints/): the default's
    curve up to its full step count, from the run `make repro-mt` made; written to runs/<candidate>-stage.csv."""
    checkpoints = {step: path for step, path in exp.checkpoint_dirs().items() if step > 0}
    if not checkpoints:
        raise SystemExit(f"error: no training checkpoints in {exp.checkpoints_dir}; run "
                         f"`dvc repro {exp.params_file.replace('params.yaml', 'dvc.yaml')}:finetune` first")
    m, t = exp.params.model, exp.params.finetune
    c = Candidate(m.d_model, m.ffn_dim, t.learning_rate, t.max_tokens)
    scorer = _Scorer(exp, c, f"{c.name}-stage", max(checkpoints))
    for step, path in checkpoints.items():
        scorer(step, exp.load(path))
    table = pd.DataFrame(scorer.rows)
    write_csv(out / RUNS / f"{scorer.run}.csv", table)
    return table


def curves(out: Path) -> pd.DataFrame:
    """Every run's rows with `minutes`: its steps times the seconds a step its shape took alone."""
    runs = sorted((out / RUNS).glob("*.csv"))
    if not runs:
        raise SystemExit(f"error: no runs in {out / RUNS}; run `python -m pipeline.studies.mt_budget train` first")
    table = pd.concat([pd.read_csv(p) for p in runs], ignore_index=True)
    timing_path = out / STEP_SECONDS
    if not timing_path.exists():
        raise SystemExit(f"error: no {timing_path}; run `python -m pipeline.studies.mt_budget time` for each shape")
    # The fastest thread count measured for a shape: the stage runs at torch's default, every core.
    timing = (pd.read_csv(timing_path).sort_values("seconds_per_step")
              .drop_duplicates(["shape", "max_tokens"])[["shape", "max_tokens", "seconds_per_step"]])
    table = table.merge(timing, on=["shape", "max_tokens"], how="left")
    untimed = sorted(table.loc[table["seconds_per_step"].isna(), "run"].unique())
    if untimed:
        raise SystemExit(f"error: no step time for the shapes of {untimed}; run `... time` for them")
    table["minutes"] = (table["step"] * table["seconds_per_step"] / 60).round(2)
    return table.sort_values(["run", "step"]).reset_index(drop=True)


def figure(table: pd.DataFrame) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (run, rows) in enumerate(table.groupby("run", sort=True)):
        ax.plot(rows["minutes"], rows["test_bleu"], marker="o", color=f"C{i}", label=run)
    ax.axhline(TARGET_BLEU, color="0.45", ls="--", lw=1, label=f"issue 18's target, {TARGET_BLEU:g}")
    ax.set_xlabel("training minutes (2 CPU cores, each shape's measured seconds a step)")
    ax.set_ylabel(f"test BLEU, beam {int(table['beam'].iloc[0])}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return png_bytes(fig)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipeline.studies.mt_budget", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("time", "train", "checkpoints", "plot"))
    parser.add_argument("--params", default="mt/params.yaml")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--d-model", type=int)
    parser.add_argument("--ffn-dim", type=int)
    parser.add_argument("--learning-rate", type=float, help="default: finetune.learning_rate")
    parser.add_argument("--max-tokens", type=int, help="tokens a batch; default: finetune.max_tokens")
    parser.add_argument("--steps", type=int, help="time: steps timed (default 60); train: steps trained")
    parser.add_argument("--warmup", type=int, default=5, help="time: steps before the clock starts")
    parser.add_argument("--eval-steps", type=int, nargs="+", default=(), help="train: steps to score BLEU at")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's, every core)")
    parser.add_argument("--suffix", default="", help="train: appended to the run's name (a second run of a candidate)")
    args = parser.parse_args(argv)
    if args.command == "plot":
        table = curves(args.out)
        table["beam"] = Experiment.from_params_file(args.params).params.translate.num_beams
        write_csv(args.out / "mt_budget.csv", table.drop(columns="beam"))
        write_bytes(args.out / "mt_budget.png", figure(table))
        print(table.to_string(index=False))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    exp = Experiment.from_params_file(args.params)
    if args.command == "checkpoints":
        checkpoint_run(exp, args.out)
        return
    m, t = exp.params.model, exp.params.finetune
    c = Candidate(args.d_model or m.d_model, args.ffn_dim or m.ffn_dim, args.learning_rate or t.learning_rate,
                  args.max_tokens or t.max_tokens)
    if args.command == "time":
        time_steps(exp, c, args.steps or 60, args.warmup, args.out)
    else:
        steps = args.steps or t.steps
        bad = [s for s in args.eval_steps if not 0 < s <= steps]
        if bad:
            raise SystemExit(f"error: --eval-steps {bad} lie outside 1..{steps} (--steps)")
        train_run(exp, c, steps, args.eval_steps or (steps,), args.out, args.suffix)


if __name__ == "__main__":
    main()
