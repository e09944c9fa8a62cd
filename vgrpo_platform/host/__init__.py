"""The plugin host: ``manager`` loads plugins through their entry points, ``collect`` calls their
``register_components`` hooks into the registry, ``components`` looks components up and builds them.
What a plugin declares is in ``vgrpo_platform.registry``.
"""
