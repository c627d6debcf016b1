"""A tensorflow-datasets builder for prepared data sets, with no TensorFlow at all.

``hyset data prepare SPEC --out DIR`` writes one TFDS builder, ``hyset_data``,
with two configs under ``DIR``::

  DIR/hyset_data/queries/1.0.0/   one split per data-set split; records
                                  {id, text, gold (tool ids), source}
  DIR/hyset_data/tools/1.0.0/     split ``tools``; records {id, text, metadata (JSON)}

Read it with ``tfds.data_source("hyset_data/queries", data_dir=DIR)["train"]``
(records are dicts of bytes / lists of bytes) or, as a :class:`Dataset`, with
:func:`load_prepared` (the ``tfds:DIR`` data spec).

What tfds 4.9 needs to work without TensorFlow (checked on 4.9.10):

- ``file_format="array_record"``: writing goes through ``array_record`` and
  the example serializer; the tfrecord path imports TensorFlow.
- Reading with ``tfds.data_source`` / ``builder.as_data_source()`` (random
  access over array_record); ``as_dataset`` builds a ``tf.data`` pipeline and
  needs TensorFlow.
- ``_info`` builds ``tfds.core.DatasetInfo`` directly:
  ``dataset_info_from_configs`` looks for metadata files (README, citations)
  next to the builder's source file, which a library module does not have.
- ``code_path`` is overridden: for a builder defined in a package, tfds 4.9.10
  looks its source file up through ``importlib_resources``, a module it does
  not declare as a dependency (ModuleNotFoundError); the answer is this file.
- ``disable_shuffling=True`` so records keep their order: the tools split's row
  order is the tool index every model uses, and query order stays as read.
- ``tfds.data_source`` finds the data through its ``dataset_info.json`` even in
  a process that never imported this module (a read-only builder from files).
- tfds refuses to finalize a split with no examples ("No examples were
  yielded"), so a split without queries is not written; the metadata lists
  every split and :func:`load_prepared` restores the empty ones.
- An empty ``gold`` (a no-tool query: BFCL's ``irrelevant_*`` splits) is an
  empty sequence feature and reads back as ``()``: no special case.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any, Iterator

import tensorflow_datasets as tfds
from etils import epath

from hyset_jax.data.types import Dataset, Query, ToolLibrary
from hyset_jax.errors import UserError

BUILDER_NAME = "hyset_data"
QUERIES = "queries"
TOOLS = "tools"
FORMAT = "hyset-data/1"  # bump with any change of features or metadata keys


class HysetData(tfds.core.GeneratorBasedBuilder):
  """Queries (per split) and the tool library of one data set, as array_record."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Queries per split and the tool library."}
  BUILDER_CONFIGS = [
      tfds.core.BuilderConfig(name=QUERIES, description="Queries with gold tool sets."),
      tfds.core.BuilderConfig(name=TOOLS, description="The tool library, in index order."),
  ]

  def __init__(self, *, dataset: Dataset | None = None, spec: str = "", **kwargs: Any):
    # The Dataset is only needed to write; reading builds the class without it.
    self._dataset = dataset
    self._spec = spec
    super().__init__(**kwargs)

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    # tfds resolves a packaged builder's source through importlib_resources,
    # which it does not install; this file is the answer it would compute.
    return epath.Path(__file__)

  def _info(self) -> tfds.core.DatasetInfo:
    text = tfds.features.Text()
    if self.builder_config.name == QUERIES:
      features = {"id": text, "text": text, "source": text,
                  "gold": tfds.features.Sequence(tfds.features.Text())}
    else:
      features = {"id": text, "text": text, "metadata": tfds.features.Text()}
    metadata = tfds.core.MetadataDict()
    if self._dataset is not None:
      metadata.update(_metadata(self._dataset, self._spec))
    return tfds.core.DatasetInfo(
        builder=self, description="A tool-retrieval data set prepared by hyset-jax.",
        features=tfds.features.FeaturesDict(features), metadata=metadata,
        disable_shuffling=True)

  def _split_generators(self, dl_manager: Any) -> dict[str, Iterator[tuple[int, dict]]]:
    del dl_manager  # nothing to download: the Dataset is already in memory
    if self._dataset is None:
      raise UserError("the hyset_data builder can only prepare a data set it was given")
    if self.builder_config.name == TOOLS:
      return {TOOLS: self._generate_examples(_tool_records(self._dataset.tools))}
    return {split: self._generate_examples(_query_records(queries))
            for split, queries in self._dataset.splits.items() if queries}

  def _generate_examples(self, records: Iterator[dict[str, Any]]
                         ) -> Iterator[tuple[int, dict[str, Any]]]:
    yield from enumerate(records)


def _metadata(dataset: Dataset, spec: str) -> dict[str, Any]:
  return {"format": FORMAT, "name": dataset.name, "spec": spec,
          "notes": list(dataset.notes), "splits": list(dataset.splits),
          "empty_splits": [s for s, q in dataset.splits.items() if not q]}


def _query_records(queries: tuple[Query, ...]) -> Iterator[dict[str, Any]]:
  for q in queries:
    yield {"id": q.id, "text": q.text, "source": q.source, "gold": list(q.gold)}


def _tool_records(tools: ToolLibrary) -> Iterator[dict[str, Any]]:
  for tool_id, text, meta in zip(tools.ids, tools.texts, tools.metadata):
    yield {"id": tool_id, "text": text,
           "metadata": json.dumps(meta, sort_keys=True, ensure_ascii=False)}


def check_output(out_dir: str, force: bool, inputs=()) -> None:
  """Refuse ``out_dir`` before any work: a file, a non-empty folder without ``force``, one of
  ``inputs``, or a ``hyset_data`` in it that is not earlier prepared data."""
  from hyset_jax import io_utils
  io_utils.output_dir(out_dir, force, inputs=inputs)
  if os.path.isdir(out_dir):
    io_utils.output_dir(os.path.join(out_dir, BUILDER_NAME), force, marker=(TOOLS, QUERIES),
                        what="folder of prepared data")


def prepare(dataset: Dataset, out_dir: str, *, spec: str = "", force: bool = False) -> str:
  """Writes ``dataset`` as TFDS array_record under ``out_dir``; returns the builder dir.

  A non-empty ``out_dir`` is refused unless ``force``; with ``force`` only the
  ``hyset_data`` folder this function writes is replaced, nothing else in
  ``out_dir`` is touched.
  """
  from hyset_jax import io_utils
  out_dir = os.path.abspath(os.path.expanduser(out_dir))
  check_output(out_dir, force)
  builder_dir = os.path.join(out_dir, BUILDER_NAME)
  # Write into a staging folder and move it in at the end, so a failed or
  # killed run leaves the previous data intact and never a half-written
  # hyset_data/ that looks complete. tfds stores no absolute paths.
  try:
    os.makedirs(out_dir, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{BUILDER_NAME}-staging-", dir=out_dir)
  except OSError as e:
    raise UserError(f"cannot write {out_dir}: {e.strerror or e}") from None
  try:
    for config in (TOOLS, QUERIES):
      builder = HysetData(dataset=dataset, spec=spec, config=config, data_dir=staging,
                          file_format="array_record")
      # Nothing is downloaded, but tfds insists on a download folder.
      builder.download_and_prepare(download_dir=os.path.join(staging, "downloads"))
    io_utils.apply_umask(staging)
    io_utils.replace_dir(os.path.join(staging, BUILDER_NAME), builder_dir)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return builder_dir


def load_prepared(data_dir: str | None) -> Dataset:
  """Reads what :func:`prepare` wrote back into a :class:`Dataset`."""
  data_dir = os.path.abspath(os.path.expanduser(data_dir or ""))
  for config in (QUERIES, TOOLS):
    if not os.path.isdir(os.path.join(data_dir, BUILDER_NAME, config)):
      raise UserError(f"{data_dir}: no prepared data ({BUILDER_NAME}/{config} missing); "
                      f"expected a folder written by `hyset data prepare SPEC --out DIR`")
  tools_source = tfds.data_source(f"{BUILDER_NAME}/{TOOLS}", data_dir=data_dir)[TOOLS]
  ids, texts, metadata = [], [], []
  for record in _records(tools_source):
    ids.append(record["id"].decode("utf-8"))
    texts.append(record["text"].decode("utf-8"))
    metadata.append(json.loads(record["metadata"].decode("utf-8")))
  builder = tfds.builder(f"{BUILDER_NAME}/{QUERIES}", data_dir=data_dir)
  meta = dict(builder.info.metadata or {})
  sources = builder.as_data_source()
  splits: dict[str, tuple[Query, ...]] = {}
  for split in meta.get("splits") or sorted(sources):
    if split not in sources:
      splits[split] = ()  # empty splits are not written (see the module docstring)
      continue
    splits[split] = tuple(
        Query(id=r["id"].decode("utf-8"), text=r["text"].decode("utf-8"),
              gold=tuple(g.decode("utf-8") for g in r["gold"]),
              source=r["source"].decode("utf-8"))
        for r in _records(sources[split]))
  return Dataset(name=meta.get("name") or os.path.basename(data_dir),
                 tools=ToolLibrary(tuple(ids), tuple(texts), tuple(metadata)),
                 splits=splits, notes=tuple(meta.get("notes") or ()))


def _records(source: Any) -> Iterator[dict[str, Any]]:
  # Batched reads: one __getitems__ call per chunk instead of one per record.
  n = len(source)
  for start in range(0, n, 4096):
    yield from source.__getitems__(range(start, min(n, start + 4096)))
