"""Recipes: the TOML schema (``schema``) and reading and resolving a recipe (``recipe``).

A recipe's validation messages are formatted by ``host.validation_errors``, which the plugin host
shares for plugin options.
"""
