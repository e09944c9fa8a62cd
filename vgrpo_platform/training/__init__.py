"""The training run: the loop (``loop.Trainer``) and everything one run needs around it.

Building a session from a recipe, rollouts, scoring, checkpoints and the run state they restore,
faults, evaluations, metrics and trackers.
"""
