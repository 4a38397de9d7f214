"""Sequence classification: the paper's BERT on GLUE, and offline MiniLM on Rotten Tomatoes, TREC or disaster tweets.

A model folder is a Hugging Face `*ForSequenceClassification`; batches are tokenised, padded text with labels; the
sweeps' evaluation is accuracy, Matthews correlation or F1 on a split (`ClassificationEval`). The stages' own parts:
`prepare` (data), `finetune`, `recover`, `benchmark` (Table 4's throughput).

The package: `task` (the `Task` every stage of its pipeline uses), `params` and `inputs` (light: read by the
checks before torch loads), and a module per stage for what only that stage does.
"""
