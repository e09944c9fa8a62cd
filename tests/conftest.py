"""Suite-wide settings: offline hubs, and one CPU thread (tiny models run faster without thread hand-offs,
and subprocesses inherit the setting). Also the adapter tests' ``model_dir`` and ``adapter`` fixtures, built
from what each test module declares (``TINY_PIPELINE``, ``ADAPTER``, ``config``)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

try:
    import torch
except ImportError:  # pragma: no cover - torch is a hard dependency; keep collection errors readable
    torch = None
if torch is not None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(request, tmp_path_factory):
    """The test module's tiny pipeline folder, built once per module by its ``TINY_PIPELINE(folder)``."""
    return request.module.TINY_PIPELINE(tmp_path_factory.mktemp("tiny") / "pipe")


@pytest.fixture(scope="module")
def adapter(request, model_dir):
    """The test module's ``ADAPTER`` built from its ``config(model_dir)``, shared by the module's tests."""
    from adapter_checks import adapter_from_config

    return adapter_from_config(request.module.ADAPTER, request.module.config(model_dir))
