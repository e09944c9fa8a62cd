"""Many processes as one: which rows a rank owns and how ranks agree (``data_parallel``), and full
tensors out of sharded FSDP2 / DeepSpeed state and back (``sharded_state``).
"""
