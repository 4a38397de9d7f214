"""Studies that choose a default: commands run by hand on an experiment's prepared data, whose tables and figures
the README quotes. Not a stage dependency, so editing a study reruns no stage."""
