"""The approximate first stage (hyset_jax/inference/ann.py): against the exact path, the
per-model opt-in (manifest and --first-stage), the index cache, the fallbacks and bad settings."""
import dataclasses
import json

import numpy as np
import pytest

from hyset_jax import cli
from hyset_jax.inference import ann, pipeline
from hyset_jax.io import model_format, modeldir
from hyset_jax.model import parameters
from hyset_jax.model.query_inputs import QueryInputs
from hyset_jax.model.scoring import HysetParams

N, D, M, K1, K = 400, 16, 3, 4, 8


def clustered(n, d, seed):
  """Unit rows in clusters (real embeddings are; isotropic ones leave an index no structure)."""
  rng = np.random.default_rng(seed)
  centers = rng.normal(size=(n // 20, d))
  z = centers[rng.integers(0, len(centers), n)] + 0.4 * rng.normal(size=(n, d))
  return (z / np.linalg.norm(z, axis=1, keepdims=True)).astype(np.float32)


def random_params(n=N, seed=0, tower=False, scale=0.3):
  """θ with a random P and symmetric M_m (and a query tower if asked)."""
  rng = np.random.default_rng(seed)
  z = clustered(n, D, seed)
  params = parameters.init_params(z, D, M, tower_depth=1 if tower else 0, tower_hidden=8)
  m = rng.normal(scale=scale, size=(M - 1, D, D)).astype(np.float32)
  return params._replace(projection=np.eye(D, dtype=np.float32) + rng.normal(
      scale=0.3, size=(D, D)).astype(np.float32), interactions=(m + m.transpose(0, 2, 1)) / 2)


def queries(params, q=40, seed=1):
  rng = np.random.default_rng(seed)
  z = np.asarray(params.tool_embeddings)
  x = z[rng.integers(0, len(z), q)] + 0.3 * rng.normal(size=(q, D))
  return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def both(params, x, index, **kw):
  prep = pipeline.prepare(params, max_size=M, k_pool=K)
  kw = dict(k1=K1, k_pool=K, max_size=M, batch_size=16) | kw
  return (pipeline.predict_batched(prep, x, **kw),
          pipeline.predict_batched(prep, x, first_stage=index, **kw))


def assert_same(exact, approx):
  np.testing.assert_array_equal(approx.shortlist, exact.shortlist)
  np.testing.assert_array_equal(approx.set_tools, exact.set_tools)
  np.testing.assert_array_equal(approx.ranking, exact.ranking)
  np.testing.assert_allclose(approx.set_score, exact.set_score, atol=1e-5)


def test_flat_index_gives_the_exact_answers():
  # With an exact index the candidates hold the true top tools: same shortlist (order
  # included), sets, rankings and scores as the exact path (a query tower in front of P).
  params = random_params(tower=True)
  index = ann.build(params.tool_embeddings, ann.Settings(index="flat"))
  assert_same(*both(params, queries(params), index))


def test_hnsw_recall_and_best_sets():
  params = random_params(n=3000)
  index = ann.build(params.tool_embeddings, ann.Settings(ef_search=64, candidates=32,
                                                         neighbors=16))
  exact, approx = both(params, queries(params, q=64), index)
  recall = np.mean([len(set(a) & set(e)) / K for a, e in zip(approx.shortlist, exact.shortlist)])
  assert recall >= 0.99
  same = np.mean([sorted(a) == sorted(e) for a, e in zip(approx.set_tools, exact.set_tools)])
  assert same >= 0.98


def test_ivf_recall_and_best_sets():
  params = random_params(n=3000)
  index = ann.build(params.tool_embeddings, ann.Settings(index="ivf", nlist=32, nprobe=16,
                                                         candidates=32, neighbors=16))
  assert index.index.nlist == 32 and index.index.ntotal == 3000
  exact, approx = both(params, queries(params, q=64), index)
  recall = np.mean([len(set(a) & set(e)) / K for a, e in zip(approx.shortlist, exact.shortlist)])
  assert recall >= 0.99
  same = np.mean([sorted(a) == sorted(e) for a, e in zip(approx.set_tools, exact.set_tools)])
  assert same >= 0.98
  # Every list probed: IVF scans all of Z, the exact answers.
  full = ann.Index(index.index, dataclasses.replace(index.settings, nprobe=32), 3000, D)
  assert_same(*both(params, queries(params, q=16), full))


def test_ivf_sq8_codes_choose_candidates_and_floats_score_them():
  params = random_params(n=3000)
  z = np.asarray(params.tool_embeddings)
  settings = ann.Settings(index="ivf_sq8", nlist=32, nprobe=16, candidates=32, neighbors=16)
  assert settings.effort() == 16 and "SQ8" in settings.describe()
  index = ann.build(z, settings)
  assert index.index.nlist == 32 and index.index.ntotal == 3000
  assert index.index.code_size == D  # one byte per dimension: a quarter of the floats
  exact, approx = both(params, queries(params, q=64), index)
  recall = np.mean([len(set(a) & set(e)) / K for a, e in zip(approx.shortlist, exact.shortlist)])
  assert recall >= 0.99
  same = np.mean([sorted(a) == sorted(e) for a, e in zip(approx.set_tools, exact.set_tools)])
  assert same >= 0.98
  # The codes' scores are approximate, the shortlist's ℓ is the float q̃ᵀz_t of Z's rows.
  x = queries(params, q=16)
  qt = x @ np.asarray(params.projection)
  codes, ids = index.index.search(qt, 8)
  floats = np.take_along_axis(qt @ z.T, ids, axis=1)
  assert np.max(np.abs(codes - floats)) > 1e-4
  prep = pipeline.prepare(params, max_size=M, k_pool=K)
  s1 = ann.stage1(index, prep, x, K1, K)
  np.testing.assert_allclose(s1.logits, np.take_along_axis(qt @ z.T, np.asarray(s1.s0), 1),
                             rtol=1e-6, atol=1e-6)
  # Every list probed and every tool a candidate: the exact answers, whatever the codes.
  full = ann.Index(index.index, dataclasses.replace(settings, nprobe=32, candidates=3000),
                   3000, D)
  assert_same(*both(params, x, full))


def test_ivf_small_library_gets_fewer_lists():
  z = clustered(200, D, 0)
  index = ann.build(z, ann.Settings(index="ivf"))  # nlist 4096 asked, 200 // 40 = 5 made
  assert index.index.nlist == 5
  np.testing.assert_array_equal(index.search(z[:3], 1)[:, 0], [0, 1, 2])


def test_expansion_effort_is_the_expansion_searches_own():
  params = random_params(n=1000)
  z = np.asarray(params.tool_embeddings)
  for kind, first in (("ivf", "nprobe"), ("hnsw", "ef_search")):
    settings = ann.Settings(index=kind, nlist=16, **{first: 2}, expansion_effort=16)
    assert settings.effort() == 2 and settings.effort(expansion=True) == 16
    assert ann.Settings(index=kind, **{first: 5}).effort(expansion=True) == 5
    assert "expansion" in settings.describe()
    built = ann.build(z, settings)
    seen = []

    class Recording(ann.Index):
      def search(self, x, k, expansion=False):
        seen.append(expansion)
        return super().search(x, k, expansion)

    index = Recording(built.index, settings, len(z), D)
    both(params, queries(params, q=8), index, batch_size=8)
    assert seen == [False, True]  # stage 1 with its effort, then the expansion with its own
    # With the flat index (or nprobe = nlist) the expansion's candidates are the true ones.
    x = queries(params, q=4) @ np.asarray(params.interactions[-1])
    truth = np.argsort(-(x @ z.T), axis=1, kind="stable")[:, :5]
    if kind == "ivf":
      np.testing.assert_array_equal(built.search(x, 5, expansion=True), truth)


def test_lowrank_expansion_at_full_rank_is_exact():
  # Rank d and every tool a candidate: g̃ = g, the expansion's candidates are all of Z, and
  # with the flat index the answers are the exact path's (a query tower in front of P).
  params = random_params(tower=True)
  index = ann.build(params.tool_embeddings, ann.Settings(
      index="flat", expansion="lowrank", expansion_rank=D, expansion_candidates=N))
  assert_same(*both(params, queries(params), index))


def test_lowrank_expansion_recall_and_best_sets():
  params = random_params(n=3000)
  settings = ann.Settings(index="flat", expansion="lowrank", expansion_rank=12,
                          expansion_candidates=128)
  assert "rank-12" in settings.describe()
  index = ann.build(params.tool_embeddings, settings)
  exact, approx = both(params, queries(params, q=64), index)
  recall = np.mean([len(set(a) & set(e)) / K for a, e in zip(approx.shortlist, exact.shortlist)])
  assert recall >= 0.99
  same = np.mean([sorted(a) == sorted(e) for a, e in zip(approx.set_tools, exact.set_tools)])
  assert same >= 0.98
  # The low-rank g̃ ranks tools as the exact g does where M_M has rank r.
  z = np.asarray(params.tool_embeddings)
  u, s, vt = np.linalg.svd(np.asarray(params.interactions[-1], np.float64))
  mm = ((u[:, :8] * s[:8]) @ vt[:8]).astype(np.float32)
  keyed = z[None, :K1] @ mm                                            # [1, K1, D]
  g = np.max(keyed[0] @ z.T, axis=0)
  np.testing.assert_array_equal(index.lowrank_search(keyed, mm, 20)[0],
                                np.argsort(-g, kind="stable")[:20])


def test_lowrank_factor_is_kept_per_interaction_matrix():
  params = random_params()
  index = ann.build(params.tool_embeddings, ann.Settings(expansion="lowrank", expansion_rank=4))
  m2, m3 = (np.asarray(m) for m in params.interactions)
  vr, y = index.lowrank_factor(m3)
  assert vr.shape == (D, 4) and y.shape == (N, 4)
  assert index.lowrank_factor(m3.copy())[1] is y  # the same M_M: made once
  assert index.lowrank_factor(m2)[1] is not y and len(index._factors) == 2
  # A prediction with M = 2 uses M_2's factor (prepare truncates θ to M_2).
  prep = pipeline.prepare(params, max_size=2, k_pool=K)
  pipeline.predict_batched(prep, queries(params, q=4), k1=K1, k_pool=K, max_size=2,
                           first_stage=index)
  assert len(index._factors) == 2
  with pytest.raises(ValueError, match="Z"):
    ann.Index(index.index, index.settings, N, D).lowrank_factor(m3)
  with pytest.raises(ValueError, match="'expansion'.*'graph'"):
    ann.build(params.tool_embeddings, ann.Settings(expansion="graph"))
  with pytest.raises(ValueError, match="'index'.*ivf_sq8.*'ivf_pq'"):
    ann.build(params.tool_embeddings, ann.Settings(index="ivf_pq"))


def test_untrained_model_is_the_dense_retriever():
  # M_M = 0: every g ties, and the expansion follows ℓ — the exact path's contract.
  params = random_params(scale=0.0)
  index = ann.build(params.tool_embeddings, ann.Settings(index="flat"))
  exact, approx = both(params, queries(params), index)
  assert_same(exact, approx)
  ell = queries(params) @ np.asarray(params.projection) @ np.asarray(params.tool_embeddings).T
  np.testing.assert_array_equal(approx.shortlist, np.argsort(-ell, axis=1, kind="stable")[:, :K])


def test_index_returning_nothing_still_gives_a_shortlist():
  # An index that finds nothing (-1 everywhere): the filler rows keep the shortlist whole and
  # duplicate-free, ordered as the exact path orders those tools.
  params = random_params()

  class Empty(ann.Index):
    def search(self, x, k, expansion=False):
      return np.full(np.shape(x)[:-1] + (k,), -1, np.int32)

  index = Empty(None, ann.Settings(), N, D)
  prep = pipeline.prepare(params, max_size=M, k_pool=K)
  pred = pipeline.predict_batched(prep, queries(params), k1=K1, k_pool=K, max_size=M,
                                  first_stage=index)
  assert all(len(set(row)) == K and set(row) <= set(range(K)) for row in pred.shortlist.tolist())


def test_filters_and_lexical_scores_run_the_exact_path():
  params = random_params()

  class Counting(ann.Index):
    calls = 0

    def search(self, x, k, expansion=False):
      Counting.calls += 1
      return super().search(x, k, expansion)

  built = ann.build(params.tool_embeddings, ann.Settings(index="flat"))
  index = Counting(built.index, built.settings, N, D)
  x = queries(params, q=8)
  allowed = np.random.default_rng(3).random((8, N)) < 0.5
  exact, approx = both(params, QueryInputs(x, allowed=allowed), index, batch_size=8)
  assert_same(exact, approx)
  lexical = params._replace(lexical_weight=0.5)
  scores = np.random.default_rng(4).random((8, N)).astype(np.float32)
  assert_same(*both(lexical, QueryInputs(x, scores), index, batch_size=8))
  assert Counting.calls == 0
  both(params, x, index, batch_size=8)
  assert Counting.calls == 2  # stage 1 and the expansion, one compiled batch
  assert ann.for_model(lexical, ann.Settings(), log=lambda m: None) is None


def test_cache_reads_what_it_wrote_and_rebuilds_a_bad_file(tmp_path):
  params = random_params()
  z = np.asarray(params.tool_embeddings)
  settings = ann.Settings(ef_construction=20)
  first = ann.load_or_build(z, settings, tmp_path)
  files = list(tmp_path.glob("ann-*.faiss"))
  assert len(files) == 1 and first.build_s is not None
  again = ann.load_or_build(z, settings, tmp_path)
  assert again.build_s is None  # read, not built
  x = queries(params)
  np.testing.assert_array_equal(again.search(x, 10), first.search(x, 10))
  # The search effort is not part of the key; the graph's parameters and Z are.
  assert ann.load_or_build(z, dataclasses.replace(settings, ef_search=7), tmp_path).build_s is None
  ann.load_or_build(z, dataclasses.replace(settings, hnsw_m=8), tmp_path)
  ann.load_or_build(z[::-1].copy(), settings, tmp_path)
  assert len(list(tmp_path.glob("ann-*.faiss"))) == 3
  files[0].write_bytes(b"not an index")
  rebuilt = ann.load_or_build(z, settings, tmp_path)
  assert rebuilt.build_s is not None and rebuilt.index.ntotal == N
  # IVF: nlist is part of the key, nprobe and the expansion's effort are not.
  ivf = ann.Settings(index="ivf", nlist=4)
  built = ann.load_or_build(z, ivf, tmp_path)
  assert built.build_s is not None and len(list(tmp_path.glob("ann-*.faiss"))) == 4
  read = ann.load_or_build(z, dataclasses.replace(ivf, nprobe=2, expansion_effort=4), tmp_path)
  assert read.build_s is None and read.index.nlist == 4
  np.testing.assert_array_equal(read.search(x, 10, expansion=True), built.search(x, 10))
  ann.load_or_build(z, dataclasses.replace(ivf, nlist=8), tmp_path)
  assert len(list(tmp_path.glob("ann-*.faiss"))) == 5
  # IVF-SQ8: its own file beside IVF-Flat's of the same nlist, read back as 8-bit codes.
  sq8 = dataclasses.replace(ivf, index="ivf_sq8")
  built = ann.load_or_build(z, sq8, tmp_path)
  assert built.build_s is not None and len(list(tmp_path.glob("ann-*.faiss"))) == 6
  read = ann.load_or_build(z, dataclasses.replace(sq8, nprobe=4, candidates=9), tmp_path)
  assert read.build_s is None and read.index.nlist == 4 and read.index.code_size == D
  np.testing.assert_array_equal(read.search(x, 10), built.search(x, 10))


def test_settings_match_the_manifest_parameters():
  fields = {f.name for f in dataclasses.fields(ann.Settings)}
  assert fields == set(model_format.FIRST_STAGE_PARAMETERS)
  assert model_format.FIRST_STAGE_PARAMETERS["index"] == ann.INDEXES
  assert ann.settings(None) is None
  assert ann.settings({"kind": "ann", "ef_search": 9}).ef_search == 9
  assert ann.settings({"kind": "ann"}, "exact") is None
  assert ann.settings(None, "ann") == ann.Settings()


# --------------------------------------------------------------------------- model directory, CLI


def same_rows(a, b):
  """Prediction rows equal, set scores to 1e-5 (ℓ = (Pᵀq)ᵀz here, q(P Zᵀ) there)."""
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x["set_score"] == pytest.approx(y["set_score"], abs=1e-5)
    assert {**x, "set_score": 0} == {**y, "set_score": 0}


def save_model(path, first_stage=None):
  params = random_params(n=60)
  params = HysetParams(*(np.asarray(a) if a is not None else None for a in params))
  model = modeldir.ModelDir(params, tuple(f"t{i}" for i in range(60)), M, K1, K, None,
                            first_stage=first_stage)
  modeldir.save_model_dir(path, model)
  return params


def predict(tmp_path, model, *flags):
  out = tmp_path / f"pred{len(list(tmp_path.glob('pred*')))}.jsonl"
  code = cli.main(["predict", "--model", str(model), "--query-embeddings",
                   str(tmp_path / "q.npy"), "--out", str(out), *flags])
  return code, [json.loads(line) for line in out.read_text().splitlines()] if code == 0 else None


def test_per_model_opt_in_through_the_manifest_and_the_flag(tmp_path):
  model = tmp_path / "model"
  params = save_model(model, {"kind": "ann", "index": "flat"})
  assert json.loads((model / "manifest.json").read_text())["first_stage"] == {
      "kind": "ann", "index": "flat"}
  assert modeldir.load_model_dir(model).first_stage == {"kind": "ann", "index": "flat"}
  np.save(tmp_path / "q.npy", queries(params, q=6))
  cache = tmp_path / "model.cache"
  code, exact = predict(tmp_path, model, "--first-stage", "exact")
  assert code == 0 and not list(cache.glob("ann-*"))
  code, approx = predict(tmp_path, model)  # the manifest's choice: ann, flat index
  assert code == 0 and len(list(cache.glob("ann-*.faiss"))) == 1
  same_rows(approx, exact)  # the flat index: the exact answers
  # A model that records nothing runs exact; --first-stage ann opts it in (default HNSW).
  plain = tmp_path / "plain"
  save_model(plain)
  assert modeldir.load_model_dir(plain).first_stage is None
  assert "first_stage" not in json.loads((plain / "manifest.json").read_text())
  code, rows = predict(tmp_path, plain, "--first-stage", "ann")
  assert code == 0 and len(rows) == 6 and list((tmp_path / "plain.cache").glob("ann-*.faiss"))


def test_ivf_sq8_through_the_manifest(tmp_path):
  # 60 tools: one list, every tool a candidate — the exact answers from the 8-bit index.
  model = tmp_path / "model"
  params = save_model(model, {"kind": "ann", "index": "ivf_sq8", "nprobe": 8})
  assert modeldir.load_model_dir(model).first_stage == {"kind": "ann", "index": "ivf_sq8",
                                                        "nprobe": 8}
  np.save(tmp_path / "q.npy", queries(params, q=6))
  code, exact = predict(tmp_path, model, "--first-stage", "exact")
  assert code == 0
  code, approx = predict(tmp_path, model)
  assert code == 0 and len(list((tmp_path / "model.cache").glob("ann-*.faiss"))) == 1
  same_rows(approx, exact)


@pytest.mark.parametrize("value,needle", [
    ("fast", "first_stage"),
    (5, "first_stage"),
    ({"kind": "approximate"}, "kind 'approximate'"),
    ({"kind": "ann", "ef_search": 0}, "'ef_search' must be an integer ≥ 1"),
    ({"kind": "ann", "candidates": 2.5}, "'candidates' must be an integer"),
    ({"kind": "ann", "hnsw_m": True}, "'hnsw_m' must be an integer"),
    ({"kind": "ann", "index": "ivfpq"}, "'index' is 'ivfpq'"),
    ({"kind": "ann", "nbits": 4}, "unknown parameter(s) 'nbits'"),
    ({"kind": "ann", "nprobe": 0}, "'nprobe' must be an integer ≥ 1"),
    ({"kind": "ann", "index": "ivf_sq8", "nprobe": 0}, "'nprobe' must be an integer ≥ 1"),
    ({"kind": "ann", "index": "ivf_sq8", "nlist": "4k"}, "'nlist' must be an integer"),
    ({"kind": "ann", "expansion_effort": -1}, "'expansion_effort' must be an integer ≥ 0"),
    ({"kind": "ann", "expansion": "graph"}, "'expansion' is 'graph'"),
    ({"kind": "ann", "expansion_rank": 0}, "'expansion_rank' must be an integer ≥ 1"),
    ({"kind": "exact", "ef_search": 4}, "exact but sets ANN parameters"),
])
def test_bad_first_stage_is_refused_naming_the_field(tmp_path, capsys, value, needle):
  model = tmp_path / "model"
  params = save_model(model)
  manifest = json.loads((model / "manifest.json").read_text())
  (model / "manifest.json").write_text(json.dumps(manifest | {"first_stage": value}))
  np.save(tmp_path / "q.npy", queries(params, q=2))
  code, _ = predict(tmp_path, model)
  assert code == 2
  err = capsys.readouterr().err
  assert "first_stage" in err and needle in err


@pytest.mark.parametrize("value", ["exact", {"kind": "exact"}, None])
def test_exact_spellings(tmp_path, value):
  model = tmp_path / "model"
  save_model(model)
  manifest = json.loads((model / "manifest.json").read_text())
  (model / "manifest.json").write_text(json.dumps(manifest | {"first_stage": value}))
  assert modeldir.load_model_dir(model).first_stage is None


def test_serving_retriever_with_the_index(tmp_path):
  from hyset_jax.data.tooltext import definition
  from hyset_jax.serve.retriever import Options, Retriever
  save_model(tmp_path / "model", {"kind": "ann", "index": "flat"})
  model = modeldir.load_model_dir(tmp_path / "model")
  defs = [definition(t, None, None) for t in model.tool_ids]
  settings = ann.settings(model.first_stage)
  served = Retriever(model, lambda texts: None, defs, first_stage=settings, cache_dir=tmp_path)
  plain = Retriever(model, lambda texts: None, defs)
  x = queries(model.params, q=5)
  options = Options(M, K, "greedy")
  same_rows(served.predict(x, options), plain.predict(x, options))
  assert served.prepared(M).neighbors is None and plain.prepared(M).neighbors is not None
  index = served.ann_index()
  assert index is served.ann_index() and list(tmp_path.glob("ann-*.faiss"))
  assert served.with_library(model, defs).first_stage == settings
  # A filtered request runs the exact first stage (scanning: no neighbour table here).
  allowed = np.zeros((5, 60), bool)
  allowed[:, :30] = True
  same_rows(served.predict(x, options, allowed=allowed),
            plain.predict(x, options, allowed=allowed))
