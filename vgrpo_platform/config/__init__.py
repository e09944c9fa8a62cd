"""Recipes: the TOML schema (``schema``), reading and resolving a recipe (``recipe``), and one-line
messages for what fails validation (``validation_errors``).
"""
