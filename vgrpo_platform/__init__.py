"""vgrpo's modality-agnostic core, in layers (docs/concepts.md, "Where each piece lives"):

- ``cli/``: the ``vgrpo`` commands;
- ``training/``: one run, the loop (``training/loop.py``) and what it needs around it;
- ``algo/``: the method without a loop: advantages, surrogates, their draws and diagnostics;
- ``config/``: recipes, their schema and validation;
- ``host/``: the plugin host (entry points, the component registry);
- ``parallel/``: data parallelism and sharded state.

The modules at this level are the plugin-author surface: their import paths stay put.
"""
