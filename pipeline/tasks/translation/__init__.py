"""Machine translation: a Marian transformer trained from scratch (the offline default), a pretrained Hugging Face
Marian/BART, or a fairseq checkpoint (`model.backend: fairseq`, the paper's own WMT14 model format).

Michel et al. (2019) prune a WMT14 transformer; offline we cannot download one, so the default trains its own
(Vaswani et al. 2017 recipe, scaled down). Batches are source/target pairs whose loss is the token-level NLL; the
sweeps' evaluation is the corpus BLEU of decoded translations (`TranslationEval`, or fairseq's), on test only.
Beyond the paper's curves, the prune stage draws each attention kind pruned alone (Figure 5) and every saved training
checkpoint pruned by its own importance (Figure 6). A fairseq model folder holds `checkpoint.pt` and its
dictionaries; the data folder holds the same columns, with fairseq's token ids.

The package: `task` (the `Task` every stage of its pipeline uses), `params` and `inputs` (light: read by the
checks before torch loads), and a module per stage for what only that stage does.
"""
