"""What every family shares: head gates and their importance, surgery that removes heads and neurons, checkpoints,
the runtime (device, precision), placement over devices, layer-by-layer scoring and the benchmark timer."""
