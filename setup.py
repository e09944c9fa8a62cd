"""Package discovery for the folders that install under other import names (see pyproject.toml)."""

# It stays: pyproject's packages.find names packages by folder (adapters.flux2, not vgrpo_adapters.flux2).

from setuptools import find_packages, setup


def mapped(folder: str, import_name: str) -> list[str]:
    """List `folder`'s packages under `import_name`, the name they install as."""
    return [import_name] + [f"{import_name}.{sub}" for sub in find_packages(folder)]


setup(
    packages=find_packages(include=["vgrpo_platform", "vgrpo_platform.*"])
    + mapped("adapters", "vgrpo_adapters")
    + mapped("rewards", "vgrpo_rewards"),
)
