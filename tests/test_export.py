"""hyset export (hyset, npz, projector, stablehlo), the NumPy reference scorer, and bad input."""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from hyset_jax.testing import synthetic_data
from hyset_jax import cli
from hyset_jax.inference import pipeline
from hyset_jax.io import modeldir, reference
from hyset_jax.training import train
from hyset_jax import config as config_lib

REPO = pathlib.Path(__file__).resolve().parents[1]

# Run inside a subprocess before anything else: any import of these packages fails loudly.
GUARD = textwrap.dedent("""
    import importlib.abc, sys
    BLOCKED = {blocked!r}
    class _Block(importlib.abc.MetaPathFinder):
      def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
          raise ImportError(f"import of {{name}} is not allowed here")
        return None
    sys.meta_path.insert(0, _Block())
    """)


def run_guarded(code: str, blocked, cwd, timeout=120):
  script = GUARD.format(blocked=sorted(blocked)) + textwrap.dedent(code) + textwrap.dedent(f"""
      leaked = sorted(m for m in sys.modules if m.split(".")[0] in {sorted(blocked)!r})
      assert not leaked, f"imported: {{leaked}}"
      """)
  path = pathlib.Path(cwd) / "guarded.py"
  path.write_text(script)
  out = subprocess.run([sys.executable, str(path)], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stdout + out.stderr
  return out.stdout


def write_library(root: pathlib.Path, n_tools: int) -> str:
  """A BEIR folder naming the synthetic tools, so the projector export finds their metadata."""
  (root / "qrels").mkdir(parents=True)
  with open(root / "corpus.jsonl", "w") as f:
    for i in range(n_tools):
      f.write(json.dumps({"_id": f"t{i}", "title": "", "metadata": {},
                          "text": f"category_name:Cat{i % 3}, tool_name:Tool {i}, "
                                  f"api_name:call\t{i}, api_description:x"}) + "\n")
  (root / "queries.jsonl").write_text(json.dumps({"_id": "q", "text": "hello"}) + "\n")
  (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq\tt0\t1\n")
  return f"beir:{root}"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A trained workdir (M = 4, K1 = 5, K_pool = 12 over 60 tools) and its test queries."""
  root = tmp_path_factory.mktemp("export")
  data = synthetic_data(n_tools=60, dim=16, n_queries=96, max_size=4, seed=3)
  c = config_lib.Config(name="export-test")
  c.data.spec = write_library(root / "library", 60)
  c.model = config_lib.ModelConfig(max_set_size=4, k1=5, k_pool=12)
  c.train = config_lib.TrainConfig(batch_size=16, num_steps=10, learning_rate=3e-2,
                                   warmup_steps=2, k_neg=12, log_every=5, eval_every=5,
                                   checkpoint_every=5, patience=100, eval_batch_size=64)
  workdir = root / "run"
  # One device: the exports are tested here, not the sharded step (half the compile time).
  train.train_and_evaluate(config_lib.validate(c), workdir, data=data, progress=False,
                           num_devices=1)
  # Every test query, plus random directions: more shortlists and sets to compare.
  rng = np.random.default_rng(0)
  extra = rng.normal(size=(64, 16)).astype(np.float32)
  queries = np.concatenate([data.splits["test"].embeddings, extra]).astype(np.float32)
  np.save(root / "queries.npy", queries)
  return root, workdir, queries


def export(*args):
  return cli.main(["export", *map(str, args)])


def hyset_predict(model, queries_npy, out):
  assert cli.main(["predict", "--model", str(model), "--query-embeddings", str(queries_npy),
                   "--out", str(out), "--force"]) == 0
  return [json.loads(line) for line in out.read_text().splitlines()]


def test_hyset_and_npz_round_trip(trained):
  root, workdir, _ = trained
  best = modeldir.load_model_dir(workdir / "best")
  assert export("--workdir", workdir, "--out", root / "h", "--format", "hyset") == 0
  again = modeldir.load_model_dir(root / "h")
  assert again.manifest() == best.manifest()
  for a, b in zip(again.params, best.params):
    np.testing.assert_array_equal(a, b)

  assert export("--workdir", workdir, "--out", root / "n", "--format", "npz") == 0
  with np.load(root / "n" / "model.npz", allow_pickle=False) as z:
    np.testing.assert_array_equal(z["tool_embeddings"], best.params.tool_embeddings)
    np.testing.assert_array_equal(z["projection"], best.params.projection)
    for m in range(2, 5):
      np.testing.assert_array_equal(z[f"interaction_{m}"], best.params.interactions[m - 2])
    assert "interaction_5" not in z.files
    assert z["tool_ids"].tolist() == list(best.tool_ids)
    assert (z["format"].item(), z["max_set_size"].item(), z["k1"].item(), z["k_pool"].item(),
            z["query_encoder"].item()) == (modeldir.FORMAT, 4, 5, 12, "synthetic")
  # The reference reads both exports (and the workdir) to the same model.
  for src in (root / "h", root / "n", root / "n" / "model.npz", workdir):
    m = reference.load_model(src)
    np.testing.assert_array_equal(m.interactions, best.params.interactions)
    assert m.tool_ids == best.tool_ids and (m.k1, m.k_pool, m.max_set_size) == (5, 12, 4)


def test_projector_files(trained, capsys):
  root, workdir, _ = trained
  out = root / "p"
  assert export("--workdir", workdir, "--out", out, "--format", "projector") == 0
  assert "categories and names from beir:" in capsys.readouterr().out
  z = modeldir.load_model_dir(workdir / "best").params.tool_embeddings
  np.testing.assert_allclose(np.loadtxt(out / "tensors.tsv", delimiter="\t"), z, atol=1e-7)
  lines = (out / "metadata.tsv").read_text().splitlines()
  assert lines[0] == "id\tcategory\tname"
  assert lines[1:3] == ["t0\tCat0\tTool 0 / call 0", "t1\tCat1\tTool 1 / call 1"]  # tab cleaned
  assert len(lines) == 61 and all(len(x.split("\t")) == 3 for x in lines)
  pbtxt = (out / "projector_config.pbtxt").read_text()
  assert 'tensor_path: "tensors.tsv"' in pbtxt and 'metadata_path: "metadata.tsv"' in pbtxt
  assert "tensor_shape: 60\n  tensor_shape: 16" in pbtxt
  cfg = json.loads((out / "projector_config.json").read_text())
  assert cfg["embeddings"][0]["tensorShape"] == [60, 16]
  # No readable data set: labels come from the ids.
  assert export("--workdir", workdir, "--out", root / "p2", "--format", "projector",
                "--data", f"beir:{root / 'missing'}") == 0
  assert "from the tool ids (data set 'beir:" in capsys.readouterr().out
  assert (root / "p2" / "metadata.tsv").read_text().splitlines()[1] == "t0\tunknown\tt0"
  shutil.copytree(workdir / "best", root / "bare")  # a model directory without config.json
  assert export("--workdir", root / "bare", "--out", root / "p3", "--format", "projector") == 0
  assert "from the tool ids (no data set named" in capsys.readouterr().out


def test_stablehlo_loads_and_runs_without_hyset_jax(trained):
  # jax.export serialization needs flatbuffers, which jax does not install by itself.
  root, workdir, queries = trained
  out = root / "s"
  assert export("--workdir", workdir, "--out", out, "--format", "stablehlo") == 0
  sig = json.loads((out / "signature.json").read_text())
  assert sig["format"] == "hyset-stablehlo/2" and sig["platforms"] == ["cpu", "cuda", "tpu"]
  assert sig["static"] | {"query_encoder": None} == {
      "k1": 5, "k_pool": 12, "max_set_size": 4, "num_tools": 60, "query_dim": 16,
      "tool_dim": 16, "method": "gather", "query_encoder": None, "lexical": None,
      "ranking": modeldir.load_model_dir(workdir / "best").ranking}
  fns = sig["functions"]
  assert fns["predict"]["inputs"] == [
      {"name": "query_embeddings", "shape": ["q", 16], "dtype": "float32"}]
  assert [(o["name"], o["shape"], o["dtype"]) for o in fns["stage2"]["outputs"]] == [
      ("set_tools", ["q", 4], "int32"), ("set_size", ["q"], "int32"),
      ("set_score", ["q"], "float32"), ("ranking", ["q", 12], "int32")]
  assert sorted(p.name for p in out.iterdir()) == [
      "predict.jax_exported", "signature.json", "stage1.jax_exported", "stage2.jax_exported"]
  # A process that never imports hyset_jax: deserialize, call with two batch sizes.
  np.save(root / "q.npy", queries)
  run_guarded(f"""
      import json, numpy as np
      from jax import export
      d = {str(out)!r}
      sig = json.load(open(d + "/signature.json"))
      load = lambda name: export.deserialize(bytearray(open(d + "/" + sig["functions"][name]["file"], "rb").read()))
      predict, stage1, stage2 = load("predict"), load("stage1"), load("stage2")
      q = np.load({str(root / "q.npy")!r})
      full = [np.asarray(a) for a in predict.call(q)]
      small = [np.asarray(a) for a in predict.call(q[:3])]
      for a, b in zip(full, small):
        assert np.array_equal(a[:3], b), "symbolic batch dimension"
      sl, logits = stage1.call(q)
      two = [np.asarray(a) for a in stage2.call(q, sl, logits)]
      np.savez({str(root / "stablehlo_out.npz")!r}, *(full + two), sl=np.asarray(sl))
      """, {"hyset_jax"}, root)
  got = np.load(root / "stablehlo_out.npz")
  model = modeldir.load_model_dir(workdir / "best")
  # The graphs rank with the ranking the model directory records.
  want = pipeline.predict(model.params, queries, k1=5, k_pool=12, max_size=4,
                           ranking=model.ranking)
  names = ["shortlist", "set_tools", "set_size", "set_score", "ranking"]
  for i, name in enumerate(names):
    # Two compilations of the same graph: scores agree to float32 rounding (a few ulp).
    np.testing.assert_allclose(got[f"arr_{i}"], np.asarray(getattr(want, name)), rtol=1e-6,
                               atol=1e-6, err_msg=name)
  np.testing.assert_array_equal(got["sl"], want.shortlist)
  for i, name in enumerate(names[1:]):  # stage 2 after stage 1 = the whole path
    np.testing.assert_allclose(got[f"arr_{5 + i}"], np.asarray(getattr(want, name)), rtol=1e-6,
                               atol=1e-6, err_msg=f"stage2 {name}")


def test_stablehlo_carries_the_seen_set_prior(trained, tmp_path):
  """A hyset/3 model's graphs give predict's sets, which the prior changed."""
  from jax import export as jax_export
  from hyset_jax.model import set_prior
  root, workdir, queries = trained
  md = modeldir.load_model_dir(workdir / "best")
  plain = pipeline.predict(md.params, queries, k1=5, k_pool=12, max_size=4, ranking="logit")
  gold = [tuple(sorted(int(t) for t in row[1:3])) for row in np.asarray(plain.shortlist)]
  prior = set_prior.with_weight(set_prior.fit(queries, gold, 4), 20.0, 0.5)
  with_prior = modeldir.ModelDir(md.params._replace(prior=prior), md.tool_ids, 4, 5, 12, None,
                                 ranking="set-mean")
  modeldir.save_model_dir(tmp_path / "m", with_prior)
  assert export("--workdir", tmp_path / "m", "--out", tmp_path / "s", "--format",
                "stablehlo") == 0
  sig = json.loads((tmp_path / "s" / "signature.json").read_text())
  predict = jax_export.deserialize(bytearray(
      (tmp_path / "s" / sig["functions"]["predict"]["file"]).read_bytes()))
  got = [np.asarray(a) for a in predict.call(queries)]
  want = pipeline.predict(with_prior.params, queries, k1=5, k_pool=12, max_size=4,
                           ranking="set-mean")
  for a, name in zip(got, ["shortlist", "set_tools", "set_size", "set_score", "ranking"]):
    np.testing.assert_allclose(a, np.asarray(getattr(want, name)), atol=1e-5, err_msg=name)
  assert np.mean(np.any(np.asarray(want.set_tools) != np.asarray(plain.set_tools), 1)) > 0.5


def test_reference_scorer_reproduces_hyset_predict(trained):
  root, workdir, queries = trained
  want = hyset_predict(workdir, root / "queries.npy", root / "pred.jsonl")
  assert len(want) == len(queries)
  export("--workdir", workdir, "--out", root / "ref_npz", "--format", "npz", "--force")
  # A copy of reference.py with the reader it needs (model_format.py and the schema) alone,
  # with jax, hyset_jax and safetensors unimportable.
  alone = root / "alone"
  alone.mkdir()
  for name in ("reference.py", "model_format.py", "model_schema.json"):
    shutil.copy(REPO / "hyset_jax" / "io" / name, alone / name)
  for src, name in ((workdir / "best", "ref_st.jsonl"), (root / "ref_npz", "ref_npz.jsonl")):
    run_guarded(f"""
        import runpy
        sys.argv = ["reference.py", "--model", {str(src)!r}, "--query-embeddings",
                    {str(root / "queries.npy")!r}, "--out", {str(root / name)!r}]
        try:
          runpy.run_path({str(alone / "reference.py")!r}, run_name="__main__")
        except SystemExit as e:
          assert e.code == 0, e.code
        """, {"hyset_jax", "jax", "jaxlib", "safetensors", "flax", "optax"}, alone)
    got = [json.loads(line) for line in (root / name).read_text().splitlines()]
    assert len(got) == len(want)
    for g, w in zip(got, want):
      assert g["query_id"] == w["query_id"]
      assert g["shortlist"] == w["shortlist"], w["query_id"]
      assert g["set"] == w["set"], w["query_id"]
      assert g["ranking"] == w["ranking"], w["query_id"]
      assert abs(g["set_score"] - w["set_score"]) < 1e-4, w["query_id"]
  # The sets are not all trivial: the trained interactions choose sets of several sizes.
  assert len({len(w["set"]) for w in want}) >= 2


def test_refuses_to_overwrite_and_bad_workdirs(trained, tmp_path, capsys):
  root, workdir, _ = trained
  target = tmp_path / "out"
  target.mkdir()
  (target / "keep.txt").write_text("mine")
  for fmt in ("hyset", "npz", "projector", "stablehlo"):
    assert export("--workdir", workdir, "--out", target, "--format", fmt) == 2
    assert "exists and is not empty; pass --force" in capsys.readouterr().err
  # --force replaces only an earlier export of the same format, never an unrelated folder.
  for fmt in ("hyset", "npz", "projector", "stablehlo"):
    assert export("--workdir", workdir, "--out", target, "--format", fmt, "--force") == 2
    assert f"is not a {fmt} export" in capsys.readouterr().err
  assert sorted(p.name for p in target.iterdir()) == ["keep.txt"]
  assert (target / "keep.txt").read_text() == "mine"
  again = tmp_path / "again"
  assert export("--workdir", workdir, "--out", again, "--format", "npz") == 0
  assert export("--workdir", workdir, "--out", again, "--format", "npz", "--force") == 0
  assert sorted(p.name for p in again.iterdir()) == ["model.npz"]
  assert export("--workdir", workdir, "--out", again, "--format", "hyset", "--force") == 2
  assert "is not a hyset export (it has no manifest.json, params.safetensors)" in \
      capsys.readouterr().err
  # Exporting over the source model is refused even with --force.
  assert export("--workdir", workdir, "--out", workdir, "--force") == 2
  assert "this command's input" in capsys.readouterr().err

  assert export("--workdir", tmp_path / "nowhere", "--out", tmp_path / "o1") == 2
  assert "does not exist" in capsys.readouterr().err
  # A workdir with checkpoints but no evaluation yet.
  early = tmp_path / "early"
  shutil.copytree(workdir / "checkpoints", early / "checkpoints")
  assert export("--workdir", early, "--out", tmp_path / "o2") == 2
  assert "no best/manifest.json; it has checkpoints up to step 10" in capsys.readouterr().err
  # Corrupted best/: truncated tensors, broken manifest.
  broken = tmp_path / "broken"
  shutil.copytree(workdir / "best", broken / "best")
  params = broken / "best" / "params.safetensors"
  params.write_bytes(params.read_bytes()[:200])
  assert export("--workdir", broken, "--out", tmp_path / "o3", "--format", "stablehlo") == 2
  assert "header length" in capsys.readouterr().err
  shutil.copy(workdir / "best" / "params.safetensors", params)
  (broken / "best" / "manifest.json").write_text("{not json")
  assert export("--workdir", broken, "--out", tmp_path / "o4", "--format", "npz") == 2
  assert "not valid JSON" in capsys.readouterr().err
  assert not any((tmp_path / f"o{i}").exists() for i in range(1, 5))
  # The console script: exit 2 and one line, no traceback.
  proc = subprocess.run([sys.executable, "-m", "hyset_jax.cli", "export", "--workdir",
                         str(broken), "--out", str(tmp_path / "o5")],
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == 2 and proc.stderr.startswith("error: ")
  assert "Traceback" not in proc.stderr
