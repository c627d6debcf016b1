"""benchmarks/cross_domain.py: the target training data a model of M can be trained on."""
from __future__ import annotations

from benchmarks import cross_domain
from hyset_jax.data.specs import load_dataset
from hyset_jax.data.splits import with_validation


def test_target_data_fits_the_source_model(tmp_path):
  spec = cross_domain._fitting("seal_tools", 2, tmp_path, limit=40)
  data = load_dataset(spec)
  assert set(data.splits) == {"train", "validation"}  # the test is scored on the data set
  full = with_validation(load_dataset(cross_domain.DATASETS["seal_tools"][0]))
  assert max(len(q.gold) for q in full.split("train")) > 2
  fitting = [q for q in full.split("train") if len(q.gold) <= 2]
  assert [q.id for q in data.split("train")] == [q.id for q in fitting[:40]]
  assert all(len(q.gold) <= 2 for q in data.split("validation"))
  assert {q.id for q in data.split("validation")} == {
      q.id for q in full.split("validation") if len(q.gold) <= 2}
  assert cross_domain._fitting("seal_tools", 2, tmp_path, limit=40) == spec  # reused
