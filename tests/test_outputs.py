"""The output rules of hyset_jax.io_utils (docs/contracts.md, "Outputs") and the command-line
fixes of issue 15 that are not a row of the guard (tests/test_cli_guard.py)."""
import argparse
import json
import os
import pathlib
import stat

import numpy as np
import pytest

from hyset_jax import cli, io_utils
from hyset_jax.io import modeldir, reference
from hyset_jax.errors import UserError

from test_predict_cli import D, write_model_dir


def mode(path) -> int:
  return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask_027():
  old = os.umask(0o027)
  yield
  os.umask(old)


# --------------------------------------------------------------------------- io_utils

def test_output_file_rules(tmp_path):
  f = tmp_path / "a.json"
  assert io_utils.output_file(f, force=False) == f
  f.write_text("x")
  with pytest.raises(UserError, match="already exists; pass --force"):
    io_utils.output_file(f, force=False)
  assert io_utils.output_file(f, force=True) == f
  with pytest.raises(UserError, match="is a directory"):
    io_utils.output_file(tmp_path, force=True)
  with pytest.raises(UserError, match="one of this command's inputs"):
    io_utils.output_file(f, force=True, inputs=[f])
  with pytest.raises(UserError, match="one of this command's inputs"):  # the same file, other name
    io_utils.output_file(tmp_path / "." / "a.json", force=True, inputs=[str(f)])
  with pytest.raises(UserError, match="inside this command's input folder"):
    io_utils.output_file(f, force=True, inputs=[tmp_path])
  io_utils.output_file(tmp_path / "new.json", force=False, inputs=[tmp_path])  # new files: fine
  with pytest.raises(UserError, match="does not exist; create it first"):
    io_utils.output_file(tmp_path / "no" / "such" / "a.json", force=True)
  with pytest.raises(UserError, match=r"a.json is a file, not a folder"):
    io_utils.output_file(f / "b.json", force=True)


def test_output_dir_rules(tmp_path):
  out = tmp_path / "out"
  io_utils.output_dir(out, force=False)
  out.mkdir()
  io_utils.output_dir(out, force=False)              # empty: fine
  (out / "mine.txt").write_text("mine")
  with pytest.raises(UserError, match="not empty; pass --force"):
    io_utils.output_dir(out, force=False, marker="model.npz")
  with pytest.raises(UserError, match=r"is not a npz export \(it has no model.npz\)"):
    io_utils.output_dir(out, force=True, marker="model.npz", what="npz export")
  (out / "model.npz").write_text("old")
  io_utils.output_dir(out, force=True, marker="model.npz")
  with pytest.raises(UserError, match="takes a directory"):
    io_utils.output_dir(out / "mine.txt", force=True)
  with pytest.raises(UserError, match="holds this command's input"):
    io_utils.output_dir(tmp_path, force=True, inputs=[out / "mine.txt"])
  with pytest.raises(UserError, match="one of this command's inputs"):
    io_utils.output_dir(out, force=True, inputs=[out])


def test_atomic_dir_keeps_the_old_output_when_writing_fails(tmp_path):
  out = tmp_path / "out"
  with io_utils.atomic_dir(out, force=False) as tmp:
    (tmp / "a").write_text("first")
  with pytest.raises(RuntimeError):
    with io_utils.atomic_dir(out, force=True) as tmp:
      (tmp / "a").write_text("second")
      raise RuntimeError("killed")
  assert (out / "a").read_text() == "first"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging folder left


def test_writes_respect_the_umask(tmp_path, umask_027):
  with io_utils.atomic_write(tmp_path / "f.json") as f:
    f.write("{}")
  assert mode(tmp_path / "f.json") == 0o640
  with io_utils.atomic_dir(tmp_path / "d", force=False) as tmp:
    (tmp / "sub").mkdir()
    fd = os.open(tmp / "sub" / "secret", os.O_CREAT | os.O_WRONLY, 0o600)  # like safetensors
    os.close(fd)
  assert mode(tmp_path / "d") == 0o750
  assert mode(tmp_path / "d" / "sub") == 0o750
  assert mode(tmp_path / "d" / "sub" / "secret") == 0o640
  # Replacing keeps the replaced file's and folder's own permissions.
  os.chmod(tmp_path / "f.json", 0o604)
  with io_utils.atomic_write(tmp_path / "f.json") as f:
    f.write("{}")
  assert mode(tmp_path / "f.json") == 0o604


def test_export_into_an_empty_0755_folder_keeps_0755(tmp_path, capsys):
  write_model_dir(tmp_path / "model")
  out = tmp_path / "export"
  out.mkdir()
  os.chmod(out, 0o755)
  assert cli.main(["export", "--workdir", str(tmp_path / "model"), "--out", str(out)]) == 0
  assert mode(out) == 0o755
  assert {mode(p) for p in out.iterdir()} == {0o666 & ~io_utils.umask()}
  assert modeldir.load_model_dir(out).tool_ids[0] == "tool_0"


# --------------------------------------------------------------------------- commands

def test_data_stats_json_never_replaces_the_data(tmp_path, shared_data, capsys):
  from test_cli_guard import _write_beir
  root = _write_beir(tmp_path / "beir")
  before = (root / "queries.jsonl").read_bytes()
  for extra in ([], ["--force"]):
    assert cli.main(["data", "stats", f"beir:{root}", "--json", str(root / "queries.jsonl"),
                     *extra]) == 2
    assert "input folder" in capsys.readouterr().err
  assert (root / "queries.jsonl").read_bytes() == before
  stats = tmp_path / "stats.json"
  assert cli.main(["data", "stats", f"beir:{root}", "--json", str(stats)]) == 0
  assert json.loads(stats.read_text())["spec"] == f"beir:{root}"
  assert cli.main(["data", "stats", f"beir:{root}", "--json", str(stats)]) == 2
  assert cli.main(["data", "stats", f"beir:{root}", "--json", str(stats), "--force"]) == 0


def test_data_prepare_force_replaces_only_prepared_data(tmp_path, capsys):
  from test_cli_guard import _write_beir
  root = _write_beir(tmp_path / "beir")
  out = tmp_path / "prepared"
  out.mkdir()
  (out / "hyset_data").mkdir()
  (out / "hyset_data" / "mine.txt").write_text("mine")
  assert cli.main(["data", "prepare", f"beir:{root}", "--out", str(out), "--force"]) == 2
  assert "is not a folder of prepared data" in capsys.readouterr().err
  assert (out / "hyset_data" / "mine.txt").read_text() == "mine"
  fresh = tmp_path / "fresh"
  assert cli.main(["data", "prepare", f"beir:{root}", "--out", str(fresh)]) == 0
  assert cli.main(["data", "prepare", f"beir:{root}", "--out", str(fresh), "--force"]) == 0
  assert sorted(p.name for p in fresh.iterdir()) == ["hyset_data"]


def test_predict_batch_size_and_flags_are_checked(tmp_path, capsys):
  write_model_dir(tmp_path / "model")
  np.save(tmp_path / "q.npy", np.ones((2, D), np.float32))
  base = ["predict", "--model", str(tmp_path / "model"), "--query-embeddings",
          str(tmp_path / "q.npy"), "--out", str(tmp_path / "p.jsonl")]
  for flag, value in (("--batch-size", "0"), ("--k1", "0"), ("--k-pool", "-3"),
                      ("--max-size", "1")):
    with pytest.raises(SystemExit) as e:
      cli.main(base + [flag, value])
    assert e.value.code == 2
    assert f"argument {flag}: expected an integer ≥" in capsys.readouterr().err


def test_bench_refuses_oversized_and_hour_long_runs_up_front(tmp_path, capsys):
  # K=40, M=8 has 1e8 subsets: refused from the count alone, before any allocation.
  assert cli.main(["bench", "enumerate", "--k-pool", "40", "--max-size", "8", "--batch", "1",
                   "--impl", "numpy"]) == 2
  err = capsys.readouterr().err
  assert "100,146,723 subsets" in err and "lower --k-pool, --max-size or --batch" in err
  assert cli.main(["bench", "enumerate", "--impl", "naive"]) == 2
  assert "use --batch 2" in capsys.readouterr().err
  keep = tmp_path / "bench.json"
  keep.write_text("mine")
  small = ["bench", "enumerate", "--k-pool", "6", "--max-size", "3", "--batch", "2", "--repeats",
           "1", "--impl", "naive", "--json", str(keep)]
  assert cli.main(small) == 2
  assert keep.read_text() == "mine"
  assert cli.main(small + ["--force"]) == 0
  err = capsys.readouterr().err
  assert "naive: about" in err  # the up-front estimate
  assert json.loads(keep.read_text())["impl"] == "naive"


def test_train_hints_name_the_right_knobs(tmp_path, capsys):
  # A checkpoint step inside a workdir is not a workdir (and not a model).
  run = tmp_path / "run"
  (run / "checkpoints" / "60").mkdir(parents=True)
  (run / "config.json").write_text("{}")
  step = run / "checkpoints" / "60"
  assert cli.main(["train", "--config", "tiny", "--workdir", str(step)]) == 2
  err = capsys.readouterr().err
  assert f"is inside the training workdir {run}" in err and f"--workdir {run}" in err
  assert cli.main(["predict", "--model", str(step), "--query-embeddings", "x.npy", "--out",
                   str(tmp_path / "p.jsonl")]) == 2
  err = capsys.readouterr().err
  assert f"pass the workdir itself ({run})" in err and "hyset train --workdir" not in err
  # Gold sets larger than the model's M: train is told its config key, data its flag.
  from hyset_jax.data.specs import load_dataset
  from test_cli_guard import _write_beir
  root = _write_beir(tmp_path / "beir")
  with open(root / "qrels" / "train.tsv", "a") as f:
    f.write("q0\ttool_5\t1\nq0\ttool_6\t1\n")
  with pytest.raises(UserError, match=r"raise model.max_set_size \(hyset train --set") as e:
    load_dataset(f"beir:{root}", max_set_size=2)
  assert "--max-size" not in str(e.value)
  assert cli.main(["data", "stats", f"beir:{root}", "--max-size", "2"]) == 2
  assert "raise --max-size to at least 3" in capsys.readouterr().err


def test_eval_takes_a_workdir_and_the_validation_split(tmp_path, capsys):
  from hyset_jax.data import splits
  from hyset_jax.data.specs import load_dataset
  from test_cli_guard import _write_beir
  root = _write_beir(tmp_path / "beir")
  out = tmp_path / "m.json"
  assert cli.main(["eval", "--data", f"beir:{root}", "--split", "validation", "--method", "bm25",
                   "--out", str(out), "--validation-fraction", "0.3"]) == 0
  want = len(splits.with_validation(load_dataset(f"beir:{root}"), 0.3).split("validation"))
  assert json.loads(out.read_text())["n_queries"] == want > 0
  # The fraction comes from the workdir's config.json when --model names one.
  from hyset_jax.commands.eval import validation_fraction
  work = tmp_path / "work"
  (work / "best").mkdir(parents=True)
  (work / "config.json").write_text(json.dumps({"data": {"validation_fraction": 0.25}}))
  assert validation_fraction(None, str(work)) == 0.25
  assert validation_fraction(None, str(work / "best")) == 0.25
  assert validation_fraction(0.5, str(work)) == 0.5
  # --model WORKDIR resolves to its best/ as predict and export do.
  from hyset_jax.io.modeldir import best_model_dir
  write_model_dir(work / "best")
  assert best_model_dir(work) == work / "best"


# --------------------------------------------------------------------------- help

def _parsers():
  from toolscout import cli as toolscout_cli
  for build in (cli.build_parser, toolscout_cli.build_parser):
    yield from cli.subparsers_of(cli.apply_help_rules(build()))


def test_every_option_has_help_and_shows_its_default():
  for p in _parsers():
    text = p.format_help()
    assert "`" not in text and ":mod:" not in text, (p.prog, text)
    for action in p._actions:
      if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
        continue
      assert action.help, f"{p.prog} {action.option_strings or action.dest}: no help text"
      shown = p._get_formatter()._get_help_string(action) % vars(action)
      if action.default not in (None, False) and not isinstance(action.default, list):
        assert "default" in shown, f"{p.prog} {action.option_strings}: default not shown"


# --------------------------------------------------------------------------- reference.py

def test_reference_tolerances_match_hyset_predict():
  assert (reference.SYMMETRY_RTOL, reference.NORM_ATOL) == (modeldir.SYMMETRY_RTOL,
                                                            modeldir.NORM_ATOL)
  assert set(reference.FORMATS) == set(modeldir.READABLE)


def _asym():
  return np.arange(D * D, dtype=np.float32).reshape(D, D)


@pytest.mark.parametrize("tensors,manifest,needle", [
    ({"projection": np.full((D, D), np.nan, np.float32)}, None, "'projection' contains NaN"),
    ({"interaction_2": _asym()}, None, "'interaction_2' is not symmetric"),
    ({"tool_embeddings": np.ones((24, D), np.float32)}, None, "row 0 (tool 'tool_0') has norm"),
    ({"interaction_3": None}, None, "missing tensor 'interaction_3'"),
    ({"projection": np.ones((D, D + 1), np.float32)}, None, "'projection' must be [d_r, 6]"),
    ({"extra": np.ones(2, np.float32)}, None, "unexpected tensor(s) 'extra'"),
    (None, {"tool_ids": [f"t{i}" for i in range(23)]}, "has 23 ids but"),
    (None, {"tool_ids": ["t"] * 24}, "repeats id 't'"),
    (None, {"k1": "4"}, "field 'k1' must be an integer"),
    (None, {"k1": 8}, "field 'k1' = 8: need 1 ≤ k1 < k_pool (8)"),
    (None, {"k_pool": 30}, "field 'k_pool' = 30: the model has only 24 tools"),
    (None, {"max_set_size": 1}, "'max_set_size' must be ≥ 2"),
    (None, {"format": "hyset/9"}, "field 'format' is 'hyset/9'"),
    (None, {"query_encoder": 3}, "'query_encoder' must be a string or null"),
])
def test_reference_validates_like_predict(tmp_path, capsys, tensors, manifest, needle):
  write_model_dir(tmp_path / "model", tensors, manifest)
  np.save(tmp_path / "q.npy", np.ones((2, D), np.float32))
  argv = ["--model", str(tmp_path / "model"), "--query-embeddings", str(tmp_path / "q.npy")]
  assert reference.main(argv + ["--out", str(tmp_path / "r.jsonl")]) == 2
  ref_err = capsys.readouterr().err
  assert needle in ref_err and ref_err.count("error:") == 1, ref_err
  assert not (tmp_path / "r.jsonl").exists()
  # hyset predict refuses the same directory.
  assert cli.main(["predict", "--model", str(tmp_path / "model"), "--query-embeddings",
                   str(tmp_path / "q.npy"), "--out", str(tmp_path / "p.jsonl")]) == 2
  assert capsys.readouterr().err.startswith("error: ")


def test_reference_refuses_bad_queries_and_writes_no_nan(tmp_path, capsys):
  write_model_dir(tmp_path / "model", manifest={"query_encoder": None})
  q = np.ones((3, D), np.float32)
  q[1, 2] = np.inf
  np.save(tmp_path / "q.npy", q)
  args = ["--model", str(tmp_path / "model"), "--out", str(tmp_path / "r.jsonl")]
  assert reference.main(args + ["--query-embeddings", str(tmp_path / "q.npy")]) == 2
  assert "row 1 contains NaN or inf" in capsys.readouterr().err
  np.save(tmp_path / "q.npy", np.ones((3, D + 1), np.float32))
  assert reference.main(args + ["--query-embeddings", str(tmp_path / "q.npy")]) == 2
  assert "dimension 7" in capsys.readouterr().err
  np.save(tmp_path / "q.npy", np.ones((3, D), np.float32))
  assert reference.main(args + ["--query-embeddings", str(tmp_path / "q.npy")]) == 0
  rows = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
  assert len(rows) == 3 and all(np.isfinite(r["set_score"]) for r in rows)
  assert reference.main(args + ["--query-embeddings", str(tmp_path / "q.npy")]) == 2  # exists
  assert reference.main(args + ["--query-embeddings", str(tmp_path / "q.npy"), "--force"]) == 0


@pytest.mark.parametrize("write, needle", [
    (lambda f: np.savez(f, q=np.ones((2, D), np.float32)), "an .npz archive, not an .npy"),
    (lambda f: np.save(f, np.ones((2, D), np.int32)), "expected a float array"),
    (lambda f: np.save(f, np.zeros((0, D), np.float32)), "no query embeddings (0 rows)"),
    (lambda f: f.write(b"not numpy"), "not a readable .npy array"),
])
def test_predict_and_the_reference_refuse_the_same_query_files(tmp_path, capsys, write, needle):
  write_model_dir(tmp_path / "model", manifest={"query_encoder": None})
  with open(tmp_path / "q.npy", "wb") as f:
    write(f)
  q = ["--query-embeddings", str(tmp_path / "q.npy")]
  assert reference.main(["--model", str(tmp_path / "model"), *q,
                         "--out", str(tmp_path / "r.jsonl")]) == 2
  ref_err = capsys.readouterr().err
  assert cli.main(["predict", "--model", str(tmp_path / "model"), *q,
                   "--out", str(tmp_path / "p.jsonl")]) == 2
  err = capsys.readouterr().err
  assert needle in ref_err and needle in err and str(tmp_path / "q.npy") in err, (ref_err, err)
  assert not (tmp_path / "r.jsonl").exists() and not (tmp_path / "p.jsonl").exists()


def test_reference_matches_predict_with_tower_and_conditioned_term(tmp_path, capsys):
  """hyset/2's query tower and query-conditioned set term, in NumPy, equal hyset predict."""
  from hyset_jax.model.scoring import HysetParams, QueryInteraction, QueryTower
  rng = np.random.default_rng(3)
  n, d, m, rank, hidden, depth = 30, 6, 4, 2, 5, 2
  z = rng.normal(size=(n, d)).astype(np.float32)
  z /= np.linalg.norm(z, axis=1, keepdims=True)
  a = rng.normal(size=(m - 1, d, d)).astype(np.float32)
  f32 = lambda *shape: (0.5 * rng.normal(size=shape)).astype(np.float32)  # noqa: E731
  params = HysetParams(
      tool_embeddings=z, projection=f32(d, d), interactions=(a + a.transpose(0, 2, 1)) / 2,
      tower=QueryTower(w_in=f32(depth, d, hidden), b_in=f32(depth, hidden),
                       w_out=f32(depth, hidden, d), b_out=f32(depth, d)),
      conditioned=QueryInteraction(u=f32(m - 1, d, rank), w=f32(m - 1, d, rank),
                                   v=f32(m - 1, d), b=f32(m - 1)))
  modeldir.save_model_dir(tmp_path / "model", modeldir.ModelDir(
      params=params, tool_ids=tuple(f"t{i}" for i in range(n)), max_set_size=m, k1=5, k_pool=9,
      query_encoder=None))
  np.save(tmp_path / "q.npy", rng.normal(size=(16, d)).astype(np.float32))
  common = ["--model", str(tmp_path / "model"), "--query-embeddings", str(tmp_path / "q.npy")]
  for i, extra in enumerate(([], ["--max-size", "3"], ["--ranking", "logit"],
                             ["--ranking", "set-first"])):
    want_path, got_path = tmp_path / f"p{i}.jsonl", tmp_path / f"r{i}.jsonl"
    assert cli.main(["predict", *common, "--out", str(want_path), *extra]) == 0
    assert reference.main([*common, "--out", str(got_path), *extra]) == 0
    want = [json.loads(line) for line in want_path.read_text().splitlines()]
    got = [json.loads(line) for line in got_path.read_text().splitlines()]
    for g, w in zip(got, want, strict=True):
      assert (g["shortlist"], g["set"], g["ranking"]) == (w["shortlist"], w["set"], w["ranking"])
      assert abs(g["set_score"] - w["set_score"]) < 1e-4
    assert len({len(w["set"]) for w in want}) >= 2  # the term matters: sets of several sizes


def test_export_formats_agree():
  from hyset_jax.io import export
  from hyset_jax.commands import export as export_cmd
  assert export_cmd.FORMATS == export.FORMATS == tuple(export.MARKERS)
