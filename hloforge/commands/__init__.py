"""The commands that open a run's checkpoint: eval, detect, sample, generate, cam. Above the loop."""
