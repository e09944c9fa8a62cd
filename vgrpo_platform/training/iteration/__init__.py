"""One training iteration's steps, in the order the loop takes them.

``prompts`` (draw the iteration's prompts), ``rollout`` and ``rollout_source`` (prompts and noise to
samples, from the run's rollout backend), ``scoring`` with ``reward_workers`` and ``offload`` (samples to
rewards), ``update`` with ``optimizer`` and ``ema`` (the surrogate's loss to optimiser steps), and
``clock`` (each stage's seconds, kept out of the steps themselves).
"""
