"""The math of the recipes, as pure functions over tensors (no models, no I/O)."""
