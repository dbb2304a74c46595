"""Experiment grids: a config dataclass with quick()/full() and a run function returning a DataFrame, plus a CLI."""
