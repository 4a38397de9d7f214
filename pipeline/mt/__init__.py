"""Translation models trained from scratch: a small Marian transformer (marian), its training loop
(training), decoding (decoding) and BLEU (bleu).

Michel et al. (2019) prune a WMT14 transformer; offline we cannot download one, so the MT experiments
train their own (Vaswani et al. 2017 recipe, scaled down).
"""
