"""benchmarks/distractors.py: the padded libraries (real distractors, then generated ones)."""
from __future__ import annotations

import pathlib

from benchmarks import distractors
from hyset_jax.data.specs import load_dataset

DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"


def test_distractors_are_new_tools_in_a_seeded_order():
  base = load_dataset(f"beir:{DATA / 'toollens'}").tools
  sources = [f"toolbench:{DATA / 'stabletoolbench' / 'test_instruction'}",
             f"ultratool:{DATA / 'ultratool'}"]
  real = distractors.real_distractors(base, sources, seed=0)
  assert real == distractors.real_distractors(base, sources, seed=0)
  assert real != distractors.real_distractors(base, sources, seed=1)
  assert len(real) == len(set(real))
  # StableToolBench lists ToolBench APIs, some of them ToolLens's own: those are left out.
  own = {distractors._api(t) for t in base.texts}
  stb = load_dataset(sources[0]).tools.texts
  assert any(distractors._api(t) in own for t in stb)
  assert not any(distractors._api(t) in own for t in real if distractors._api(t))
  assert not set(real) & set(base.texts)
  made = distractors.generated(real, 500, 0, set(real) | set(base.texts))
  assert len(set(made)) == 500 and not set(made) & (set(real) | set(base.texts))
  library = distractors.padded(base, real + made, 1000)
  assert len(library) == 1000 and library.ids[:len(base)] == base.ids
  assert len(set(library.ids)) == 1000
  bigger = distractors.padded(base, real + made, 1200)
  assert bigger.texts[:1000] == library.texts  # each size extends the previous one
