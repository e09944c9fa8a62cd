"""The plugin host: load plugins through their entry points, collect their components into the
registry and build them (``plugins``). What a plugin registers is declared in ``registry``.
"""
