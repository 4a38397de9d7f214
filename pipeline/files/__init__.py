"""Files a stage writes: atomic writes, the artefact layout and the shared names of columns, methods and kinds
(schema.py)."""
