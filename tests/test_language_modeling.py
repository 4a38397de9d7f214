"""The language-modeling task: data, tokenizer, batches, the causal loss, perplexity and its bootstrap, the
params, and prepare + finetune end to end on a tiny corpus. Models are tiny random Llamas built from configs."""

from __future__ import annotations

import gzip
import math
import os
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
import yaml
from torch import nn

from pipeline.config.params import ParamsError, parse_params
from pipeline.core.importance import per_example_loss
from pipeline.data.local_files import InputError
from pipeline.data.subword import train_tokenizer
from pipeline.files.schema import (
    PERPLEXITY,
    SPLITS,
    TOLERANCE,
    improvement,
    tolerance_text,
    within_tolerance,
    worst_acceptable,
)
from pipeline.methods.pruning import prunable_fraction
from pipeline.tasks.language_modeling import data as lm_data
from pipeline.tasks.language_modeling.inputs import language_modeling_source_problems
from pipeline.tasks.language_modeling.llama import collate_texts, llama_config, new_llama, token_nll
from pipeline.tasks.language_modeling.perplexity import LanguageModelEval, perplexity, unigram_perplexity
from pipeline.tasks.language_modeling.training import LanguageModelTrainConfig, train_language_model

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("the cat dog bird sees eats runs a big small red house tree in on under and it is was very").split()


def corpus(n: int = 400, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 9)))) for _ in range(n)]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(corpus(), vocab_size=80, lead_eos=True)


@pytest.fixture(scope="module")
def model(tokenizer):
    config = llama_config(tokenizer, hidden_size=32, layers=2, heads=4, kv_heads=2, intermediate_size=48,
                          max_positions=32)
    return new_llama(config, seed=0)


def encode(tokenizer, texts: list[str]) -> list[list[int]]:
    return tokenizer(texts)["input_ids"]


# --- the tokenizer and the batches ---------------------------------------------------------------------------------


def test_lm_texts_start_and_end_with_eos_and_mt_tokenizers_are_unchanged(tokenizer):
    ids = tokenizer("the cat sees a tree")["input_ids"]
    assert ids[0] == ids[-1] == tokenizer.eos_token_id == 1
    assert tokenizer.bos_token_id == tokenizer.eos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == "the cat sees a tree"
    mt = train_tokenizer(corpus(), vocab_size=80)
    assert mt("the cat")["input_ids"][0] != mt.eos_token_id and mt.bos_token is None


def test_llama_config_has_grouped_query_attention(model):
    assert model.config.num_attention_heads == 4 and model.config.num_key_value_heads == 2
    assert model.model.layers[0].self_attn.k_proj.out_features == 2 * 8  # kv_heads x head_dim


def test_collate_puts_minus_100_on_padding_only():
    batch = collate_texts([[1, 5, 6, 1], [1, 7, 1]], pad_id=0)
    assert batch["input_ids"].tolist() == [[1, 5, 6, 1], [1, 7, 1, 0]]
    assert batch["labels"].tolist() == [[1, 5, 6, 1], [1, 7, 1, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]


def test_token_windows_predict_every_token_but_the_first_exactly_once():
    ids = list(range(100, 123))
    windows = lm_data.token_windows(ids, 5)
    assert all(2 <= len(w) <= 5 for w in windows)
    predicted = [t for w in windows for t in w[1:]]
    assert predicted == ids[1:]
    assert lm_data.token_windows(ids[:5], 5) == [ids[:5]]


# --- the causal loss -----------------------------------------------------------------------------------------------


def test_extra_padding_leaves_every_loss_unchanged(model, tokenizer):
    short, long = encode(tokenizer, ["the cat", "a very big red house is in the tree and it is small"])
    alone = collate_texts([short], tokenizer.pad_token_id)
    together = collate_texts([short, long], tokenizer.pad_token_id)  # short gets many pad positions
    with torch.no_grad():
        assert torch.allclose(per_example_loss(model, alone)[0], per_example_loss(model, together)[0], atol=1e-5)
    evals = [LanguageModelEval([short, long], tokenizer.pad_token_id, batch_size=b) for b in (1, 2)]
    one_by_one, padded = (e(model)[1] for e in evals)
    np.testing.assert_allclose(one_by_one, padded, rtol=1e-5)
    assert padded[:, 1].tolist() == [len(short) - 1, len(long) - 1]  # pad is never a predicted token


def test_per_example_loss_of_a_causal_lm_is_the_next_token_nll_hugging_face_computes(model, tokenizer):
    batch = collate_texts(encode(tokenizer, ["the dog runs", "it was a very small bird"]), tokenizer.pad_token_id)
    with torch.no_grad():
        ours = per_example_loss(model, batch)
        for row in range(2):
            one = {k: v[row : row + 1] for k, v in batch.items()}
            keep = one["attention_mask"][0].bool()
            hf = model(input_ids=one["input_ids"][:, keep], labels=one["labels"][:, keep]).loss
            assert ours[row] == pytest.approx(float(hf), rel=1e-5)


class FixedDistribution(nn.Module):
    """Predicts the same next-token distribution `probs` at every position."""

    def __init__(self, probs: torch.Tensor):
        super().__init__()
        self.log_probs = nn.Parameter(probs.log(), requires_grad=False)

    def forward(self, input_ids, attention_mask=None, **_):
        return type("Out", (), {"logits": self.log_probs.expand(*input_ids.shape, -1)})()


def test_perplexity_of_a_known_distribution():
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    sequences = [[0, 3, 3, 2], [1, 1], [2, 0, 3]]
    predicted = [t for s in sequences for t in s[1:]]
    expected = math.exp(-np.mean([math.log(probs[t]) for t in predicted]))
    score, outputs = LanguageModelEval(sequences, pad_id=0, batch_size=2)(FixedDistribution(probs))
    assert score == pytest.approx(expected, rel=1e-9)
    assert perplexity(outputs) == score
    uniform = LanguageModelEval(sequences, pad_id=0)(FixedDistribution(torch.full((4,), 0.25)))[0]
    assert uniform == pytest.approx(4.0)


def test_token_nll_ignores_labels_minus_100():
    logits = torch.randn(1, 4, 5)
    labels = torch.tensor([[2, 3, -100, -100]])
    nll, tokens = token_nll(logits, labels)
    assert tokens.tolist() == [1]
    assert float(nll[0]) == pytest.approx(float(-logits[0, 0].log_softmax(-1)[3]), rel=1e-6)


def test_unigram_perplexity_of_uniform_text_is_the_vocabulary_size():
    train = [[9, 0, 1, 2, 3]] * 10
    assert unigram_perplexity(train, [[9, 3, 2, 1, 0]], vocab_size=4) == pytest.approx(4.0)


def test_pvalue_is_one_for_identical_models_and_small_for_a_clearly_better_one():
    rng = np.random.default_rng(0)
    tokens = rng.integers(5, 15, size=200).astype(float)
    base = np.stack([tokens * 3.0 + rng.normal(0, 1, 200), tokens], axis=1)
    better = base.copy()
    better[:, 0] -= tokens * 0.3  # every text gains 0.3 nats a token
    evaluator = LanguageModelEval([[1, 2]], pad_id=0)
    assert evaluator.pvalue(base, base, 200, seed=0) == 1.0
    p = evaluator.pvalue(better, base, 500, seed=0)
    assert p < 0.01 and p == evaluator.pvalue(better, base, 500, seed=0)
    noisy = base.copy()
    noisy[:, 0] += rng.normal(0, 1, 200)  # no systematic difference
    assert evaluator.pvalue(noisy, base, 500, seed=0) > 0.01


# --- metric direction ----------------------------------------------------------------------------------------------


def test_perplexity_is_lower_is_better_with_a_relative_tolerance():
    assert improvement(PERPLEXITY, 40.0, 50.0) == 10.0 and improvement("accuracy", 40.0, 50.0) == -10.0
    assert worst_acceptable(PERPLEXITY, 40.0) == pytest.approx(42.0)
    assert within_tolerance(PERPLEXITY, 42.0, 40.0) and not within_tolerance(PERPLEXITY, 42.1, 40.0)
    assert within_tolerance("accuracy", 84.0 - TOLERANCE, 84.0)
    assert tolerance_text(PERPLEXITY) == "5% perplexity" and tolerance_text("bleu", "BLEU point") == "1 BLEU point"


def test_prunable_fraction_of_perplexity_stops_where_it_rises_more_than_5_percent():
    import pandas as pd

    curve = pd.DataFrame({"method": "importance", "split": "test", "fraction_pruned": [0.0, 0.1, 0.2, 0.3, 0.4],
                          "metric": [40.0, 38.0, 41.9, 42.5, 41.0]})
    assert prunable_fraction(curve, "importance", "test", PERPLEXITY) == (0.2, 41.9, 40.0)


# --- training --------------------------------------------------------------------------------------------------------


def test_training_lowers_perplexity_and_is_deterministic_for_a_seed(tokenizer):
    sequences = encode(tokenizer, corpus(300))
    config = llama_config(tokenizer, hidden_size=32, layers=2, heads=4, kv_heads=2, intermediate_size=48,
                          max_positions=32)
    held_out = LanguageModelEval(encode(tokenizer, corpus(50, seed=1)), tokenizer.pad_token_id)
    runs = []
    for _ in range(2):
        model = new_llama(config, seed=0)
        before = held_out(model)[0]
        losses = train_language_model(model, sequences, tokenizer.pad_token_id,
                                      LanguageModelTrainConfig(steps=30, batch_size=32, warmup_steps=5),
                                      progress=False)
        runs.append((before, held_out(model)[0], losses))
    (before, after, losses), (_, after_again, losses_again) = runs
    assert after < 0.5 * before and losses[-1] < losses[0]
    assert losses == losses_again and after == after_again


# --- data -----------------------------------------------------------------------------------------------------------


def test_split_texts_is_deterministic_deduplicated_and_disjoint():
    texts = [f"sentence {i % 500}" for i in range(1000)]  # every text twice
    a, b = lm_data.split_texts(texts, (0.8, 0.1, 0.1), seed=3), lm_data.split_texts(texts, (0.8, 0.1, 0.1), seed=3)
    assert a == b
    assert [len(a[s]) for s in SPLITS] == [400, 50, 50]
    assert len(set().union(*map(set, a.values()))) == 500
    assert lm_data.split_texts(texts, (0.8, 0.1, 0.1), seed=4)["test"] != a["test"]


def test_tatoeba_source_is_the_english_side_of_the_pairs_deduplicated(tmp_path):
    rows = [(f"English {i % 30}.", f"Español {i}.", f"CC-BY 2.0 (France) Attribution: tatoeba.org #{i}")
            for i in range(90)]
    path = tmp_path / "spa.tsv"
    path.write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")
    dsd = lm_data.load_language_modeling_task("tatoeba", tatoeba_path=path, fractions=(0.6, 0.2, 0.2), seed=0)
    texts = [t for s in SPLITS for t in dsd[s]["text"]]
    assert sorted(texts) == sorted({r[0] for r in rows}) and len(dsd["test"]) == 6


def test_default_source_is_wikitext_2_raw_from_its_gzipped_files_with_the_empty_rows_dropped(tmp_path):
    rows = {"train": ["", " = Valkyria = ", " It is a game . ", ""], "dev": ["", " Dev . "], "test": [" Test . ", " "]}
    paths = {}
    for split, lines in rows.items():
        paths[split] = tmp_path / f"{split}.raw.gz"
        with gzip.open(paths[split], "wt", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    dsd = lm_data.load_language_modeling_task("default", wikitext_paths=paths, max_eval_texts=1000)
    # The rows as the hub's wikitext-2-raw-v1 has them, newline and all (the hub loader's test has the same rows).
    assert dsd["train"]["text"] == [" = Valkyria = \n", " It is a game . \n"]
    assert dsd["dev"]["text"] == [" Dev . \n"] and dsd["test"]["text"] == [" Test . \n"]
    with pytest.raises(ValueError, match="wikitext_paths"):
        lm_data.load_language_modeling_task("default")


def test_local_text_file_and_folder(tmp_path):
    (tmp_path / "one.txt").write_text("\n".join(corpus(100)) + "\n\n  \n")
    dsd = lm_data.load_language_modeling_task(str(tmp_path / "one.txt"), fractions=(0.8, 0.1, 0.1), seed=0)
    assert set(dsd) == set(SPLITS) and all(len(dsd[s]) for s in SPLITS)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "train.txt").write_text("a b c\nd e f\ng h i\n")
    (folder / "valid.txt").write_text("dev text\n")
    (folder / "test.jsonl").write_text('{"text": "test text"}\n')
    dsd = lm_data.load_language_modeling_task(str(folder))
    assert dsd["dev"]["text"] == ["dev text"] and dsd["test"]["text"] == ["test text"] and len(dsd["train"]) == 3


@pytest.mark.parametrize(("name", "content", "message"), [
    ("texts.csv", "text\nfine\n\n\"\"\n", "1 row(s) with no text in column 'text'"),
    ("texts.csv", "words\nfine\n", "missing column(s) ['text']"),
    ("texts.txt", "\n  \n", "holds no text"),
    ("texts.txt", b"caf\xe9\n", "not UTF-8"),
])
def test_bad_local_texts_are_refused_in_one_line(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    problems = language_modeling_source_problems(str(path), "text", (0.8, 0.1, 0.1))
    assert len(problems) == 1 and message in problems[0] and "\n" not in problems[0]
    with pytest.raises(InputError, match="data"):
        lm_data.load_language_modeling_task(str(path))


def test_wikitext_maps_validation_to_dev_and_drops_empty_rows(tmp_path, monkeypatch):
    # The hub's schema (Salesforce/wikitext: a text column, train/validation/test), from local parquet files.
    files = {}
    for split, rows in {"train": ["", " = Valkyria = \n", " It is a game . \n", ""], "validation": ["", " Dev . \n"],
                        "test": [" Test . \n", ""]}.items():
        files[split] = str(tmp_path / f"{split}.parquet")
        datasets.Dataset.from_dict({"text": rows}).to_parquet(files[split])
    seen = []

    def local_hub(repo, config):
        seen.append((repo, config))
        return datasets.load_dataset("parquet", data_files=files, cache_dir=str(tmp_path / "cache"))

    monkeypatch.setattr(lm_data, "fetch_hub_texts", local_hub)
    dsd = lm_data.load_language_modeling_task("wikitext/wikitext-2-raw-v1")
    assert seen == [("Salesforce/wikitext", "wikitext-2-raw-v1")]
    assert dsd["train"]["text"] == [" = Valkyria = \n", " It is a game . \n"]
    assert dsd["dev"]["text"] == [" Dev . \n"] and dsd["test"]["text"] == [" Test . \n"]
    with pytest.raises(InputError, match="unknown wikitext config"):
        lm_data.load_language_modeling_task("wikitext/wikitext-7")


# --- params ---------------------------------------------------------------------------------------------------------


def test_the_llm_default_is_the_pretrained_smollm2_on_wikitext_and_the_scratch_llama_is_an_experiment_file():
    params = parse_params(yaml.safe_load((ROOT / "llm" / "params.yaml").read_text()))
    assert params.task == "language-modeling" and (params.model.name_or_path, params.data.source) == ("default",) * 2
    assert params.data.max_eval_texts >= 1000  # perplexity over at least 1,000 texts a split
    scratch = parse_params(yaml.safe_load((ROOT / "experiments" / "tatoeba-llama.yaml").read_text()))
    assert (scratch.model.name_or_path, scratch.data.source) == ("scratch", "tatoeba")
    assert scratch.model.kv_heads < scratch.model.heads
    # DVC needs every param a stage declares in the file: the same sections as llm/params.yaml, no fewer.
    assert set(yaml.safe_load((ROOT / "llm" / "params.yaml").read_text())) <= set(
        yaml.safe_load((ROOT / "experiments" / "tatoeba-llama.yaml").read_text()))


@pytest.mark.parametrize(("raw", "message"), [
    ({"model": {"heads": 8, "kv_heads": 3}}, "model.heads (8) must be a multiple of kv_heads (3)"),
    ({"model": {"hidden_size": 100}}, "model.hidden_size (100) must be divisible by heads (8)"),
    ({"model": {"name_or_path": "Qwen/Qwen2.5-0.5B", "layers": 3}}, "model.layers: the shape of a scratch model"),
    ({"data": {"max_lenght": 64}}, "data.max_lenght: unknown key; allowed here: source"),
    ({"finetune": {"steps": 0}}, "finetune.steps: Input should be greater than or equal to 1"),
    ({"prune": {"unit": "heads"}}, "prune.unit: Input should be 'query' or 'group'"),
])
def test_bad_lm_params_fail_in_one_line(raw, message):
    with pytest.raises(ParamsError) as error:
        parse_params({"task": "language-modeling", **raw})
    assert message in str(error.value) and "\n" not in str(error.value)


# --- prepare + finetune end to end ---------------------------------------------------------------------------------


def tiny_lm_params() -> dict:
    params = yaml.safe_load((ROOT / "experiments" / "tatoeba-llama.yaml").read_text())
    params["experiment"] = "tiny-lm"
    params["runtime"]["device"] = "cpu"
    params["model"].update(vocab_size=120, hidden_size=32, layers=2, heads=4, kv_heads=2, intermediate_size=48)
    params["data"].update(source="corpus.txt", max_eval_texts=40, max_length=12)
    params["finetune"].update(steps=20, batch_size=16, warmup_steps=4)
    return params


def run_stage(stage: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", f"stages.{stage}", "--params", "params.yaml"], cwd=cwd, env=env,
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lm")
    (root / "params.yaml").write_text(yaml.safe_dump(tiny_lm_params(), sort_keys=False))
    (root / "corpus.txt").write_text("\n".join(corpus(400)) + "\n")
    result = run_stage("prepare", root)
    assert result.returncode == 0, result.stderr
    return root


@pytest.mark.slow  # the prepare stage in a subprocess
def test_prepare_trains_a_tokenizer_and_saves_token_sequences(prepared):
    from transformers import AutoTokenizer, LlamaConfig

    base, data = prepared / "artifacts/tiny-lm/base_model", prepared / "artifacts/tiny-lm/data"
    config = LlamaConfig.from_pretrained(base)
    assert (config.num_attention_heads, config.num_key_value_heads, config.max_position_embeddings) == (4, 2, 12)
    assert len(AutoTokenizer.from_pretrained(base)) == config.vocab_size <= 120
    splits = datasets.load_from_disk(str(data))
    assert set(splits) == set(SPLITS) and splits["train"].column_names == ["input_ids"]
    assert max(len(ids) for s in SPLITS for ids in splits[s]["input_ids"]) <= 12
    task = yaml.safe_load((data / "task.json").read_text())
    assert task["metric"] == PERPLEXITY and task["texts"]["test"] == 40


def test_prepare_refuses_bad_data_in_one_line_and_writes_nothing(tmp_path):
    params = tiny_lm_params()
    params["data"]["source"] = "missing.txt"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    result = run_stage("prepare", tmp_path)
    assert result.returncode != 0 and result.stderr.strip().count("\n") == 0
    assert "data.source: no file or folder missing.txt" in result.stderr
    assert not (tmp_path / "artifacts").exists()


@pytest.mark.slow  # the prepare and finetune stages in subprocesses
def test_finetune_trains_from_scratch_and_saves_a_model_the_later_stages_load(prepared, monkeypatch):
    from pipeline.run.experiment import Experiment

    result = run_stage("finetune", prepared)
    assert result.returncode == 0, result.stderr
    metrics = yaml.safe_load((prepared / "reports/tiny-lm/finetune.json").read_text())
    about = yaml.safe_load((prepared / "reports/tiny-lm/about.json").read_text())
    assert about["metric"] == PERPLEXITY and metrics["train_steps"] == 20 and len(about["tokens"]) == 3
    # Random words: the unigram distribution is near the best any model can do here, so it is no bar to clear;
    # a uniform guess over the vocabulary is.
    assert metrics["test"] < about["test_unigram"] * 2 < 2 * 120
    exp = Experiment(parse_params(yaml.safe_load((prepared / "params.yaml").read_text())))
    monkeypatch.chdir(prepared)
    model = exp.load(exp.finetuned_dir)
    assert exp.task.evaluation("test")(model)[0] == pytest.approx(metrics["test"], rel=1e-5)


@pytest.mark.slow  # the prepare and finetune stages in subprocesses
def test_a_pretrained_model_is_only_evaluated(tmp_path, tokenizer, model, monkeypatch):
    from pipeline.run.experiment import Experiment

    model.save_pretrained(tmp_path / "pretrained")
    tokenizer.save_pretrained(tmp_path / "pretrained")
    params = tiny_lm_params()
    params["model"] = {"name_or_path": str(tmp_path / "pretrained"), "attn_implementation": "sdpa",
                       "trust_remote_code": False}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (tmp_path / "corpus.txt").write_text("\n".join(corpus(200)) + "\n")
    for stage in ("prepare", "finetune"):
        result = run_stage(stage, tmp_path)
        assert result.returncode == 0, result.stderr
    metrics = yaml.safe_load((tmp_path / "reports/tiny-lm/finetune.json").read_text())
    about = yaml.safe_load((tmp_path / "reports/tiny-lm/about.json").read_text())
    assert metrics["train_steps"] == 0 and about["model"] == str(tmp_path / "pretrained")
    monkeypatch.chdir(tmp_path)
    exp = Experiment(parse_params(params))
    assert exp.task.evaluation("test")(model)[0] == pytest.approx(metrics["test"], rel=1e-5)
