"""Zero-shot multiple-choice accuracy of a causal LM, scored by lm-evaluation-harness (lm-eval) on tasks built
offline from the pinned wheels: what a pruned pretrained LLM can still do, beside what perplexity measures.

The tasks (ZERO_SHOT_TASKS) are samples of the offline classification data (catalog.OFFLINE_TASKS) posed as
questions with one word per answer:

- zero_shot_sentiment: Rotten Tomatoes snippets rated clearly positive or clearly negative (a mean human rating
  of at least 1 either way on the [-4, 4] scale: the neutral middle is dropped), half of each; chance 0.5.
- zero_shot_trec: TREC-10 test questions (Li & Roth 2002) by the coarse type of their answer, as many of each of
  the 6 types as the 500 questions allow (abbreviations are only 9); chance 1/6.

A sample is a fixed, seeded draw of `n` items, balanced over the labels (`balanced_sample`), so one evaluation
costs the same for every model, and every model of a study answers the same items.

`write_tasks` writes each task as lm-eval's own files: the sample as JSONL and a task YAML (`dataset_path: json`,
`output_type: multiple_choice`, acc and acc_norm), so the lm_eval command runs them as they are:

    lm_eval --model hf --model_args pretrained=<model folder> --include_path <task folder> \\
        --tasks zero_shot_sentiment,zero_shot_trec

A YAML names its JSONL by absolute path: lm-eval hands `data_files` to `datasets.load_dataset("json", ...)`,
which reads a relative path from the working directory, not from the YAML's folder. A moved task folder must be
written again (which is cheap and gives the same samples).

`zero_shot_accuracy` runs them through lm-eval's Hugging Face model class (HFLM) and `simple_evaluate`. A choice
is scored by the log-likelihood of " <word>" after the prompt: acc picks the likeliest, acc_norm the likeliest per
character. Every choice word is a single token of SmolLM2's vocabulary, so lm-eval's logits cache scores all the
choices of an item with one forward pass.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import yaml
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pipeline.data.assets import fetch_asset
from pipeline.data.catalog import OFFLINE_TASKS
from pipeline.data.readers import load_trec, read_rotten_tomatoes_ratings
from pipeline.files.atomic import staged_dir
from pipeline.files.schema import (
    DEFAULT,
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

# Snippets whose mean rating lies strictly between -1 and 1 are left out: on the [-4, 4] scale they are mixed or
# mild, and a binary answer about them would measure the raters' disagreement more than the model.
CLEAR_RATING = 1.0


def sentiment_rows(path: str | Path) -> pd.DataFrame:
    """The clearly rated Rotten Tomatoes snippets: columns id, text, label (1 positive, 0 negative)."""
    df = read_rotten_tomatoes_ratings(path)
    df = df[df["sentiment"].abs() >= CLEAR_RATING]
    return pd.DataFrame({"id": df["id"].to_numpy(), "text": df["text"].to_numpy(),
                         "label": (df["sentiment"] > 0).astype("int64").to_numpy()})


def trec_rows(path: str | Path) -> pd.DataFrame:
    """TREC's official TREC-10 test questions: columns id (the file's row), text, label (the coarse class id)."""
    df = load_trec(path)
    df = df[df["split"] == "test"]
    return pd.DataFrame({"id": df.index.to_numpy(), "text": df["text"].to_numpy(), "label": df["label"].to_numpy()})


@dataclass(frozen=True)
class ZeroShotTask:
    """One multiple-choice task: which offline data it samples, and how lm-eval poses it."""

    name: str  # lm-eval's task name, and the stem of its files
    source: str  # the key of catalog.OFFLINE_TASKS whose pinned file it reads
    rows: Callable[[str | Path], pd.DataFrame]  # that file -> the candidate items (id, text, label)
    prompt: str  # lm-eval's doc_to_text: a Jinja template of the item's fields
    choices: tuple[str, ...]  # the answer words, by label id


ZERO_SHOT_TASKS = (
    ZeroShotTask("zero_shot_sentiment", DEFAULT, sentiment_rows, "Review: {{text}}\nSentiment:",
                 ("negative", "positive")),
    # The file's coarse label ids name DESC, ENTY, ABBR, HUM, NUM and LOC (catalog.OFFLINE_TASKS["trec"]).
    ZeroShotTask("zero_shot_trec", "trec", trec_rows, "Question: {{text}}\nAnswer type:",
                 ("description", "entity", "abbreviation", "human", "number", "location")),
)
TASK_NAMES = tuple(task.name for task in ZERO_SHOT_TASKS)


def balanced_sample(labels: np.ndarray, n: int, seed: int) -> np.ndarray:
    """Indices of `n` items drawn without replacement, as evenly over the labels as their counts allow (a label
    with too few items gives all it has, and the others share the rest), in increasing order."""
    if n > len(labels):
        raise ValueError(f"cannot sample {n} items from {len(labels)}")
    rng = np.random.default_rng(seed)
    pools = [rng.permutation(np.flatnonzero(labels == label)) for label in np.unique(labels)]
    taken = [0] * len(pools)
    left = n
    while left:
        open_pools = [i for i, pool in enumerate(pools) if taken[i] < len(pool)]
        share = max(1, left // len(open_pools))
        for i in open_pools:
            more = min(share, len(pools[i]) - taken[i], left)
            taken[i] += more
            left -= more
    return np.sort(np.concatenate([pool[:k] for pool, k in zip(pools, taken, strict=True)]))


def fetch_sources(cache_dir: Path) -> dict[str, Path]:
    """The pinned files the tasks read, by task name, fetched as the prepare stage fetches them (only what is
    missing from `cache_dir.parent / "assets"`)."""
    sources = {}
    for task in ZERO_SHOT_TASKS:
        offline = OFFLINE_TASKS[task.source]
        sources[task.name] = fetch_asset(offline.asset, cache_dir, cache_dir.parent / "assets" / offline.file_name)
    return sources


def task_config(task: ZeroShotTask, data_file: Path) -> dict:
    """lm-eval's task config of `task`, reading its items from the JSONL `data_file`."""
    return {
        "task": task.name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data_file)}},
        "test_split": "test",
        "output_type": "multiple_choice",
        "doc_to_text": task.prompt,
        "doc_to_choice": list(task.choices),
        "doc_to_target": "label",
        "num_fewshot": 0,  # 0 in the config: lm-eval then never turns the task into a few-shot one
        "metric_list": [{"metric": metric, "aggregation": "mean", "higher_is_better": True}
                        for metric in ("acc", "acc_norm")],
        "metadata": {"version": 1},
    }


class _TaskDumper(yaml.SafeDumper):
    """Writes a string with a line break in double quotes, as one would type the prompt ("a\\nb"), rather than
    folded over several lines."""


_TaskDumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style='"' if "\n" in text else None))


def write_samples(dest: str | Path, sources: Mapping[str, str | Path], n: int = 300, seed: int = 0) -> None:
    """Write, for each task, `n` items of its source file (`sources[task name]`, e.g. from `fetch_sources`) as
    `<name>.jsonl` into the folder `dest`, which may be a stage's output (they hold no path). The same files and
    arguments write the same bytes."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for task in ZERO_SHOT_TASKS:
        rows = task.rows(sources[task.name])
        sample = rows.iloc[balanced_sample(rows["label"].to_numpy(), n, seed)]
        lines = [json.dumps({"id": int(i), "text": text, "label": int(label)}, ensure_ascii=False)
                 for i, text, label in zip(sample["id"], sample["text"], sample["label"], strict=True)]
        (dest / f"{task.name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_task_configs(dest: str | Path, samples: str | Path) -> list[Path]:
    """Write each task's lm-eval config as `<name>.yaml` into the folder `dest`, reading the JSONL that
    `write_samples` wrote into `samples` by its absolute path. Returns the YAML paths."""
    dest, samples = Path(dest), Path(samples).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    for task in ZERO_SHOT_TASKS:
        header = (f"# lm-eval task written by pipeline/tasks/language_modeling/zero_shot.py: items of "
                  f"{OFFLINE_TASKS[task.source].name}.\n")
        config = yaml.dump(task_config(task, samples / f"{task.name}.jsonl"), Dumper=_TaskDumper, sort_keys=False,
                           allow_unicode=True, width=120)
        (dest / f"{task.name}.yaml").write_text(header + config, encoding="utf-8")
    return [dest / f"{task.name}.yaml" for task in ZERO_SHOT_TASKS]


def write_tasks(dest: str | Path, sources: Mapping[str, str | Path], n: int = 300, seed: int = 0) -> list[Path]:
    """`write_samples` and `write_task_configs` into one folder `dest` (replaced as a whole, atomically): what
    the lm_eval command line takes as --include_path. Returns the YAML paths."""
    dest = Path(dest).resolve()
    with staged_dir(dest) as staging:
        write_samples(staging, sources, n, seed)
        write_task_configs(staging, dest)
    return [dest / f"{task.name}.yaml" for task in ZERO_SHOT_TASKS]


@contextmanager
def _offline_and_quiet() -> Iterator[None]:
    """While lm-eval runs: only its errors are logged (it logs every step at INFO, and warns about what is meant
    here: a model passed as an object, an instruct model without its chat template), and `datasets` sends nothing.
    load_dataset("json") reads only the local files, but first counts the load on the hub's servers with a HEAD
    request (datasets.load.increase_load_count) unless HF_HUB_OFFLINE or HF_UPDATE_DOWNLOAD_COUNTS said otherwise
    when datasets was imported: offline, a failed DNS lookup at best, a 3 s timeout per task at worst."""
    import datasets

    logger = logging.getLogger("lm_eval")
    level, counts = logger.level, datasets.config.HF_UPDATE_DOWNLOAD_COUNTS
    logger.setLevel(logging.ERROR)
    datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = False
    try:
        yield
    finally:
        logger.setLevel(level)
        datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = counts


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
    tasks: Sequence[str] = TASK_NAMES,
    tokenizer: str | Path | PreTrainedTokenizerBase | None = None,
    batch_size: int = 32,
    device: str = "cpu",
    seed: int = 0,
) -> pd.DataFrame:
    """Evaluate `model` (a Hugging Face folder, or a model in memory) on the tasks written by `write_tasks` into
    `task_dir`, through lm-eval's HFLM and simple_evaluate. The tokenizer is `tokenizer`, else the model folder's
    (for a model in memory, the folder it was loaded from). Nothing is read from the hub. The same model and task
    files give the same table.

    Returns one row per task and metric: task, metric ("acc" or "acc_norm"), value, stderr (lm-eval's standard
    error of the mean), n (items)."""
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
                                  random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
                                  fewshot_random_seed=seed)
    rows = []
    for task in tasks:
        scores = results["results"][task]
        for metric in ("acc", "acc_norm"):
            rows.append({"task": task, "metric": metric, "value": float(scores[f"{metric},none"]),
                         "stderr": float(scores[f"{metric}_stderr,none"]),
                         "n": int(results["n-samples"][task]["effective"])})
    return pd.DataFrame(rows, columns=["task", "metric", "value", "stderr", "n"])


# --- the zero_shot stage -------------------------------------------------------------------------------
def models(exp: Experiment) -> dict:
    """The models to read, by label: the unpruned and saved pruned ones, then each recovered one, by recover.methods
    (the headline method first)."""
    saved = exp.task.saved_models()
    recovered = {recovered_label(label, method): recovered_path(exp, method, path.name)
                 for method in exp.params.recover.methods for label, path in list(saved.items())[1:]}
    return {**saved, **{label: path for label, path in recovered.items() if path.is_dir()}}


def recovered_label(label: str, method: str) -> str:
    """The label of the saved model `label` after recovery by `method`: "33% of KV groups, recovered (kd-lora)"."""
    return f"{label}, recovered ({method})"


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
    """(zero_shot.csv and generations.csv, zero_shot.json) for every model of `models`."""
    z, tokenizer = exp.params.zero_shot, exp.tokenizer()
    try:
        check_prefix_tokenization(lambda text: tokenizer(text)["input_ids"])
    except ValueError as error:  # a tokenizer trained from scratch here ends every text with </s>
        log.warning("zero_shot: no zero-shot accuracy or completions for %s: %s", exp.task_info()[TASK_MODEL], error)
        return ({ZERO_SHOT_TABLE: pd.DataFrame(columns=TABLE_COLUMNS[ZERO_SHOT_TABLE]),
                 GENERATIONS_TABLE: pd.DataFrame(columns=TABLE_COLUMNS[GENERATIONS_TABLE])}, {})
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
    accuracy = table[table["metric"] == "acc"]
    mean = {label: round(float(rows["value"].mean()), 4) for label, rows in accuracy.groupby("model", sort=False)}
    return {ZERO_SHOT_TABLE: table, GENERATIONS_TABLE: pd.DataFrame(generated)}, headline_accuracy(exp, mean)


def headline_accuracy(exp: Experiment, mean: dict[str, float]) -> dict:
    """zero_shot.json, the headline for `dvc metrics`: the mean accuracy (lm-eval's acc over the tasks) of the unpruned
    model, of the most pruned saved one (`headline_model`, as benchmark.json's) and of it recovered. Numbers only: a
    model not read is left out."""
    summary = {UNPRUNED_METRIC: mean[UNPRUNED_MODEL]} if UNPRUNED_MODEL in mean else {}
    headline = exp.task.headline_model()
    if headline is not None:
        label, fraction = headline
        if label in mean:
            summary.update({PRUNED_METRIC: mean[label], FRACTION_PRUNED: round(float(fraction), 4)})
        if (recovered := recovered_label(label, exp.params.recover.method)) in mean:
            summary[RECOVERED_METRIC] = mean[recovered]
    return summary
