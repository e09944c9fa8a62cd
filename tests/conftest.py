"""Suite-wide settings: offline hubs, and one CPU thread (tiny models run faster without thread hand-offs,
and subprocesses inherit the setting)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

try:
    import torch
except ImportError:  # pragma: no cover - torch is a hard dependency; keep collection errors readable
    torch = None
if torch is not None:
    torch.set_num_threads(1)
