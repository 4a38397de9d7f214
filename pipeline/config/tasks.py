"""The task registry: the params' `task` names a family, and each family is one package under `pipeline/tasks/`.

Pure data, so that the params checks and the DVC deps generator read it before anything heavy loads. A family
package is imported by name (`importlib`), never by a static import from a shared module: no shared module, and so
no stage of another family, depends on a family's code. Adding a family is one package and one entry here.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from pipeline.files.schema import CLASSIFICATION, LANGUAGE_MODELING, TRANSLATION

# The modules of a family that any stage of its pipeline may import (`params` and `inputs` before torch loads, `task`
# after); a stage also imports the family's module named after it, where there is one (pipeline/run/task.py).
ENTRY_MODULES = ("params", "inputs", "task")

TASK_PACKAGES: dict[str, str] = {
    CLASSIFICATION: "pipeline.tasks.classification",
    TRANSLATION: "pipeline.tasks.translation",
    LANGUAGE_MODELING: "pipeline.tasks.language_modeling",
}


def family_module(task: str, name: str) -> ModuleType | None:
    """The module `name` of the family of `task` (e.g. its `params`, or its module for one stage), or None where
    the family has none."""
    module = f"{TASK_PACKAGES[task]}.{name}"
    return importlib.import_module(module) if importlib.util.find_spec(module) is not None else None
