"""What lets a run stop and go on: the run's state, its checkpoints, faults and interrupts.

``run_state`` (everything a resume restores, RNG streams included), ``checkpoint`` (the files on disk),
``checkpoint_contents`` (what they must hold), ``run_lock`` (one live run per run directory),
``disk_space`` (a failed write as one line), ``faults`` (what counts as a fault, agreed across ranks),
``fault_policy`` (``train.on_fault``: stop with a checkpoint or skip), ``interrupts`` (Ctrl-C / SIGTERM
finish the iteration, then save).
"""
