"""Model files: validation, specs and the model store."""
