"""The optimiser and the optimisation step that the families' fine-tuning and training share (optim.py)."""
