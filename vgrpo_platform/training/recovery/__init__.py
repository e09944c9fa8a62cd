"""What lets a run stop and go on: the run's state, its checkpoints, faults and interrupts.

``run_state`` (everything a resume restores, RNG streams included), ``checkpoint`` (the files on disk),
``faults`` (what counts as a fault, agreed across ranks), ``fault_policy`` (``train.on_fault``: stop with
a checkpoint or skip), ``interrupts`` (Ctrl-C / SIGTERM finish the iteration, then save).
"""
