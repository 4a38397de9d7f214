"""Machine translation pieces: Tatoeba parsing, group splits, local/hub loading, subword vocabulary,
a tiny Marian trained from scratch, decoding, BLEU and its paired bootstrap test."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pytest
from transformers import AutoTokenizer

from pipeline.data.readers import load_tatoeba_pairs
from pipeline.data.subword import train_tokenizer
from pipeline.tasks.translation import data as translation_data
from pipeline.tasks.translation.bleu import bleu, bleu_paired_pvalue
from pipeline.tasks.translation.data import load_translation_task, split_by_source, tokenize_pairs
from pipeline.tasks.translation.decoding import translate
from pipeline.tasks.translation.marian import marian_config, new_marian
from pipeline.tasks.translation.training import TranslationTrainConfig, token_budget_batches, train_translation

ROOT = Path(__file__).resolve().parents[1]

ATTRIBUTION = "CC-BY 2.0 (France) Attribution: tatoeba.org #{} (CM) & #{} (x)"

# Lines in spa.tsv's own format, quirks included: one source with several translations, bare quotes,
# "NA" (which pandas would read as missing), non-ASCII punctuation.
TATOEBA_LINES = [
    ("Go.", "Ve."),
    ("Go.", "Vete."),
    ("Go.", "Vaya."),
    ("Hi.", "Hola."),
    ('He said "no".', 'Dijo "no".'),
    ("NA", "NA"),
    ("Where is it?", "¿Dónde está?"),
]


def write_tatoeba(path, lines):
    text = "".join(f"{en}\t{es}\t{ATTRIBUTION.format(i, i + 1000)}\n" for i, (en, es) in enumerate(lines))
    path.write_text(text, encoding="utf-8")
    return path


def synthetic_pairs(n: int, seed: int = 0) -> pd.DataFrame:
    """Sources drawn with repeats, each with one to three translations, and shared targets."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        src = f"s{rng.randrange(n // 2)}"
        rows.append((src, f"t{i % (n // 3)}" if i % 7 == 0 else f"t{src}-{rng.randrange(3)}"))
    return pd.DataFrame(rows, columns=["source", "target"]).drop_duplicates().reset_index(drop=True)


# --- Tatoeba -----------------------------------------------------------------------------------------


def test_tatoeba_parsing_keeps_text_verbatim_and_attribution(tmp_path):
    df = load_tatoeba_pairs(write_tatoeba(tmp_path / "spa.tsv", TATOEBA_LINES))
    assert list(df.columns) == ["source", "target", "attribution"]
    assert list(zip(df.source, df.target, strict=True)) == TATOEBA_LINES
    assert df.attribution.str.startswith("CC-BY 2.0 (France)").all()


@pytest.mark.parametrize(
    "text, message",
    [("Go.\tVe.\n", "fewer than 3 tab-separated fields"), ("Go.\tVe.\tx\ty\n", "3 tab-separated fields")],
)
def test_tatoeba_rejects_malformed_lines(tmp_path, text, message):
    path = tmp_path / "spa.tsv"
    path.write_text(f"Hi.\tHola.\t{ATTRIBUTION}\n{text}", encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        load_tatoeba_pairs(path)


# --- splitting ---------------------------------------------------------------------------------------


def test_split_by_source_shares_no_sentence_with_train():
    df = synthetic_pairs(600)
    parts = split_by_source(df, (0.8, 0.1, 0.1), seed=0)
    assert sum(map(len, parts.values())) == len(df)
    train = parts["train"]
    for name in ("dev", "test"):
        assert not set(parts[name].source) & set(train.source)
        assert not set(parts[name].target) & set(train.target)
    # All translations of a source stay together.
    for src, rows in df.groupby("source"):
        homes = [name for name, part in parts.items() if (part.source == src).any()]
        assert len(homes) == 1 and (parts[homes[0]].source == src).sum() == len(rows)


def test_split_by_source_is_seeded_and_respects_fractions():
    df = synthetic_pairs(2000)
    a, b = split_by_source(df, (0.7, 0.2, 0.1), seed=3), split_by_source(df, (0.7, 0.2, 0.1), seed=3)
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name])
    c = split_by_source(df, (0.7, 0.2, 0.1), seed=4)
    assert set(a["test"].source) != set(c["test"].source)
    largest_group = int(np.bincount(translation_data._pair_groups(df)).max())
    for name, frac in zip(("train", "dev", "test"), (0.7, 0.2, 0.1), strict=True):
        assert abs(len(a[name]) - frac * len(df)) <= largest_group


def test_split_by_source_caps_evaluation_splits_without_changing_train():
    df = synthetic_pairs(1000)
    full, capped = split_by_source(df, seed=1), split_by_source(df, seed=1, max_eval_pairs=20)
    pd.testing.assert_frame_equal(full["train"], capped["train"])
    for name in ("dev", "test"):
        assert 15 <= len(capped[name]) <= 20
        assert set(capped[name].source) <= set(full[name].source)


@pytest.mark.parametrize("fractions", [(0.8, 0.3, 0.1), (0.0, 0.5, 0.5), (0.9, -0.1, 0.2)])
def test_split_by_source_rejects_bad_fractions(fractions):
    with pytest.raises(ValueError, match="fractions"):
        split_by_source(synthetic_pairs(30), fractions)


# --- loading -----------------------------------------------------------------------------------------


def test_default_source_is_tatoeba_in_either_direction(tmp_path):
    path = write_tatoeba(tmp_path / "spa.tsv", TATOEBA_LINES * 1)
    en_es = load_translation_task("default", tatoeba_path=path, fractions=(0.6, 0.2, 0.2))
    assert set(en_es) == {"train", "dev", "test"}
    rows = {(r["source"], r["target"]) for split in en_es.values() for r in split}
    assert rows == set(TATOEBA_LINES)
    assert en_es["train"].column_names == ["source", "target"]
    es_en = load_translation_task("default", "es", "en", tatoeba_path=path, fractions=(0.6, 0.2, 0.2))
    assert {(r["target"], r["source"]) for split in es_en.values() for r in split} == rows
    with pytest.raises(ValueError, match="en->es or es->en"):
        load_translation_task("default", "en", "fr", tatoeba_path=path)
    with pytest.raises(ValueError, match="tatoeba_path"):
        load_translation_task("default")


def test_local_directory_with_named_columns(tmp_path):
    for split, n in (("train", 6), ("validation", 2), ("test", 3)):
        pd.DataFrame({"de": [f"{split} {i}" for i in range(n)], "en": [f"E {i}" for i in range(n)]}).to_csv(
            tmp_path / f"{split}.tsv", sep="\t", index=False
        )
    dsd = load_translation_task(str(tmp_path), source_column="de", target_column="en")
    assert {k: len(v) for k, v in dsd.items()} == {"train": 6, "dev": 2, "test": 3}
    assert dsd["dev"][0] == {"source": "validation 0", "target": "E 0"}


def test_local_file_with_translation_dicts_is_split_by_group(tmp_path):
    path = tmp_path / "pairs.jsonl"
    df = synthetic_pairs(200)
    lines = [json.dumps({"translation": {"fr": s, "en": t}}) for s, t in zip(df.source, df.target, strict=True)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    dsd = load_translation_task(str(path), "fr", "en", max_eval_pairs=10, seed=2)
    assert len(dsd["dev"]) <= 10 and len(dsd["test"]) <= 10
    assert not set(dsd["test"]["source"]) & set(dsd["train"]["source"])
    backwards = load_translation_task(str(path), "en", "fr", seed=2)
    assert set(backwards["train"]["target"]) | set(backwards["dev"]["target"]) | set(
        backwards["test"]["target"]
    ) == set(df.source)


def test_local_files_mapping_and_json_array(tmp_path):
    records = [{"source": f"s{i}", "target": f"t{i}"} for i in range(20)]
    (tmp_path / "a.json").write_text(json.dumps(records), encoding="utf-8")
    (tmp_path / "b.csv").write_text("source,target\nNA,\"x, y\"\n", encoding="utf-8")
    dsd = load_translation_task("local", files={"train": tmp_path / "a.json", "test": tmp_path / "b.csv"})
    assert dsd["test"][0] == {"source": "NA", "target": "x, y"}
    assert len(dsd["train"]) + len(dsd["dev"]) == 20 and len(dsd["dev"]) > 0


@pytest.mark.parametrize(
    "content, kwargs, message",
    [
        ("a,b\nx,y\n", {}, "expected columns 'source' and 'target' .*, or a 'translation' column"),
        ("source,target\nx,\n", {}, "1 row\\(s\\) with no sentence in column 'target' \\(line 2\\)"),
        ('{"translation": {"de": "x", "en": "y"}}\n', {}, "needs data.source_lang and data.target_lang"),
        ('{"translation": {"de": "x", "en": "y"}}\n', {"source_lang": "fr", "target_lang": "en"}, "lack a fr or en"),
    ],
)
def test_bad_local_files_give_clear_errors(tmp_path, content, kwargs, message):
    path = tmp_path / ("train.jsonl" if content.startswith("{") else "train.csv")
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        load_translation_task(str(path), **kwargs)


def test_unknown_sources_name_what_is_allowed(tmp_path):
    with pytest.raises(ValueError, match="expected default, wmt14/<pair>, iwslt2017/<pair>, a folder of parallel text"):
        load_translation_task("no/such/thing")
    with pytest.raises(ValueError, match="unknown wmt14 language pair 'en-xx'; allowed: cs-en"):
        load_translation_task("wmt14/en-xx")
    (tmp_path / "train.txt").write_text("x")
    with pytest.raises(ValueError, match="unsupported file type '.txt'"):
        load_translation_task("local", files={"train": tmp_path / "train.txt"})


def _hub_split(prefix: str, n: int) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"translation": [{"en": f"{prefix} en {i}", "fr": f"{prefix} fr {i}"}
                                                       for i in range(n)]})


def test_wmt14_maps_newstest2013_to_dev_and_newstest2014_to_test(monkeypatch):
    calls = []

    def fake_fetch(repo, config):
        calls.append((repo, config))
        return datasets.DatasetDict(
            {"train": _hub_split("tr", 50), "validation": _hub_split("nt13", 8), "test": _hub_split("nt14", 9)}
        )

    monkeypatch.setattr(translation_data, "fetch_hub_translation", fake_fetch)
    dsd = load_translation_task("wmt14/fr-en", "en", "fr", max_train_pairs=20, max_eval_pairs=5)
    assert calls == [("wmt/wmt14", "fr-en")]
    assert {k: len(v) for k, v in dsd.items()} == {"train": 20, "dev": 5, "test": 5}
    assert dsd["test"][0]["source"].startswith("nt14 en") and dsd["test"][0]["target"].startswith("nt14 fr")
    assert dsd["dev"][0]["source"].startswith("nt13 en")
    with pytest.raises(ValueError, match="allowed: fr->en or en->fr"):
        load_translation_task("wmt14/fr-en", "en", "de")


def test_hub_failures_say_what_to_do_offline(monkeypatch):
    def offline(repo, config):
        raise ConnectionError("hub unreachable")

    monkeypatch.setattr(translation_data, "fetch_hub_translation", offline)
    with pytest.raises(ValueError, match="IWSLT/iwslt2017 \\(config iwslt2017-de-en\\).*local"):
        load_translation_task("iwslt2017/de-en")


# --- subword vocabulary ------------------------------------------------------------------------------

SENTENCES = [
    "Tom can't swim.",
    "¿Dónde está la estación?",
    'He said "no" — twice.',
    "Él no sabe nadar.",
    "I'll be back at 5:30, OK?",
    "Naïve café owners.",
] * 5


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tokenizer")


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return train_tokenizer(SENTENCES, vocab_size=120, dest_dir=tokenizer_dir)


def test_tokenizer_round_trips_text_and_ends_with_eos(tokenizer):
    assert [tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id] == [0, 1, 2]
    for text in [*SENTENCES[:6], "Tom sabe nadar.", "a  b"]:
        ids = tokenizer(text)["input_ids"]
        assert ids[-1] == tokenizer.eos_token_id and tokenizer.pad_token_id not in ids
        assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_tokenizer_reloads_and_is_deterministic(tokenizer, tokenizer_dir, tmp_path):
    reloaded = AutoTokenizer.from_pretrained(tokenizer_dir)
    again = train_tokenizer(SENTENCES, vocab_size=120, dest_dir=tmp_path)
    for other in (reloaded, again):
        assert other.get_vocab() == tokenizer.get_vocab()
        assert other(SENTENCES[:6])["input_ids"] == tokenizer(SENTENCES[:6])["input_ids"]


def test_tokenize_pairs_makes_labels_and_keeps_eos_when_truncating(tokenizer):
    pairs = datasets.Dataset.from_dict({"source": SENTENCES[:2], "target": SENTENCES[2:4]})
    dsd = datasets.DatasetDict({"train": pairs})
    enc = tokenize_pairs(dsd, tokenizer, max_length=4)["train"]
    assert enc.column_names == ["source", "target", "input_ids", "attention_mask", "labels"]  # text kept for BLEU
    for row in enc:
        assert len(row["input_ids"]) == len(row["labels"]) == 4
        assert row["input_ids"][-1] == row["labels"][-1] == tokenizer.eos_token_id


# --- a tiny Marian -----------------------------------------------------------------------------------

WORDS = "ab cd ef gh ij kl mn op".split()


def reverse_task(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))) for _ in range(n)]
    return src, [" ".join(reversed(s.split())) for s in src]


TINY = TranslationTrainConfig(steps=60, max_tokens=256, learning_rate=3e-3, warmup_steps=10, label_smoothing=0.1)


def tiny_setup():
    src, tgt = reverse_task(200)
    tok = train_tokenizer(src + tgt, vocab_size=40)
    model = new_marian(marian_config(tok, d_model=32, layers=(2, 2), heads=4, ffn_dim=64, max_positions=64), seed=0)
    train = tokenize_pairs(datasets.DatasetDict({"train": datasets.Dataset.from_dict({"source": src, "target": tgt})}),
                           tok, max_length=32)["train"]
    return model, tok, train, src


@pytest.fixture(scope="module")
def trained():
    model, tok, train, src = tiny_setup()
    seen = []
    losses = train_translation(model, train, tok, TINY, checkpoint_steps=[0, 30, 60],
                               on_checkpoint=lambda step, m: seen.append((step, m.training)), progress=False)
    return model, tok, src, losses, seen


def test_marian_config_follows_marian_conventions(tokenizer):
    config = marian_config(tokenizer, d_model=32, layers=(2, 3), heads=4, ffn_dim=64, max_positions=64)
    assert (config.encoder_layers, config.decoder_layers, config.vocab_size) == (2, 3, len(tokenizer))
    assert config.decoder_start_token_id == config.pad_token_id == 0 and config.eos_token_id == 1
    model = new_marian(config)
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    assert model.model.encoder.embed_tokens.weight is model.model.decoder.embed_tokens.weight
    assert model.config._attn_implementation == "sdpa" and not model.training
    with pytest.raises(ValueError, match="divisible"):
        marian_config(tokenizer, d_model=30, heads=4)


def test_training_lowers_the_loss_and_calls_checkpoints(trained):
    _, _, _, losses, seen = trained
    assert len(losses) == TINY.steps
    assert np.mean(losses[-10:]) < 0.75 * np.mean(losses[:5])
    assert seen == [(0, False), (30, False), (60, False)]


def test_training_is_deterministic_for_a_seed():
    runs = []
    for _ in range(2):
        model, tok, train, _ = tiny_setup()
        cfg = TranslationTrainConfig(steps=5, max_tokens=256, warmup_steps=2)
        runs.append(train_translation(model, train, tok, cfg, progress=False))
    assert runs[0] == runs[1]


def test_token_budget_batches_cover_every_row_once_within_budget():
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 30, 500), rng.integers(1, 30, 500)
    batches = token_budget_batches(src, tgt, 200, np.random.default_rng(1))
    assert sorted(np.concatenate(batches).tolist()) == list(range(500))
    assert all(len(b) * max(src[b].max(), tgt[b].max()) <= 200 for b in batches)
    again = token_budget_batches(src, tgt, 200, np.random.default_rng(1))
    assert all((x == y).all() for x, y in zip(batches, again, strict=True))


def test_translate_returns_strings_in_input_order(trained):
    model, tok, src, _, _ = trained
    sources = [src[3], src[0] + " " + src[1], src[2][:2], src[5]]
    batched = translate(model, tok, sources, num_beams=2, batch_size=3, max_new_tokens=10)
    one_by_one = [translate(model, tok, [s], num_beams=2, batch_size=1, max_new_tokens=10)[0] for s in sources]
    assert batched == one_by_one
    assert all(isinstance(t, str) and "<pad>" not in t and "</s>" not in t for t in batched)
    assert translate(model, tok, [], num_beams=1) == []


# --- BLEU --------------------------------------------------------------------------------------------

REFS = [f"the {w} sat on the mat number {i} today" for i, w in enumerate(["cat", "dog", "bird", "fish"] * 15)]


def test_bleu_of_identical_text_is_100_with_a_signature():
    score, signature = bleu(REFS, REFS)
    assert score == pytest.approx(100.0)
    assert "nrefs:1" in signature and "tok:13a" in signature
    assert bleu(["completely unrelated words"] * len(REFS), REFS)[0] < 5
    with pytest.raises(ValueError, match="hypotheses has 1 sentences but there are 60 references"):
        bleu(REFS[:1], REFS)


def test_sacrebleu_is_loaded_only_when_bleu_is_scored():
    """Every stage imports the experiment, and with it this module; a classification stage skips sacrebleu's 0.6 s."""
    probe = ("import sys, pipeline.run.experiment, pipeline.tasks.translation.bleu as b; "
             "print('sacrebleu' in sys.modules); b.bleu(['a cat'], ['a cat']); print('sacrebleu' in sys.modules)")
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.split() == ["False", "True"]


def test_paired_bootstrap_pvalue():
    rng = random.Random(0)
    worse = [" ".join(w for w in r.split() if rng.random() < 0.6) for r in REFS]
    good = [r if i % 4 else r.replace("today", "yesterday") for i, r in enumerate(REFS)]
    assert bleu_paired_pvalue(worse, worse, REFS, n_resamples=200) == 1.0
    assert bleu_paired_pvalue(good, worse, REFS, n_resamples=200) < 0.01
    assert bleu_paired_pvalue(worse, good, REFS, n_resamples=200) < 0.01  # one-sided, toward the observed sign
    near = [r if i else r.replace("today", "now") for i, r in enumerate(REFS)]
    assert bleu_paired_pvalue(near, REFS, REFS, n_resamples=200, seed=1) > 0.2
    assert bleu_paired_pvalue(good, worse, REFS, 50, seed=5) == bleu_paired_pvalue(good, worse, REFS, 50, seed=5)
