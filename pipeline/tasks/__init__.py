"""One package per task family (classification, translation, language_modeling), each registered by name in
pipeline/config/tasks.py."""
