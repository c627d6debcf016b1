"""Only what pyproject.toml cannot say: the presets in the top-level configs/ install as the
package hyset_jax.configs (so `pip install .`, not only an editable install, has them), beside
every package found under hyset_jax/ and toolscout/. setuptools cannot combine packages.find with
a renamed folder in pyproject.toml alone."""
from setuptools import find_packages, setup

setup(packages=find_packages(include=["hyset_jax", "hyset_jax.*", "toolscout", "toolscout.*"])
      + ["hyset_jax.configs"],
      package_dir={"hyset_jax.configs": "configs"})
