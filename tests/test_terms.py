"""The term registry's conformance matrix: every registered model term (and none, and all at once)
through every place a model goes — the model directory, the npz export, the NumPy reference,
StableHLO, ONNX, ``hyset serve``'s retriever and ``hyset tools add|remove`` — each giving
``hyset predict``'s answers. The matrix is built from :data:`hyset_jax.model.terms.REGISTRY`, so a new
term that lacks a maker or a view here, or that a consumer drops, fails it. Also the one format
converter: ``hyset/1`` … ``hyset/4`` directories keep loading, and a ``hyset/5`` manifest naming a
term this version does not know is refused by name."""
import dataclasses
import json

import jax
import numpy as np
import pytest

from hyset_jax.inference import pipeline
from hyset_jax.io import export, model_format, modeldir, reference, tooledit
from hyset_jax.model import parameters, terms
from hyset_jax.errors import UserError
from hyset_jax.model.lexical import LexicalIndex
from hyset_jax.model.scoring import Abstention

from test_lexical import TEXTS, WORDS
from test_model_extensions import random_params
from test_set_prior import prior_in_shortlists

N, D, M, K1, K = 14, 6, 3, 4, 8
RANKING = "set-mean"  # every term allows it
QUERIES = np.random.default_rng(7).normal(size=(4, D)).astype(np.float32)
QUERY_TEXTS = [WORDS[2] + " and " + WORDS[11], WORDS[6], "area of a square", "zzz"]


def _base():
  return random_params(np.random.default_rng(11), n=N, d=D, max_size=M)


# How each term is switched on in a small random model: (params, lexical index) -> the same.
MAKERS = {
    "tower": lambda p, lex: (p._replace(tower=_base().tower), lex),
    "conditioned": lambda p, lex: (p._replace(conditioned=_base().conditioned), lex),
    "prior": lambda p, lex: (p._replace(prior=prior_in_shortlists(p, QUERIES, sets=12)), lex),
    "lexical": lambda p, lex: (p._replace(lexical_weight=np.float32(6)), LexicalIndex(TEXTS)),
    "set_weight": lambda p, lex: (p._replace(set_weight=np.float32(SET_WEIGHT)), lex),
    "abstain": lambda p, lex: (p._replace(abstain=_half_abstain()), lex),
    "row_blend": lambda p, lex: (_half_blend(p), lex),
}
SET_WEIGHT = 0.0  # the set term off: some best sets change (checked below)


def _half_abstain() -> Abstention:
  """A no-tool classifier with τ at the median of u over QUERIES: half of them abstain."""
  w = np.random.default_rng(5).normal(size=D).astype(np.float32)
  u = QUERIES @ w + np.float32(0.5)
  return Abstention(w, np.float32(0.5), np.float32(np.median(u)))


def _half_blend(p):
  """Z halfway to other unit rows (as the blend toward encoder rows leaves it), the trained Z
  kept in the term: every answer changes with Z."""
  from hyset_jax.model.scoring import RowBlend
  other = np.random.default_rng(9).normal(size=np.shape(p.tool_embeddings))
  other /= np.linalg.norm(other, axis=1, keepdims=True)
  z = np.asarray(p.tool_embeddings) + other
  z = (z / np.linalg.norm(z, axis=1, keepdims=True)).astype(np.float32)
  return p._replace(tool_embeddings=z, row_blend=RowBlend(np.asarray(p.tool_embeddings),
                                                          np.float32(0.5)))
VARIANTS = ["none", *terms.REGISTRY, "all"]


def build(variant: str) -> modeldir.ModelDir:
  params, lex = _base()._replace(tower=None, conditioned=None), None
  names = terms.REGISTRY if variant == "all" else [] if variant == "none" else [variant]
  # The blend last: the prior's sets are drawn from the shortlists of the unblended Z (so that
  # one of them holds the tool the edits below remove).
  for name in sorted(names, key=lambda n: n == "row_blend"):
    params, lex = MAKERS[name](params, lex)
  return modeldir.ModelDir(parameters.host_params(params), tuple(f"t{i}" for i in range(N)), M, K1,
                           K, None, ranking=RANKING, lexical=lex)


def want(md: modeldir.ModelDir, ranking: str = RANKING):
  return pipeline.predict_batched(md.params, md.query_inputs(QUERIES, QUERY_TEXTS), k1=K1,
                                   k_pool=K, max_size=M, ranking=ranking)


def ids_of(md, rows):
  return [[md.tool_ids[t] for t in r if t >= 0] for r in np.asarray(rows)]


# A view of each term keyed by tool id rather than row, to check that edits keep it on its tools.
VIEWS = {
    "tower": lambda md: [a.tolist() for a in md.params.tower],
    "conditioned": lambda md: [a.tolist() for a in md.params.conditioned],
    "prior": lambda md: None if md.params.prior is None else {
        frozenset(md.tool_ids[t] for t in row if t >= 0): (w.tolist(), float(b))
        for row, w, b in zip(md.params.prior.members, md.params.prior.w, md.params.prior.b)},
    "lexical": lambda md: dict(zip(md.tool_ids, md.lexical.tool_texts)),
    "set_weight": lambda md: float(md.params.set_weight),
    "abstain": lambda md: [np.asarray(a).tolist() for a in md.params.abstain],
    "row_blend": lambda md: (dict(zip(md.tool_ids, md.params.row_blend.trained.tolist())),
                             float(md.params.row_blend.alpha)),
}


def without(name: str, view, tool: str):
  """What ``view`` of term ``name`` should be once ``tool`` is removed."""
  if name == "prior":
    return {s: v for s, v in view.items() if tool not in s} or None
  if name == "lexical":
    return {t: v for t, v in view.items() if t != tool}
  if name == "row_blend":
    return {t: v for t, v in view[0].items() if t != tool}, view[1]
  return view


def test_the_matrix_covers_every_registered_term():
  assert tuple(terms.REGISTRY) == model_format.TERMS
  assert set(MAKERS) == set(VIEWS) == set(terms.REGISTRY)
  for name in terms.REGISTRY:
    assert build(name).terms == (name,)
  assert build("all").terms == tuple(terms.REGISTRY)
  assert reference.RANKINGS == pipeline.RANKINGS  # the reference cannot import choices
  # Abstention's cells compare something: half the queries get the empty set, half a set.
  for variant in ("abstain", "all"):
    assert sorted(np.asarray(want(build(variant)).set_size) == 0) == [False, False, True, True]
  # The set weight's cells too: γ changes some of the best sets and every set score.
  plain, weighted = want(build("none")), want(build("set_weight"))
  assert not np.array_equal(plain.set_tools, weighted.set_tools)
  assert not np.any(np.isclose(plain.set_score, weighted.set_score))


@pytest.mark.parametrize("variant", VARIANTS)
def test_model_directory_npz_and_reference(variant, tmp_path):
  md = build(variant)
  modeldir.save_model_dir(tmp_path / "m", md)
  manifest = json.loads((tmp_path / "m" / "manifest.json").read_text())
  assert manifest["format"] == modeldir.FORMAT and manifest["terms"] == list(md.terms)
  back = modeldir.load_model_dir(tmp_path / "m")
  assert back.terms == md.terms
  for a, b in zip(jax.tree.leaves(md.params), jax.tree.leaves(back.params)):
    np.testing.assert_array_equal(a, b)
  export.write_npz(tmp_path / "npz", back)
  lex = md.lexical_scores(QUERY_TEXTS)
  for source in (tmp_path / "m", tmp_path / "npz"):
    ref = reference.load_model(source)
    assert ref.terms == md.terms
    for ranking in terms.allowed_rankings(md.params):
      got, rows = want(md, ranking), reference.predict(ref, QUERIES, ranking=ranking, lexical=lex)
      assert [r["set"] for r in rows] == ids_of(md, got.set_tools), (source, ranking)
      assert [r["ranking"] for r in rows] == ids_of(md, got.ranking), (source, ranking)
      np.testing.assert_allclose([r["set_score"] for r in rows], got.set_score, atol=1e-4)
    for ranking in set(pipeline.RANKINGS) - set(terms.allowed_rankings(md.params)):
      with pytest.raises(reference.ModelError, match=f"ranking {ranking!r}"):
        reference.predict(ref, QUERIES, ranking=ranking, lexical=lex)


# Compiling and converting is what costs here (about 15 s a variant): "all" carries every
# term through both exports, "none" is the paper's model.
@pytest.mark.heavy
@pytest.mark.parametrize("variant", ["none", "all"])
def test_stablehlo_and_onnx(variant, tmp_path):
  import onnxruntime as ort
  from jax import export as jax_export
  from hyset_jax.io.export_onnx import write_onnx
  md = build(variant)
  got, lex = want(md), md.lexical_scores(QUERY_TEXTS)
  extra = () if lex is None else (lex,)
  export.write_stablehlo(tmp_path / "s", md, platforms=("cpu",))
  fn = jax_export.deserialize(bytearray((tmp_path / "s" / "predict.jax_exported").read_bytes()))
  out = dict(zip(("shortlist", "set_tools", "set_size", "set_score", "ranking"),
                 fn.call(QUERIES, *extra)))
  np.testing.assert_array_equal(out["set_tools"], got.set_tools)
  np.testing.assert_array_equal(out["ranking"], got.ranking)
  write_onnx(tmp_path / "o", md, batch=len(QUERIES))
  run = lambda name, feed: ort.InferenceSession(
      str(tmp_path / "o" / name), providers=["CPUExecutionProvider"]).run(None, feed)
  shortlist, logits = run("stage1.onnx", {"query_embeddings": QUERIES}
                          | ({} if lex is None else {"lexical_scores": lex}))
  set_tools, _, _, ranking = run("stage2.onnx", {"query_embeddings": QUERIES,
                                                 "shortlist": shortlist,
                                                 "shortlist_logits": logits})
  np.testing.assert_array_equal(shortlist, got.shortlist)
  np.testing.assert_array_equal(set_tools, got.set_tools)
  np.testing.assert_array_equal(ranking, got.ranking)


@pytest.mark.parametrize("variant", VARIANTS)
def test_serve_retriever(variant):
  from hyset_jax.serve.retriever import Retriever, definition
  md = build(variant)
  rows_of = {t: i for i, t in enumerate(QUERY_TEXTS)}
  r = Retriever(md, lambda texts: QUERIES[[rows_of[t] for t in texts]],
                [definition(t, None, None) for t in md.tool_ids], max_batch=4)
  assert r.rankings == terms.allowed_rankings(md.params)
  (rows,) = r.retrieve_batch([(QUERY_TEXTS, r.options())])
  got = want(md)
  assert [row["set"] for row in rows] == ids_of(md, got.set_tools)
  assert [row["ranking"] for row in rows] == ids_of(md, got.ranking)


@pytest.mark.parametrize("variant", VARIANTS)
def test_tools_add_and_remove_keep_every_term_on_its_tools(variant):
  md = build(variant)
  rng = np.random.default_rng(2)
  # Adding tools and removing them again is the identity, answers included.
  added = tooledit.add_tools(md, ["new0", "new1"], rng.normal(size=(2, D)),
                             texts=["brand new tool", "another new tool"])
  assert added.terms == md.terms
  back = tooledit.remove_tools(added, ["new0", "new1"])
  for name in md.terms:
    assert VIEWS[name](back) == VIEWS[name](md), name
  got, again = want(md), want(back)
  assert ids_of(back, again.set_tools) == ids_of(md, got.set_tools)
  assert ids_of(back, again.ranking) == ids_of(md, got.ranking)
  # Removing a tool in the middle keeps each term on its tools, by id.
  gone = md.tool_ids[5]
  if md.params.prior is not None:  # make sure a prior set holds the removed tool
    assert any(5 in row for row in md.params.prior.members.tolist())
  edited = tooledit.remove_tools(md, [gone])
  modeldir.validate(edited)
  for name in md.terms:
    assert VIEWS[name](edited) == without(name, VIEWS[name](md), gone), name


def test_tools_add_needs_the_texts_a_term_keeps():
  md = build("lexical")
  with pytest.raises(UserError, match="new tools' texts are needed"):
    tooledit.add_tools(md, ["new0"], np.ones((1, D)))


# --------------------------------------------------------------------------- the converter

LEGACY = {"hyset/1": (), "hyset/2": ("tower", "conditioned"), "hyset/3": ("prior",),
          "hyset/4": ("lexical",)}


@pytest.mark.parametrize("fmt", sorted(LEGACY))
def test_older_formats_load_through_the_converter(fmt, tmp_path):
  md = build("all")
  keep = LEGACY[fmt] + (("tower", "conditioned") if fmt != "hyset/1" else ())
  params = md.params._replace(**{t.field: None for t in terms.REGISTRY.values()
                                 if t.name not in keep})
  md = dataclasses.replace(md, params=params, lexical=md.lexical if "lexical" in keep else None,
                           ranking=None if fmt == "hyset/1" else RANKING)
  modeldir.save_model_dir(tmp_path / "m", md)
  mpath = tmp_path / "m" / "manifest.json"
  manifest = json.loads(mpath.read_text())
  del manifest["terms"]
  if fmt == "hyset/1":
    del manifest["ranking"]
  mpath.write_text(json.dumps(dict(manifest, format=fmt)))
  for load in (modeldir.load_model_dir, reference.load_model):
    assert load(tmp_path / "m").terms == md.terms, load
  back = modeldir.load_model_dir(tmp_path / "m")
  for a, b in zip(jax.tree.leaves(md.params), jax.tree.leaves(back.params)):
    np.testing.assert_array_equal(a, b)
  if fmt != "hyset/4":  # a term the version could not hold is refused by name
    later = next(t for t in ("prior", "lexical") if t not in model_format.SCHEMA["legacy"][fmt]
                 ["terms"])
    mpath.write_text(json.dumps(dict(manifest, format=fmt, terms=[later])))
    params = modeldir.tensors(build(later).params, M)
    from safetensors.numpy import save_file
    save_file(params, str(tmp_path / "m" / "params.safetensors"))
    for load, error in ((modeldir.load_model_dir, UserError),
                        (reference.load_model, reference.ModelError)):
      with pytest.raises(error, match=f"belongs to the {later} term.*says {fmt!r}"):
        load(tmp_path / "m")


def test_format_5_refuses_unknown_missing_and_unlisted_terms(tmp_path):
  from safetensors.numpy import load_file, save_file
  modeldir.save_model_dir(tmp_path / "m", build("prior"))
  mpath, ppath = tmp_path / "m" / "manifest.json", tmp_path / "m" / "params.safetensors"
  manifest, tensors = json.loads(mpath.read_text()), load_file(str(ppath))
  mpath.write_text(json.dumps(dict(manifest, terms=["prior", "telepathy"])))
  with pytest.raises(UserError, match="'telepathy', a term this version does not know"):
    modeldir.load_model_dir(tmp_path / "m")
  mpath.write_text(json.dumps(dict(manifest, terms=[])))
  with pytest.raises(UserError, match="'prior_b'.*belongs to the prior term, which the manifest "
                                      "does not list"):
    modeldir.load_model_dir(tmp_path / "m")
  mpath.write_text(json.dumps(manifest))
  save_file({k: v for k, v in tensors.items() if k != "prior_w"}, str(ppath))
  with pytest.raises(UserError, match="missing tensor 'prior_w' \\(the prior term needs all"):
    modeldir.load_model_dir(tmp_path / "m")
  save_file(dict(tensors, prior_w=tensors["prior_w"][:, :2].copy()), str(ppath))
  with pytest.raises(reference.ModelError,
                     match="'prior_w' must be \\[12, 6\\] \\(\\[S, d_r\\]\\)"):
    reference.load_model(tmp_path / "m")
  save_file(tensors, str(ppath))
  mpath.write_text(json.dumps(dict(manifest, ranking="greedy")))
  with pytest.raises(UserError, match="'ranking' is 'greedy'.*prior term needs one of logit"):
    modeldir.load_model_dir(tmp_path / "m")
