"""The ``vgrpo`` command line: ``app`` holds the commands, each a thin layer over the layers below.

Kept free of imports, so ``accelerate launch -m vgrpo_platform.cli`` and ``import vgrpo_platform.cli.app``
load only what they use.
"""
