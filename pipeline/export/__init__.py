"""Pruned models out of the project in other formats: `python -m pipeline.export gguf <saved folder> <file.gguf>`
(gguf.py: llama.cpp's format). No stage depends on it, so editing an export reruns no stage."""
