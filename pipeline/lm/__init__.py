"""Causal language modelling: a Llama-architecture model with grouped-query attention (llama), its training
from scratch (training) and perplexity, the metric the ablation and pruning sweeps call (perplexity)."""
