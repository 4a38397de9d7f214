"""Zero-shot accuracy of a causal LM, scored by lm-evaluation-harness (lm-eval) on tasks built offline from the
pinned wheels: what a pruned pretrained LLM can still do, beside what perplexity measures.

The tasks are zero_shot_tasks.ZERO_SHOT_TASKS (zero_shot.tasks picks them), on text no stage trains on:

- zero_shot_sentiment: Rotten Tomatoes snippets rated clearly positive or clearly negative (a mean human rating
  of at least 1 either way on the [-4, 4] scale), half of each; chance 1/2.
- zero_shot_last_word: LAMBADA's protocol on the Mueller report: a passage of whole sentences less its last word,
  which it already holds earlier; acc is whether greedy decoding gives the word exactly (chance 0), and its
  perplexity is reported beside.
- zero_shot_ending: WikiText-2 test sentences cut in half: the true second half among 4 of as many words; chance 1/4.
- zero_shot_next_sentence: a Mueller report sentence, and the sentence that follows it among 4 of its length from
  other paragraphs; chance 1/4.
- zero_shot_trec (opt-in): TREC-10 test questions by the coarse type of their answer; chance 1/6, where SmolLM2-135M
  sits.
- zero_shot_mmlu (opt-in): MMLU's test questions with lm-eval's own zero-shot prompt; chance 1/4, where a 135M model
  sits, for larger models.

A sample is a fixed, seeded draw of `items` items, balanced over the labels or the true answer's positions, so one
evaluation costs the same for every model, and every model of a study answers the same items.

`write_tasks` writes each task as lm-eval's own files: the sample as JSONL and a task YAML (`dataset_path: json`),
so the lm_eval command runs them as they are:

    lm_eval --model hf --model_args pretrained=<model folder> --include_path <task folder> \\
        --tasks zero_shot_sentiment,zero_shot_last_word,zero_shot_ending,zero_shot_next_sentence

A YAML names its JSONL by absolute path: lm-eval hands `data_files` to `datasets.load_dataset("json", ...)`,
which reads a relative path from the working directory, not from the YAML's folder. A moved task folder must be
written again (which is cheap and gives the same samples).

`zero_shot_accuracy` runs them through lm-eval's Hugging Face model class (HFLM) and `simple_evaluate`. A choice
is scored by the log-likelihood of " <choice>" after the prompt: acc picks the likeliest, acc_norm the likeliest per
character. Where every choice is one token (sentiment's words, MMLU's letters), lm-eval's logits cache scores all of
an item's choices with one forward pass; an ending or a sentence costs a forward pass per choice.

The means of zero_shot.json are over the tasks that move (`moving_tasks`: the unpruned model at least 10 points above
chance); zero_shot.csv has every task, with its chance level.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pipeline.files.schema import (
    FRACTION_PRUNED,
    GENERATIONS_TABLE,
    PRUNED_METRIC,
    RECOVERED_METRIC,
    TABLE_COLUMNS,
    TASK_MODEL,
    UNPRUNED_METRIC,
    UNPRUNED_MODEL,
    ZERO_SHOT_DIR,
    ZERO_SHOT_TABLE,
)
from pipeline.run.experiment import Experiment, log
from pipeline.tasks.language_modeling.recover import recovered_path
from pipeline.tasks.language_modeling.zero_shot_tasks import (
    CHANCE,
    DEFAULT_TASKS,
    MOVING_MARGIN,
    ZERO_SHOT_TASKS,
    moving_means,
    moving_tasks,
    recovered_label,
    write_task_configs,
)

ZERO_SHOT_COLUMNS = [*TABLE_COLUMNS[ZERO_SHOT_TABLE], CHANCE]  # zero_shot.csv's, in order
# Resamples of lm-eval's bootstrapped standard error, which of our metrics only a perplexity has (acc's is closed-form):
# lm-eval's default, 100,000, costs seconds a model for the error of a secondary number.
PERPLEXITY_RESAMPLES = 1000


@contextmanager
def _offline_and_quiet() -> Iterator[None]:
    """While lm-eval runs: only its errors are logged (it logs every step at INFO, and warns about what is meant
    here: a model passed as an object, an instruct model without its chat template), and `datasets` sends nothing.
    load_dataset("json") reads only the local files, but first counts the load on the hub's servers with a HEAD
    request (datasets.load.increase_load_count) unless HF_HUB_OFFLINE or HF_UPDATE_DOWNLOAD_COUNTS said otherwise
    when datasets was imported: offline, a failed DNS lookup at best, a 3 s timeout per task at worst.

    Also in one process: lm-eval bootstraps a perplexity's standard error in a multiprocessing pool unless
    DISABLE_MULTIPROC is set, forking this process with torch's threads running (slow, and a known way to hang);
    its resamples are seeded alike either way."""
    import datasets

    logger = logging.getLogger("lm_eval")
    level, counts = logger.level, datasets.config.HF_UPDATE_DOWNLOAD_COUNTS
    multiproc = os.environ.get("DISABLE_MULTIPROC")
    logger.setLevel(logging.ERROR)
    datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = False
    os.environ["DISABLE_MULTIPROC"] = "1"
    try:
        yield
    finally:
        logger.setLevel(level)
        datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = counts
        if multiproc is None:
            os.environ.pop("DISABLE_MULTIPROC")
        else:
            os.environ["DISABLE_MULTIPROC"] = multiproc


def check_prefix_tokenization(tokenize: Callable[[str], list[int]]) -> None:
    """lm-eval scores a choice as the tokens that prompt + choice has beyond the prompt's own; a tokenizer that
    appends a token (as the project's from-scratch LM tokenizers append </s>) would shift them onto the wrong
    positions without an error."""
    prompt = tokenize("Answer:")
    if tokenize("Answer: yes")[: len(prompt)] != prompt:
        raise ValueError("the tokenizer's encoding of a text is not a prefix of its encoding of a longer text "
                         "(does it append </s>?), which lm-eval's multiple-choice scoring assumes")


def zero_shot_accuracy(
    model: str | Path | PreTrainedModel,
    task_dir: str | Path,
    tasks: Sequence[str] = DEFAULT_TASKS,
    tokenizer: str | Path | PreTrainedTokenizerBase | None = None,
    batch_size: int = 32,
    device: str = "cpu",
    seed: int = 0,
) -> pd.DataFrame:
    """Evaluate `model` (a Hugging Face folder, or a model in memory) on the tasks written by `write_tasks` into
    `task_dir`, through lm-eval's HFLM and simple_evaluate. The tokenizer is `tokenizer`, else the model folder's
    (for a model in memory, the folder it was loaded from). Nothing is read from the hub. The same model and task
    files give the same table.

    Returns one row per task and metric (`ZeroShotTask.metrics`: acc and acc_norm, or for a last-word task acc and
    perplexity): task, metric, value, stderr (lm-eval's standard error), n (items), chance (the task's chance level
    of acc and acc_norm; empty for a perplexity)."""
    # Imported here: lm-eval imports its model registry (accelerate, peft hooks, ...), which only this needs.
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    with _offline_and_quiet():
        pretrained = str(model) if isinstance(model, str | Path) else model
        hflm = HFLM(pretrained=pretrained, tokenizer=str(tokenizer) if isinstance(tokenizer, Path) else tokenizer,
                    batch_size=batch_size, device=device)
        check_prefix_tokenization(hflm.tok_encode)
        # Only the task folder is indexed: lm-eval's own few thousand task YAMLs would take seconds to scan.
        manager = TaskManager(include_path=str(task_dir), include_defaults=False)
        results = simple_evaluate(model=hflm, tasks=list(tasks), task_manager=manager, log_samples=False,
                                  bootstrap_iters=PERPLEXITY_RESAMPLES, random_seed=seed, numpy_random_seed=seed,
                                  torch_random_seed=seed, fewshot_random_seed=seed)
    rows = []
    for task in tasks:
        scores, spec = results["results"][task], ZERO_SHOT_TASKS[task]
        for metric in spec.metrics:
            rows.append({"task": task, "metric": metric, "value": float(scores[f"{metric},none"]),
                         "stderr": float(scores[f"{metric}_stderr,none"]),
                         "n": int(results["n-samples"][task]["effective"]),
                         CHANCE: float("nan") if metric == "perplexity" else spec.chance})
    return pd.DataFrame(rows, columns=["task", "metric", "value", "stderr", "n", CHANCE])


# --- the zero_shot stage -------------------------------------------------------------------------------
def models(exp: Experiment) -> dict:
    """The models to read, by label: the unpruned and saved pruned ones, then each recovered one, by recover.methods
    (the headline method first)."""
    saved = exp.task.saved_models()
    recovered = {recovered_label(label, method): recovered_path(exp, method, path.name)
                 for method in exp.params.recover.methods for label, path in list(saved.items())[1:]}
    return {**saved, **{label: path for label, path in recovered.items() if path.is_dir()}}




@torch.inference_mode()
def completions(exp: Experiment, model: torch.nn.Module, tokenizer) -> list[str]:
    """Each of zero_shot.prompts completed greedily by `model`, zero_shot.new_tokens tokens at most."""
    z, out = exp.params.zero_shot, []
    for prompt in z.prompts:
        inputs = tokenizer(prompt, return_tensors="pt").to(exp.runtime.device)
        with exp.runtime.autocast():
            ids = model.generate(**inputs, max_new_tokens=z.new_tokens, do_sample=False,
                                 pad_token_id=exp.task.pad_token_id)
        out.append(tokenizer.decode(ids[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip())
    return out


def zero_shot(exp: Experiment) -> tuple[dict[str, pd.DataFrame], dict]:
    """(zero_shot.csv and generations.csv, zero_shot.json) for every model of `models`, on zero_shot.tasks; the
    means of zero_shot.json are over the tasks that move (`moving_tasks`)."""
    z, tokenizer = exp.params.zero_shot, exp.tokenizer()
    try:
        check_prefix_tokenization(lambda text: tokenizer(text)["input_ids"])
    except ValueError as error:  # a tokenizer trained from scratch here ends every text with </s>
        log.warning("zero_shot: no zero-shot accuracy or completions for %s: %s", exp.task_info()[TASK_MODEL], error)
        return ({ZERO_SHOT_TABLE: pd.DataFrame(columns=ZERO_SHOT_COLUMNS),
                 GENERATIONS_TABLE: pd.DataFrame(columns=TABLE_COLUMNS[GENERATIONS_TABLE])}, {})
    tables, generated = [], []
    # lm-eval's task YAMLs name their data by absolute path, so they are written here, beside no output, for the
    # samples that prepare wrote into the data folder.
    with tempfile.TemporaryDirectory() as task_dir:
        write_task_configs(task_dir, exp.data_dir / ZERO_SHOT_DIR, z.tasks)
        for label, path in models(exp).items():
            model = exp.load(path)
            with exp.runtime.autocast():
                table = zero_shot_accuracy(model, task_dir, z.tasks, tokenizer=tokenizer, batch_size=z.batch_size,
                                           device=str(exp.runtime.device), seed=exp.params.seed)
            tables.append(table.rename(columns={"n": "items"}).assign(model=label))
            generated += [dict(model=label, prompt=p, completion=c)
                          for p, c in zip(z.prompts, completions(exp, model, tokenizer), strict=True)]
            accuracy = table[table["metric"] == "acc"]
            log.info("zero_shot: %s: %s", label, ", ".join(f"{r.task} {100 * r.value:.1f}%"
                                                         for r in accuracy.itertuples()))
    table = pd.concat(tables, ignore_index=True)[ZERO_SHOT_COLUMNS]
    accuracy = table[table["metric"] == "acc"]
    moving = moving_tasks(accuracy)
    if apart := [task for task in dict.fromkeys(accuracy["task"]) if task not in moving]:
        log.warning("zero_shot: %s left out of the mean: the unpruned model is within %g points of chance there",
                    ", ".join(apart), 100 * MOVING_MARGIN)
    return ({ZERO_SHOT_TABLE: table, GENERATIONS_TABLE: pd.DataFrame(generated)},
            headline_accuracy(exp, {label: round(mean, 4) for label, mean in moving_means(accuracy).items()}))


def headline_accuracy(exp: Experiment, mean: dict[str, float]) -> dict:
    """zero_shot.json, the headline for `dvc metrics`: the mean accuracy (`mean`: lm-eval's acc over the tasks that
    move) of the unpruned model, of the most pruned saved one (`headline_model`, as benchmark.json's) and of it
    recovered. Numbers only: a model not read is left out."""
    summary = {UNPRUNED_METRIC: mean[UNPRUNED_MODEL]} if UNPRUNED_MODEL in mean else {}
    headline = exp.task.headline_model()
    if headline is not None:
        label, fraction = headline
        if label in mean:
            summary.update({PRUNED_METRIC: mean[label], FRACTION_PRUNED: round(float(fraction), 4)})
        if (recovered := recovered_label(label, exp.params.recover.method)) in mean:
            summary[RECOVERED_METRIC] = mean[recovered]
    return summary
