"""The pipeline's stages: one script per DVC stage (`python -m stages.<name>`), thin over the library in pipeline/."""
