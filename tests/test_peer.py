"""The HYSET authors' PyTorch checkpoints: export, import, the restricted reader, and (where a
peer environment with torch exists) the same answers as their scorer. No torch needed."""
from __future__ import annotations

import collections
import dataclasses
import io
import json
import os
import pathlib
import pickle
import sys
import zipfile

import numpy as np
import pytest

from hyset_jax.model import terms

from hyset_jax import cli
from hyset_jax.errors import UserError
from hyset_jax.io.modeldir import ModelDir, load_model_dir, save_model_dir
from hyset_jax.io.peer import convert, torch_format
from hyset_jax.model.scoring import HysetParams, QueryTower

REPO = pathlib.Path(__file__).resolve().parents[1]
N, D, M = 30, 8, 3


def small_model(n=N, d=D, max_size=M, seed=0, **terms) -> ModelDir:
  rng = np.random.default_rng(seed)
  z = rng.standard_normal((n, d)).astype(np.float32)
  z /= np.linalg.norm(z, axis=1, keepdims=True)
  ms = []
  for _ in range(max_size - 1):
    a = rng.standard_normal((d, d)).astype(np.float32)
    ms.append((0.5 * (a + a.T)).astype(np.float32))
  params = HysetParams(z, rng.standard_normal((d, d)).astype(np.float32), np.stack(ms), **terms)
  return ModelDir(params, tuple(f"tool_{i}" for i in range(n)), max_size, 3, 6, None,
                  ranking="greedy")


def write_library(root: pathlib.Path, ids) -> str:
  """A BEIR folder whose corpus is the tools ``ids``."""
  (root / "qrels").mkdir(parents=True)
  with open(root / "corpus.jsonl", "w") as f:
    for t in ids:
      f.write(json.dumps({"_id": t, "title": "", "text": f"the tool {t}"}) + "\n")
  (root / "queries.jsonl").write_text(json.dumps({"_id": "q", "text": "hello"}) + "\n")
  (root / "qrels" / "test.tsv").write_text(f"query-id\tcorpus-id\tscore\nq\t{ids[0]}\t1\n")
  return f"beir:{root}"


def exported(tmp_path, model=None) -> pathlib.Path:
  model = model or small_model()
  save_model_dir(tmp_path / "model", model)
  assert cli.main(["export", "--workdir", str(tmp_path / "model"), "--out",
                   str(tmp_path / "export"), "--format", "hyset-pytorch"]) == 0
  return tmp_path / "export" / "best.pt"


def import_(ckpt, spec, out, *more):
  return cli.main(["import", "--from", "hyset-pytorch", str(ckpt), "--tools", spec, "--out",
                   str(out), *more])


def write_ckpt(path: pathlib.Path, payload) -> pathlib.Path:
  path.write_bytes(torch_format.checkpoint_bytes(payload))
  return path


def payload(n=N, d=D, m_max=M, **changes) -> dict:
  rng = np.random.default_rng(1)
  state = collections.OrderedDict([("Z.weight", rng.standard_normal((n, d)).astype(np.float32)),
                                   ("P.weight", rng.standard_normal((d, d)).astype(np.float32))])
  for m in range(2, m_max + 1):
    state[f"interactions.{m}"] = rng.standard_normal((d, d)).astype(np.float32)
  doc = {"format_version": 2, "scorer_state": state,
         "func_names": [f"tool_{i}" for i in range(n)], "d_z": d, "d_r": d, "m_max": m_max,
         "encoder_type": "bert"}
  doc.update(changes)
  return doc


# --------------------------------------------------------------------------- both ways

def test_export_import_round_trip(tmp_path, capsys):
  model = small_model()
  ckpt = exported(tmp_path, model)
  doc = torch_format.read_checkpoint(ckpt)
  assert doc["format_version"] == 2 and doc["func_names"] == list(model.tool_ids)
  assert (doc["d_z"], doc["d_r"], doc["m_max"], doc["encoder_type"]) == (D, D, M, "bert")
  assert doc["train_config"]["k1"] == 3 and doc["train_config"]["k_pool"] == 6
  state = doc["scorer_state"]
  assert list(state) == ["Z.weight", "P.weight", "interactions.2", "interactions.3"]
  np.testing.assert_array_equal(state["Z.weight"], model.params.tool_embeddings)
  np.testing.assert_array_equal(state["P.weight"], model.params.projection)
  for m in (2, 3):
    np.testing.assert_array_equal(state[f"interactions.{m}"], model.params.interactions[m - 2])
    assert state[f"interactions.{m}"].dtype == np.float32

  spec = write_library(tmp_path / "lib", list(reversed(model.tool_ids)))  # another row order
  assert import_(ckpt, spec, tmp_path / "back") == 0
  back = load_model_dir(tmp_path / "back")
  assert back.tool_ids == model.tool_ids          # the checkpoint's row order
  assert (back.k1, back.k_pool, back.max_set_size, back.ranking) == (3, 6, M, "greedy")
  # Unit rows renormalised and symmetric matrices symmetrised: equal to float32 rounding.
  for a, b in zip(back.params[:3], model.params[:3]):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
  assert back.params.tower is None and back.params.lexical_weight is None

  # The output rules: no overwrite without --force; --force replaces an earlier model dir.
  assert import_(ckpt, spec, tmp_path / "back") == 2
  assert "--force" in capsys.readouterr().err
  assert import_(ckpt, spec, tmp_path / "back", "--force", "--k1", "2", "--k-pool", "5") == 0
  assert (load_model_dir(tmp_path / "back").k1, load_model_dir(tmp_path / "back").k_pool) == (2, 5)


def test_import_applies_the_authors_load(tmp_path):
  """Raw (unnormalised, asymmetric) parameters become what their project_constraints_ gives."""
  doc = payload(train_config={"k1": 4, "k_pool": 7})
  ckpt = write_ckpt(tmp_path / "raw.pt", doc)
  assert import_(ckpt, write_library(tmp_path / "lib", doc["func_names"]), tmp_path / "out") == 0
  got = load_model_dir(tmp_path / "out")
  z = doc["scorer_state"]["Z.weight"]
  np.testing.assert_allclose(got.params.tool_embeddings,
                             z / np.linalg.norm(z, axis=1, keepdims=True), atol=1e-6)
  for m in (2, 3):
    raw = doc["scorer_state"][f"interactions.{m}"]
    np.testing.assert_allclose(got.params.interactions[m - 2], 0.5 * (raw + raw.T), atol=1e-6)
  np.testing.assert_array_equal(got.params.projection, doc["scorer_state"]["P.weight"])
  assert (got.k1, got.k_pool) == (4, 7)


def test_export_refuses_terms_the_authors_lack(tmp_path, capsys):
  tower = QueryTower(np.zeros((1, D, 4), np.float32), np.zeros((1, 4), np.float32),
                     np.zeros((1, 4, D), np.float32), np.zeros((1, D), np.float32))
  save_model_dir(tmp_path / "towered", small_model(tower=tower))
  rc = cli.main(["export", "--workdir", str(tmp_path / "towered"), "--out",
                 str(tmp_path / "x"), "--format", "hyset-pytorch"])
  err = capsys.readouterr().err
  assert rc == 2 and "the tower term (the query tower q(r) in front of P)" in err
  assert "Traceback" not in err
  assert not (tmp_path / "x").exists()
  base = small_model()
  for term in terms.REGISTRY.values():  # each term, also one added later, is refused by name
    model = dataclasses.replace(base, params=base.params._replace(**{term.field: np.float32(1)}))
    with pytest.raises(UserError, match=rf"the {term.name} term \("):
      convert.to_payload(model)
  rng = np.random.default_rng(0)
  wide = dataclasses.replace(base, params=base.params._replace(
      projection=rng.standard_normal((D + 1, D)).astype(np.float32)))
  with pytest.raises(UserError, match="d_z = 8 but d_r = 9"):
    convert.to_payload(wide)


def test_toolbench_function_names(tmp_path):
  assert convert.toolbench_function_name("The Cocktail DB::List of Cocktails") == \
      "list_of_cocktails_for_the_cocktail_db"
  assert convert.toolbench_function_name("Weather 2::from") == "is_from_for_weather_2"
  assert convert.toolbench_function_name("x::3D model") == "get_3d_model_for_x"
  assert convert.toolbench_function_name("plain") is None
  ids = ["Flight Search::search", "Hotel::book", "Weather::now"]
  names = ["book_for_hotel", "now_for_weather", "search_for_flight_search"]
  assert convert.match_tools(names, ids, "c", "s") == ("Hotel::book", "Weather::now",
                                                       "Flight Search::search")


# --------------------------------------------------------------------------- bad input

def test_malicious_checkpoints_are_refused(tmp_path, capsys):
  marker = tmp_path / "pwned"

  class Evil:
    def __reduce__(self):
      return (os.system, (f"touch {marker}",))

  class Eval:
    def __reduce__(self):
      return (eval, (f"open({str(marker)!r}, 'w')",))

  spec = write_library(tmp_path / "lib", [f"tool_{i}" for i in range(N)])
  cases = {
      "top": Evil(),
      "eval": Eval(),
      # Hidden inside an otherwise valid payload, where a tensor would be.
      "nested": payload(scorer_state=collections.OrderedDict([("Z.weight", Evil())])),
  }
  for name, obj in cases.items():
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
      z.writestr("archive/data.pkl", pickle.dumps(obj, protocol=2))
      z.writestr("archive/version", "3\n")
    ckpt = tmp_path / f"{name}.pt"
    ckpt.write_bytes(buf.getvalue())
    rc = import_(ckpt, spec, tmp_path / f"out-{name}")
    err = capsys.readouterr().err
    assert rc == 2, name
    assert "refused" in err and str(ckpt) in err and "Traceback" not in err, err
    assert ("system" in err) if name != "eval" else ("eval" in err)
    assert not marker.exists(), name
    assert not (tmp_path / f"out-{name}").exists()


def test_bad_checkpoints(tmp_path, capsys):
  spec = write_library(tmp_path / "lib", [f"tool_{i}" for i in range(N)])

  def refused(ckpt, needle, tools=spec):
    rc = import_(ckpt, tools, tmp_path / "out")
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()

  not_zip = tmp_path / "legacy.pt"
  not_zip.write_bytes(pickle.dumps({"format_version": 2}))
  refused(not_zip, "not a zip archive")
  refused(tmp_path / "missing.pt", "does not exist")
  refused(write_ckpt(tmp_path / "v1.pt", payload(format_version=1)), "'format_version' is 1")
  bad = payload()
  bad["scorer_state"]["P.weight"] = np.zeros((D + 1, D), np.float32)
  refused(write_ckpt(tmp_path / "shape.pt", bad), "scorer_state['P.weight'] must be [8, 8]")
  bad = payload()
  del bad["scorer_state"]["interactions.3"]
  refused(write_ckpt(tmp_path / "keys.pt", bad), "missing interactions.3")
  bad = payload()
  bad["scorer_state"]["Z.weight"] = np.zeros((N, D), np.int64)
  refused(write_ckpt(tmp_path / "dtype.pt", bad), "floating-point tensor")
  # Names: the library must hold exactly the checkpoint's func_names.
  good = write_ckpt(tmp_path / "good.pt", payload())
  fewer = write_library(tmp_path / "fewer", [f"tool_{i}" for i in range(N - 2)] + ["other"])
  rc = import_(good, fewer, tmp_path / "out")
  err = capsys.readouterr().err
  assert rc == 2 and "2 of its func_names are not tools" in err and "'tool_28'" in err
  assert "1 tools of" in err and "'other'" in err
  # A storage shorter than its tensors claim.
  raw = io.BytesIO(good.read_bytes())
  short = io.BytesIO()
  with zipfile.ZipFile(raw) as src, zipfile.ZipFile(short, "w") as dst:
    for info in src.infolist():
      data = src.read(info.filename)
      dst.writestr(info.filename, data[:8] if info.filename.endswith("data/0") else data)
  (tmp_path / "short.pt").write_bytes(short.getvalue())
  refused(tmp_path / "short.pt", "storage '0'")


# --------------------------------------------------------------------------- fidelity

def _peer_setup():
  """(peer checkout, peer interpreter) or the reason the fidelity test cannot run."""
  sys.path.insert(0, str(REPO))
  from benchmarks import peer as bench
  if not os.environ.get("HYSET_PEER"):
    return None, ("HYSET_PEER is not set: it names a checkout of the authors' repository "
                  "(GitHub stormwther18/HYSET) to compare against")
  checkout = pathlib.Path(os.environ["HYSET_PEER"])
  if not (checkout / "src" / "hyset_model.py").is_file():
    return None, f"HYSET_PEER={checkout} has no src/hyset_model.py"
  python = bench.peer_python(os.environ.get("HYSET_PEER_PYTHON"))
  if python is None:
    return None, ("no peer environment with torch (benchmarks/.venv-peer, or HYSET_PEER_PYTHON); "
                  "python -m benchmarks.peer --help says how to make one. make test needs no torch")
  return (bench, checkout, python), None


@pytest.mark.heavy
def test_same_answers_as_the_authors_scorer(tmp_path):
  setup, reason = _peer_setup()
  if setup is None:
    pytest.skip(reason)
  bench, checkout, python = setup
  result, *_ = bench.agreement(bench.SMALL_MIXED, checkout, python, 32, tmp_path)
  n = result["queries"]
  assert n == 32
  assert sum(c > 0 for c in result["best_set_sizes"].values()) >= 4  # sets of most sizes
  disagreements = [row for row in result["rows"] if not row["all"]]
  assert result["agree"]["all"] == n, disagreements


# --------------------------------------------------------------------------- training leg

def test_training_leg_inputs_and_our_loop(tmp_path):
  """benchmarks/peer_train.py (our side of the training comparison, no torch): the shared
  inputs are valid gold sets, and the loop it times is hyset train's, at the asked shapes."""
  sys.path.insert(0, str(REPO))
  from benchmarks import peer as bench
  from benchmarks import peer_train
  queries, gold = bench.train_inputs(40, 8, 5, 24, seed=3)
  assert queries.shape == (24, 8) and queries.dtype == np.float32
  assert all(1 <= len(g) <= 5 and len(set(g)) == len(g) and g == sorted(g) for g in gold)
  assert all(0 <= t < 40 for g in gold for t in g)
  assert len({len(g) for g in gold}) >= 3     # several cardinalities, as in ToolBench
  z = np.random.default_rng(0).standard_normal((40, 8)).astype(np.float32)
  np.save(tmp_path / "z.npy", z / np.linalg.norm(z, axis=1, keepdims=True))
  np.save(tmp_path / "q.npy", queries)
  (tmp_path / "gold.json").write_text(json.dumps(gold))
  assert peer_train.main(["--tools", str(tmp_path / "z.npy"), "--queries",
                          str(tmp_path / "q.npy"), "--gold", str(tmp_path / "gold.json"),
                          "--max-size", "5", "--batch-size", "8", "--steps", "2", "--warmup",
                          "1", "--k-neg", "16", "--hard-neighbors", "4",
                          "--out", str(tmp_path / "out.json")]) == 0
  doc = json.loads((tmp_path / "out.json").read_text())
  assert (doc["batch_size"], doc["k_neg"], doc["hard_neighbors"], doc["max_size"]) == (
      8, 16, 4, 5)
  assert len(doc["s_per_step"]) == len(doc["pool_s_per_step"]) == 2
  assert all(0 < p < s for p, s in zip(doc["pool_s_per_step"], doc["s_per_step"]))
  assert doc["first_step_s"] > 0 and doc["peak_rss_bytes"] > 2**20
  config = peer_train.paper_config(5, 8, 16, 4, 3)
  assert (config.name, config.model.max_set_size, config.train.batch_size,
          config.train.k_neg, config.train.hard_neighbors) == ("paper", 5, 8, 16, 4)
  with pytest.raises(SystemExit):
    peer_train.main(["--tools", "z", "--queries", "q", "--gold", "g", "--max-size", "5",
                     "--batch-size", "8", "--steps", "1", "--warmup", "0", "--out", "o"])


def test_trained_leg_needs_a_workdir(tmp_path):
  sys.path.insert(0, str(REPO))
  from benchmarks import peer as bench
  with pytest.raises(UserError, match="no config.json"):
    bench.trained_model(str(tmp_path), 4)


@pytest.mark.heavy
def test_training_leg_beside_the_authors_loop(tmp_path):
  setup, reason = _peer_setup()
  if setup is None:
    pytest.skip(reason)
  bench, checkout, python = setup
  r = bench.train_speed(bench.SMALL, checkout, python, 8, 2, 1, tmp_path)   # 2 rounds
  assert r["rounds"] == 2
  for side in ("theirs", "ours"):
    assert r[side]["batch_size"] == 8 and len(r[side]["s_per_step"]) == 4   # 2 steps × 2
    assert r[side]["queries_per_s"] > 0 and r[side]["peak_rss_bytes"] > 2**20
  assert r["ratio_per_example"] == pytest.approx(
      r["theirs"]["s_per_step_median"] / r["ours"]["s_per_step_median"])
  assert bench.training_md([r])[-1].startswith("Once per epoch")


def test_training_rounds_merge_into_one_median():
  """The training leg's alternating rounds: each side's steps from every round, its largest
  peak RSS; its figure is the median over all of them (no torch needed)."""
  from benchmarks import peer as bench
  a = {"s_per_step": [1.0, 3.0], "pool_s_per_step": [0.1, 0.3], "peak_rss_bytes": 5, "k": 1}
  b = {"s_per_step": [2.0, 10.0], "pool_s_per_step": [0.2, 1.0], "peak_rss_bytes": 7, "k": 2}
  merged = bench._merge_rounds([a, b])
  assert merged["s_per_step"] == [1.0, 3.0, 2.0, 10.0]
  assert merged["pool_s_per_step"] == [0.1, 0.3, 0.2, 1.0]
  assert merged["peak_rss_bytes"] == 7 and merged["k"] == 1
  assert a["s_per_step"] == [1.0, 3.0]                    # the rounds' own results untouched


def test_inference_timing_brackets_the_authors_run():
  """Ours is timed before and after the authors' run and both rounds enter the medians (no
  torch: a small model and a stand-in for their per-query seconds)."""
  from benchmarks import peer as bench
  model = bench.random_model(**{k: v for k, v in bench.SMALL.items() if k != "name"})
  prepared, prepare_s = bench.prepare_timed(model)
  before = bench.ours_times(model, prepared, 3)
  assert len(before[1]) == 3 and len(before[bench.SPEED_BATCH]) == bench.SPEED_REPS
  theirs = {"queries": [{"seconds": 0.5}, {"seconds": 0.7}, {"seconds": 9.0}], "load_s": 0.1}
  t = bench.speed(model, theirs, 3, prepared, prepare_s, before)
  assert t["ours_batch64_calls"] == 2 * bench.SPEED_REPS and t["prepare_s"] == prepare_s
  assert t["theirs_s_per_query_median"] == 0.7
  assert t["ratio_batch1"] == pytest.approx(0.7 / t["ours_batch1_s_per_query"])
  slow = {1: [10.0] * 3, bench.SPEED_BATCH: [10.0] * bench.SPEED_REPS}
  # Every call of both rounds counts: a slow first round (3 of 6 calls) moves the median.
  assert bench.speed(model, theirs, 3, prepared, prepare_s, slow)["ours_batch1_s_per_query"] > 1
