"""``python -m vgrpo_platform.cli`` (what ``accelerate launch -m vgrpo_platform.cli`` runs) is ``vgrpo``."""

from vgrpo_platform.cli.app import main

main()
