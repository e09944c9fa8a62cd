"""The algorithm, apart from any loop: GRPO advantages, the surrogates and what they draw.

Pure functions and surrogate classes over tensors and the ``protocols`` contracts; nothing here
runs a loop, writes a file or talks to another process.
"""
