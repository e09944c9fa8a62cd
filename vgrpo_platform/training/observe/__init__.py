"""What a run shows of itself: evaluations, metrics, trackers, sample grids, the monitor, the summary.

Nothing here changes the policy: ``evaluation`` (held-out prompts, fixed seeds; shared with ``vgrpo eval``),
``metrics`` (``metrics.jsonl`` and the progress bar), ``tracking`` (TensorBoard / W&B / MLflow),
``grids`` (sample images), ``monitor`` (``[eval.monitor]``: stop when the reward rises while a guard
falls), ``summary`` (the before/after table printed at the end).
"""
