"""The library behind the stages: sub-packages in layers, each importing only those below it (README, "Layout")."""
