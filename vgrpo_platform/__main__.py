"""``python -m vgrpo_platform`` is the ``vgrpo`` command."""

from vgrpo_platform.cli.app import main

if __name__ == "__main__":
    main()
