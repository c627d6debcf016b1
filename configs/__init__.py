"""Training presets (installed as hyset_jax.configs): `hyset train --config NAME`."""
