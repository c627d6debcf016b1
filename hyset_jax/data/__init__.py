"""Data sets: readers for the data specs, one in-memory representation, TFDS builders.

One job per module:

- :mod:`hyset_jax.data.types`         Dataset / ToolLibrary / Query, what every reader returns.
- :mod:`hyset_jax.data.specs`         ``load_dataset(spec)``: parse a data spec, dispatch, check.
- :mod:`hyset_jax.data.beir`          ``beir:PATH`` (ToolLens).
- :mod:`hyset_jax.data.toolbench`     ``toolbench:PATH`` (ToolBench instruction JSON or a release root).
- :mod:`hyset_jax.data.bfcl`          ``bfcl[:PATH]`` (the data shipped in bfcl-eval).
- :mod:`hyset_jax.data.toolret`       ``toolret:PATH`` (ToolRet's queries and tools, JSON lines).
- :mod:`hyset_jax.data.schemas`       ``mcp:FILE.json``, ``openai:FILE.json`` (tool libraries).
- :mod:`hyset_jax.data.tooltext`      one tool-text rendering for every function-schema format.
- :mod:`hyset_jax.data.splits`        deterministic id-hash splits, ``with_validation``.
- :mod:`hyset_jax.data.files`         strict JSON / JSONL / TSV / UTF-8 reading with file:line errors.
- :mod:`hyset_jax.data.library`       deduplicating tool definitions into one library.
- :mod:`hyset_jax.data.stats`         the numbers ``hyset data stats`` prints.
- :mod:`hyset_jax.data.tfds_builder`  TFDS array_record builder (no TensorFlow), ``tfds:DIR``.
"""
from hyset_jax.data.specs import load_dataset, parse_spec
from hyset_jax.data.types import Dataset, Query, ToolLibrary

__all__ = ["Dataset", "Query", "ToolLibrary", "load_dataset", "parse_spec"]
