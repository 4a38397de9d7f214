"""Causal language modelling: SmolLM2-135M (the offline default, from a pinned GGUF), any Hugging Face causal LM, or
a Llama-architecture model with grouped-query attention trained from scratch (llama, training).

Batches are token windows whose loss is the next-token NLL; the sweeps' evaluation is perplexity (perplexity), lower
is better. Grouped-query attention adds Tables 2/3 with one key/value group per layer kept, and the curves in the
other unit (`prune.compare_units`). The stages' own parts: `prepare`, `finetune`, `recover` (LoRA or full fine-tuning
of every saved model, lora), `benchmark` (prefill and cached decoding), `zero_shot` (lm-eval) and `report`.

The package: `task` (the `Task` every stage of its pipeline uses), `params` and `inputs` (light: read by the
checks before torch loads), and a module per stage for what only that stage does.
"""
