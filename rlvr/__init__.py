"""rlvr: the trainer (engines, rollout, algorithms, recipes, command line)."""

__version__ = "0.1.0"
