"""Causal language modelling: a Llama-architecture model with grouped-query attention (llama), its training
from scratch and its recovery after pruning, full or LoRA (training, lora), and perplexity, the metric the
ablation and pruning sweeps call (perplexity)."""
