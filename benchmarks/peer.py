"""The HYSET authors' PyTorch implementation beside this one: the same answers, and the speed.

  python -m benchmarks.peer --peer DIR [--quick] [--queries 20] [--trained WORKDIR]

DIR is a checkout of the authors' repository (GitHub stormwther18/HYSET).

For each model — two small random ones (200 tools, d = 32; in the second, best sets of every
size), without ``--quick`` a random one at the paper's scale (13,860 tools, d = 768), all
K1 = 15, K_pool = 20, M = 5, and with ``--trained`` the best model of a ``hyset train`` workdir
(e.g. ``--config paper``; its own K1, K_pool, M) on its data set's test queries — it:

1. writes the model directory and exports it with ``hyset export --format hyset-pytorch``;
2. runs the authors' scorer on that checkpoint and the query embeddings, one query at a time
   (``benchmarks/peer_torch.py`` in the peer's environment, importing their
   ``src/hyset_model.py`` from ``--peer`` at run time);
3. runs ours, ``pipeline.predict_batched(..., ranking="greedy")`` — what
   ``hyset predict --ranking greedy`` runs — on the same parameters and queries;
4. reports per query whether the shortlist (in order), the best set, its score (within 1e-4
   relative, absolute below 1) and the greedy ranking of length M agree, and explains each
   difference by the float64 scores of the two choices (a gap at float32 rounding is a tie).

Timing (paper scale only): the authors' seconds per query, ours per query at batch 1 and at
batch 64 on the prepared model (the neighbour table built once, as ``hyset predict`` does),
timed once before and once after the authors' run (both in the medians: a shared machine's
speed drifts over the minute theirs takes), and the ratios.

Training (paper scale; ``--quick``: the small model at batch 8): the authors' training loop
(``benchmarks/peer_torch_train.py``: their ``NegativeSampler``, ``score_candidate_sets``, AdamW)
and ours (``benchmarks/peer_train.py``: ``hyset train``'s ``make_batch`` and jitted step), each
in its own process, on the same starting Z, queries and gold sets (sizes 1..5), K_neg = 64, at
each ``--train-batches`` size, in ``--train-rounds`` alternating rounds (theirs, ours, theirs,
ours): seconds per step after warm-up (the median over every round's steps), queries per
second, peak RSS, and the per-example ratio. Results: ``benchmarks/results/peer.json`` and
``.md`` (``--quick``: stdout only).

Both sides run in the memory environment ``hyset`` gives itself (``hyset_jax/allocator.py``:
transparent huge pages where the kernel serves them): the benchmark re-executes itself the same
way and its children inherit it; the report says which.

The peer's environment is ``benchmarks/.venv-peer`` (``--python`` names another interpreter);
it needs torch and numpy only::

  python3 -m venv benchmarks/.venv-peer
  benchmarks/.venv-peer/bin/pip install torch==2.13.0 numpy   # the CPU wheel; torch is ~1 GB

The project's own environment never gets torch: the checkpoint is written by
:mod:`hyset_jax.io.peer.torch_format` without it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks import provenance

REPO = pathlib.Path(__file__).resolve().parents[1]
PEER_VENV = REPO / "benchmarks" / ".venv-peer"
RUNNER = REPO / "benchmarks" / "peer_torch.py"
RESULTS = REPO / "benchmarks" / "results"
SMALL = {"name": "small", "n_tools": 200, "dim": 32, "k1": 15, "k_pool": 20, "max_size": 5}
# The same, with pair terms that make best sets of every size 1..5 (the other two: always 5).
SMALL_MIXED = {**SMALL, "name": "small-mixed", "pair_scale": 0.15, "pair_decay": 1.0}
PAPER = {"name": "paper", "n_tools": 13_860, "dim": 768, "k1": 15, "k_pool": 20, "max_size": 5}
SCORE_RTOL = 1e-4
TIE_RTOL = 1e-5   # two choices whose float64 scores are this close are a float32 tie
SPEED_BATCH = 64
SPEED_REPS = 10   # timed calls of the batch-64 leg (after one warm-up call)
TRAIN_RUNNER = REPO / "benchmarks" / "peer_torch_train.py"
TRAIN_K_NEG = 64   # both loops' default: the gold set and 63 negatives
TRAIN_HARD = 50    # the authors' --hard_neighbor_k (ours: train.hard_neighbors, set to it)


# --------------------------------------------------------------------------- models

def random_model(n_tools: int, dim: int, k1: int, k_pool: int, max_size: int, seed: int = 0,
                 pair_scale: float = 0.3, pair_decay: float = 0.0):
  """A random model of the paper's configuration (d_z = d_r = dim, no extra terms): unit rows
  Z, P with unit-scale logits, symmetric M_m whose pair terms z_aᵀ M_m z_b have standard
  deviation pair_scale / (m − 1)^pair_decay. At 0.3 and decay 0 (the paper-scale run) the
  best set always has M tools; 0.15 and decay 1 give best sets of every size."""
  from hyset_jax.io.modeldir import ModelDir
  from hyset_jax.model.scoring import HysetParams
  rng = np.random.default_rng(seed)
  z = rng.standard_normal((n_tools, dim)).astype(np.float32)
  z /= np.linalg.norm(z, axis=1, keepdims=True)
  p = (rng.standard_normal((dim, dim)) / np.sqrt(dim)).astype(np.float32)
  ms = []
  for m in range(2, max_size + 1):
    # z_aᵀ A z_b ~ N(0, scale²) for unit z and a standard normal A.
    a = rng.standard_normal((dim, dim)).astype(np.float32) * np.float32(
        pair_scale / (m - 1) ** pair_decay)
    ms.append((0.5 * (a + a.T)).astype(np.float32))
  params = HysetParams(z, p, np.stack(ms))
  ids = tuple(f"tool_{i}" for i in range(n_tools))
  return ModelDir(params, ids, max_size, k1, k_pool, None, ranking="greedy")


def random_queries(n: int, dim: int, seed: int = 1) -> np.ndarray:
  """Query embeddings: unit-variance entries, so ℓ is of unit scale against P's rows."""
  return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


# --------------------------------------------------------------------------- the two sides

def peer_python(explicit: str | None = None) -> pathlib.Path | None:
  """The peer environment's interpreter, if it exists and has torch; else None."""
  python = pathlib.Path(explicit) if explicit else PEER_VENV / "bin" / "python"
  if not python.is_file():
    return None
  ok = subprocess.run([str(python), "-c", "import torch, numpy"], capture_output=True)
  return python if ok.returncode == 0 else None


def export_checkpoint(model, work: pathlib.Path) -> pathlib.Path:
  """``hyset export --format hyset-pytorch`` of ``model``: the path of its best.pt."""
  from hyset_jax import cli
  from hyset_jax.io.modeldir import save_model_dir
  save_model_dir(work / "model", model)
  rc = cli.main(["export", "--workdir", str(work / "model"), "--out", str(work / "export"),
                 "--format", "hyset-pytorch"])
  if rc != 0:
    raise RuntimeError(f"hyset export --format hyset-pytorch failed (exit {rc})")
  return work / "export" / "best.pt"


def run_peer(python: pathlib.Path, peer: pathlib.Path, ckpt: pathlib.Path,
             queries: np.ndarray, k1: int, k_pool: int, work: pathlib.Path,
             device: str = "cpu") -> dict:
  """The authors' scorer on ``ckpt`` (torch ``device``): peer_torch.py's JSON."""
  qpath, out = work / "peer_queries.npy", work / "peer_out.json"
  np.save(qpath, queries)
  cmd = [str(python), str(RUNNER), "--peer", str(peer), "--checkpoint", str(ckpt),
         "--queries", str(qpath), "--k1", str(k1), "--k-pool", str(k_pool), "--device", device,
         "--out", str(out)]
  done = subprocess.run(cmd, capture_output=True, text=True)
  if done.returncode != 0:
    raise RuntimeError(f"the authors' scorer failed:\n{done.stderr[-3000:]}")
  return json.loads(out.read_text(encoding="utf-8"))


def run_ours(model, queries: np.ndarray, batch_size: int = 64, prepared=None):
  """``hyset predict --ranking greedy``'s library call: Prediction of NumPy arrays."""
  from hyset_jax.inference import pipeline
  return pipeline.predict_batched(
      prepared if prepared is not None else model.params, queries, k1=model.k1,
      k_pool=model.k_pool, max_size=model.max_set_size, batch_size=batch_size,
      ranking="greedy")


# --------------------------------------------------------------------------- agreement

def _f64(model):
  p = model.params
  return (np.asarray(p.tool_embeddings, np.float64), np.asarray(p.projection, np.float64),
          np.asarray(p.interactions, np.float64))


def set_score64(model, query: np.ndarray, members) -> float:
  """F(x, E) in float64 (the arbiter of near-ties)."""
  z, p, ms = _f64(model)
  e = sorted(int(t) for t in members)
  logits = z[e] @ p.T @ query.astype(np.float64)
  w = np.exp(logits - logits.max())
  f = float((w / w.sum()) @ logits)
  if len(e) >= 2:
    g = z[e] @ ms[len(e) - 2] @ z[e].T
    f += float(np.triu(g, 1).sum())
  return f


def _expansion64(model, query: np.ndarray, s0) -> tuple[np.ndarray, np.ndarray]:
  """ℓ and g over every tool in float64, g for the given S0."""
  z, p, ms = _f64(model)
  logits = z @ p.T @ query.astype(np.float64)
  g = (z @ ms[model.max_set_size - 2] @ z[list(s0)].T).max(axis=1)
  return logits, g


def _explain(model, query, ours: dict, theirs: dict) -> list[str]:
  """Why two answers for one query differ: float64 scores of both choices, tie or not."""
  notes = []
  k1 = model.k1
  if ours["shortlist"] != theirs["shortlist"]:
    logits, g = _expansion64(model, query, theirs["shortlist"][:k1])
    a, b = ours["shortlist"], theirs["shortlist"]
    i = next(j for j in range(len(a)) if a[j] != b[j])
    key = logits if i < k1 else g
    gap = abs(key[a[i]] - key[b[i]]) / max(1e-12, abs(key[b[i]]))
    notes.append(f"shortlist differs at position {i} ({'ℓ' if i < k1 else 'g'}: tool {a[i]} "
                 f"{key[a[i]]:.9g} vs {b[i]} {key[b[i]]:.9g}, rel gap {gap:.2g}: "
                 f"{'a float32 tie' if gap < TIE_RTOL else 'NOT a tie'})")
  if set(ours["set"]) != set(theirs["set"]):
    fa, fb = set_score64(model, query, ours["set"]), set_score64(model, query, theirs["set"])
    gap = abs(fa - fb) / max(1.0, abs(fb))
    notes.append(f"best set differs: ours F64 = {fa:.9g}, theirs {fb:.9g}, rel gap {gap:.2g}: "
                 f"{'a float32 tie' if gap < TIE_RTOL else 'NOT a tie'}")
  if ours["ranking"] != theirs["ranking"]:
    a, b = ours["ranking"], theirs["ranking"]
    i = next(j for j in range(len(a)) if a[j] != b[j])
    fa = set_score64(model, query, a[:i + 1])
    fb = set_score64(model, query, b[:i] + [b[i]])
    gap = abs(fa - fb) / max(1.0, abs(fb))
    tie = "a float32 tie" if gap < TIE_RTOL else "NOT a tie"
    notes.append(f"greedy ranking differs at step {i + 1}: ours F64 = {fa:.9g}, theirs "
                 f"{fb:.9g}, rel gap {gap:.2g}: {tie}")
  return notes


def compare(model, queries: np.ndarray, pred, peer_doc: dict) -> dict:
  """Per-query agreement of our Prediction with the authors' outputs, and the counts."""
  m = model.max_set_size
  rows, counts = [], {"shortlist": 0, "set": 0, "score": 0, "ranking": 0, "all": 0}
  for q, theirs in enumerate(peer_doc["queries"]):
    ours = {"shortlist": [int(t) for t in pred.shortlist[q]],
            "set": [int(t) for t in pred.set_tools[q] if t >= 0],
            "score": float(pred.set_score[q]),
            "ranking": [int(t) for t in pred.ranking[q][:m]]}
    same = {"shortlist": ours["shortlist"] == theirs["shortlist"],
            "set": set(ours["set"]) == set(theirs["set"]),
            "score": abs(ours["score"] - theirs["score"])
            <= SCORE_RTOL * max(1.0, abs(theirs["score"])),
            "ranking": ours["ranking"] == theirs["ranking"]}
    same["all"] = all(same.values())
    for k, v in same.items():
      counts[k] += int(v)
    row = {"query": q, **same, "score_ours": ours["score"], "score_theirs": theirs["score"]}
    if not same["all"]:
      row["ours"], row["theirs"] = ours, {k: theirs[k] for k in ours}
      row["why"] = _explain(model, queries[q], ours, theirs)
    rows.append(row)
  rel = [abs(r["score_ours"] - r["score_theirs"]) / max(1.0, abs(r["score_theirs"]))
         for r in rows]
  # How many best sets of each size: the enumeration is exercised beyond singletons.
  sizes = np.bincount([len(t["set"]) for t in peer_doc["queries"]], minlength=m + 1)[1:]
  return {"queries": len(rows), "agree": counts, "max_score_rel_diff": max(rel, default=0.0),
          "best_set_sizes": {str(i + 1): int(c) for i, c in enumerate(sizes)}, "rows": rows}


def config_model(config: dict, seed: int = 0):
  """:func:`random_model` of one of the configurations above (SMALL, SMALL_MIXED, PAPER)."""
  return random_model(config["n_tools"], config["dim"], config["k1"], config["k_pool"],
                      config["max_size"], seed, config.get("pair_scale", 0.3),
                      config.get("pair_decay", 0.0))


def agreement(config: dict, peer: pathlib.Path, python: pathlib.Path, n_queries: int,
              work: pathlib.Path, seed: int = 0, device: str = "cpu", model=None) -> dict:
  """Build (or take ``model``, :func:`config_model`'s), export, run both sides and compare,
  for one model configuration."""
  model = config_model(config, seed) if model is None else model
  queries = random_queries(n_queries, config["dim"], seed + 1)
  return agreement_on(model, queries, config, peer, python, work, device)


def trained_model(path: str, n_queries: int):
  """(config row, model, query embeddings) of a ``hyset train`` workdir's best model: its
  data set's first ``n_queries`` test queries, encoded with the encoder it was trained with."""
  from hyset_jax import config as config_lib
  from hyset_jax.encoder import encode_cached, load_encoder
  from hyset_jax.errors import UserError
  from hyset_jax.io.modeldir import load_best
  from hyset_jax.training.train_data import load_config_dataset
  workdir = pathlib.Path(path)
  if not (workdir / "config.json").is_file():
    raise UserError(f"--trained {path}: not a hyset train workdir (no config.json)")
  config = config_lib.from_dict(json.loads((workdir / "config.json").read_text("utf-8")))
  _, model = load_best(workdir)
  dataset = load_config_dataset(config.data, model.max_set_size)
  texts = [q.text for q in dataset.split(config.data.test_split)[:n_queries]]
  queries = np.asarray(encode_cached(load_encoder(config.model.encoder or None), texts),
                       np.float32)
  row = {"name": f"trained ({config.name})", "n_tools": len(model.tool_ids),
         "dim": int(model.params.projection.shape[0]), "k1": model.k1, "k_pool": model.k_pool,
         "max_size": model.max_set_size, "data": config.data.spec,
         "split": config.data.test_split}
  return row, model, queries


def agreement_on(model, queries: np.ndarray, config: dict, peer: pathlib.Path,
                 python: pathlib.Path, work: pathlib.Path, device: str = "cpu") -> dict:
  """Export ``model``, run both sides on ``queries`` and compare."""
  from hyset_jax.io.peer import convert, torch_format
  ckpt = export_checkpoint(model, work)
  # What the authors score after their load, read back by our importer: how far it is from
  # the parameters we score (renormalising unit rows moves them by float32 rounding only).
  back = convert.from_payload(torch_format.read_checkpoint(ckpt), ckpt).params
  param_diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                   for a, b in zip(back[:3], model.params[:3]))
  peer_doc = run_peer(python, peer, ckpt, queries, model.k1, model.k_pool, work, device)
  pred = run_ours(model, queries)
  result = compare(model, queries, pred, peer_doc)
  result.update(model={k: v for k, v in config.items()}, param_max_abs_diff=param_diff,
                torch=peer_doc["torch"], peer_threads=peer_doc["threads"])
  return result, model, queries, peer_doc


# --------------------------------------------------------------------------- speed

def prepare_timed(model):
  """(``pipeline.prepare`` of ``model`` as ``hyset predict`` does it, its seconds)."""
  import jax
  from hyset_jax.inference import pipeline
  t0 = time.perf_counter()
  prepared = pipeline.prepare(model.params, max_size=model.max_set_size, k_pool=model.k_pool)
  jax.block_until_ready(prepared)
  return prepared, time.perf_counter() - t0


def ours_times(model, prepared, n_batch1: int, seed: int = 7) -> dict[int, list[float]]:
  """Our seconds per query of each call, by batch size: each of ``n_batch1`` queries once at
  batch 1, SPEED_REPS calls of one 64-query batch (after a warm-up call of each)."""
  queries = random_queries(max(SPEED_BATCH, n_batch1), model.params.projection.shape[0], seed)
  out = {}
  for batch, calls in ((1, n_batch1), (SPEED_BATCH, SPEED_REPS)):
    run_ours(model, queries[:batch], batch, prepared)             # compile, warm up
    out[batch] = []
    for call in range(calls):  # batch 1: each query once; batch 64: the same batch again
      rows = queries[call:call + 1] if batch == 1 else queries[:batch]
      t0 = time.perf_counter()
      run_ours(model, rows, batch, prepared)
      out[batch].append((time.perf_counter() - t0) / batch)
  return out


def speed(model, peer_doc: dict, n_batch1: int, prepared, prepare_s: float,
          before: dict[int, list[float]]) -> dict:
  """Seconds per query: the authors' (from their run), ours at batch 1 and batch 64, each the
  median over calls (the authors': their queries; ours: each query at batch 1, SPEED_REPS calls
  of one 64-query batch, timed once before the authors' run (``before``) and once after it, so
  that ours brackets theirs on a machine whose speed drifts) with the mean beside it."""
  after = ours_times(model, prepared, n_batch1)
  out = {"prepare_s": prepare_s, "ours_batch64_calls": 2 * SPEED_REPS,
         "ours_rounds": "before and after the authors' run"}
  for batch in (1, SPEED_BATCH):
    per_query = before[batch] + after[batch]
    # The median, as on the authors' side: one call slowed by another process on a shared
    # machine moves a mean of a few calls, not the median.
    out[f"ours_batch{batch}_s_per_query"] = float(np.median(per_query))
    out[f"ours_batch{batch}_s_per_query_mean"] = float(np.mean(per_query))
  theirs = [r["seconds"] for r in peer_doc["queries"]]
  # Their first query pays one-off costs (allocator, kernels): report the median and the mean.
  out["theirs_s_per_query_median"] = float(np.median(theirs))
  out["theirs_s_per_query_mean"] = float(np.mean(theirs))
  out["theirs_load_s"] = peer_doc["load_s"]
  for batch in (1, SPEED_BATCH):
    out[f"ratio_batch{batch}"] = (out["theirs_s_per_query_median"]
                                  / out[f"ours_batch{batch}_s_per_query"])
  return out


# --------------------------------------------------------------------------- training

def train_inputs(n_tools: int, dim: int, max_size: int, n_queries: int, seed: int = 11):
  """Training queries: unit-variance embeddings and gold sets of 1..M distinct random tools
  (sizes uniform), the same files for both sides."""
  rng = np.random.default_rng(seed)
  queries = rng.standard_normal((n_queries, dim)).astype(np.float32)
  sizes = rng.integers(1, max_size + 1, size=n_queries)
  gold = [sorted(int(t) for t in rng.choice(n_tools, size=int(k), replace=False))
          for k in sizes]
  return queries, gold


def _child(cmd: list[str], what: str) -> None:
  done = subprocess.run(cmd, capture_output=True, text=True)
  if done.returncode != 0:
    raise RuntimeError(f"{what} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")


def _merge_rounds(docs: list[dict]) -> dict:
  """One side's round results as one: the steps of every round (their median is the side's
  figure), the largest peak RSS, the rest from the first round."""
  out = dict(docs[0])
  for key in ("s_per_step", "pool_s_per_step"):
    out[key] = [x for d in docs for x in d[key]]
  out["peak_rss_bytes"] = max(d["peak_rss_bytes"] for d in docs)
  return out


def train_speed(config: dict, peer: pathlib.Path, python: pathlib.Path, batch: int,
                steps: int, warmup: int, work: pathlib.Path, seed: int = 0,
                device: str = "cpu", rounds: int = 2) -> dict:
  """The authors' training loop and ours, each in its own process, on the same starting Z
  (theirs from the exported checkpoint, which adds their P and M_m), queries and gold sets,
  at K_neg = 64 and ``batch``: seconds per step after ``warmup`` steps, queries per second,
  the pool-building part, peak RSS of each, and the per-example ratio. The two loops run in
  ``rounds`` alternating rounds (theirs, ours, theirs, ours, …) and each side's figure is the
  median over all its rounds' steps: on a shared machine whose speed drifts over minutes, one
  side's run alone can land in a fast spell and the other's in a slow one."""
  model = config_model(config, seed)
  queries, gold = train_inputs(config["n_tools"], config["dim"], config["max_size"],
                               batch * (warmup + steps))
  ckpt = export_checkpoint(model, work)
  paths = {k: work / f"train_{k}" for k in ("z.npy", "q.npy", "gold.json", "ours.json",
                                              "theirs.json")}
  np.save(paths["z.npy"], np.asarray(model.params.tool_embeddings, np.float32))
  np.save(paths["q.npy"], queries)
  paths["gold.json"].write_text(json.dumps(gold), encoding="utf-8")
  common = ["--queries", str(paths["q.npy"]), "--gold", str(paths["gold.json"]),
            "--batch-size", str(batch), "--steps", str(steps), "--warmup", str(warmup),
            "--k-neg", str(TRAIN_K_NEG)]
  docs = {"theirs": [], "ours": []}
  for _ in range(rounds):
    _child([str(python), str(TRAIN_RUNNER), "--peer", str(peer), "--checkpoint", str(ckpt),
            "--hard-neighbor-k", str(TRAIN_HARD), "--device", device, *common,
            "--out", str(paths["theirs.json"])],
           "the authors' training loop")
    _child([sys.executable, "-m", "benchmarks.peer_train", "--tools", str(paths["z.npy"]),
            "--max-size", str(config["max_size"]), "--hard-neighbors", str(TRAIN_HARD),
            *common, "--out", str(paths["ours.json"])], "hyset-jax's training loop")
    for side in docs:
      docs[side].append(json.loads(paths[f"{side}.json"].read_text(encoding="utf-8")))
  out = {"model": config["name"], "batch_size": batch, "k_neg": TRAIN_K_NEG,
         "hard_neighbors": TRAIN_HARD, "steps": steps, "warmup": warmup, "rounds": rounds}
  for side in ("theirs", "ours"):
    doc = _merge_rounds(docs[side])
    s = float(np.median(doc["s_per_step"]))
    out[side] = {**doc, "s_per_step_median": s, "queries_per_s": batch / s,
                 "pool_share": float(np.median(doc["pool_s_per_step"])) / s}
  out["ratio_per_example"] = out["theirs"]["s_per_step_median"] / out["ours"]["s_per_step_median"]
  out["ratio_peak_rss"] = out["theirs"]["peak_rss_bytes"] / out["ours"]["peak_rss_bytes"]
  return out


# --------------------------------------------------------------------------- report

def training_md(rows: list[dict]) -> list[str]:
  """The training leg's section: one line per side and batch size."""
  if not rows:
    return []
  r0 = rows[0]
  lines = ["", f"## Training step, {r0['model']} model (same starting Z, queries, gold sets)", "",
           f"Each loop as written, in its own process: K_neg = {r0['k_neg']} (the gold set and "
           f"50/30/20 uniform / in-batch / hard negatives, {r0['hard_neighbors']} hard "
           f"neighbours), M = {r0['ours']['max_size']}, the median of {r0['steps']} steps "
           f"after {r0['warmup']} (ours: compilation in the first)"
           + (f", in {r0['rounds']} alternating rounds (theirs, ours, theirs, …; the median "
              f"over every round's steps)" if r0.get("rounds", 1) > 1 else "")
           + ". The authors' loop: per "
           "example `build_pool` + `score_candidate_sets`, then AdamW; ours: `make_batch` + "
           "the jitted step. Peak RSS: the process's VmHWM.", "",
           "| batch | side | s per step | queries/s | building pools | peak RSS | "
           "per-example ratio |", "|---|---|---|---|---|---|---|"]
  for r in rows:
    for side, name in (("theirs", "authors' loop (torch)"), ("ours", "hyset-jax")):
      d = r[side]
      ratio = "1" if side == "theirs" else f"{r['ratio_per_example']:.3g}×"
      lines.append(f"| {r['batch_size']} | {name} | {d['s_per_step_median']:.4g} | "
                   f"{d['queries_per_s']:,.1f} | {100 * d['pool_share']:.0f}% | "
                   f"{d['peak_rss_bytes'] / 2**20:,.0f} MiB | {ratio} |")
  extra = ", ".join(f"batch {r['batch_size']}: {r['theirs']['neighbor_index_s']:.3g} s"
                    for r in rows)
  lines += ["", f"Once per epoch, the authors' `HardNeighborIndex` ({extra}) is not in their "
            f"step times; ours finds the neighbours inside every step (in its times)."]
  return lines


def summary_md(results: list[dict], timing: dict | None, meta: dict,
               training: list[dict] | None = None) -> str:
  lines = ["# HYSET: the authors' PyTorch scorer beside hyset-jax", "",
           f"`{meta['command']}` — {meta['date']}, {meta['machine']}; torch {meta['torch']} "
           f"({meta.get('peer_device', 'cpu')}, {meta['peer_threads']} threads), JAX {meta['jax']} "
           f"({meta.get('jax_backend', 'cpu')}).", "",
           *([f"Both sides in one memory environment: {meta['allocator']} (the benchmark "
              "re-executes itself as `hyset` does: hyset_jax/allocator.py).", ""]
             if "allocator" in meta else []),
           "Random models of the paper's configuration (K1 = 15, K_pool = 20, M = 5), exported "
           "with `hyset export --format hyset-pytorch` and scored by the authors' "
           "`HYSETScorer.retrieve_from_embedding` and by `hyset predict --ranking greedy`'s "
           "`pipeline.predict_batched`. Score: within 1e-4 relative (absolute below 1). "
           "`trained` rows: a model trained here, its data set's test queries.", "",
           "| model | tools | d | queries | shortlist | best set | score | greedy ranking | "
           "max score rel. diff | best-set sizes (size:queries) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for r in results:
    a, n = r["agree"], r["queries"]
    lines.append(f"| {r['model']['name']} | {r['model']['n_tools']:,} | {r['model']['dim']} | "
                 f"{n} | {a['shortlist']}/{n} | {a['set']}/{n} | {a['score']}/{n} | "
                 f"{a['ranking']}/{n} | {r['max_score_rel_diff']:.2g} | "
                 f"{' '.join(f'{k}:{v}' for k, v in r['best_set_sizes'].items())} |")
  notes = [w for r in results for row in r["rows"] for w in row.get("why", [])]
  if notes:
    lines += ["", "Differences:", ""] + [f"- {w}" for w in notes]
  if timing:
    t = timing
    # Results written before the medians (2026-12-04) have one mean per batch size.
    calls = t.get("ours_batch64_calls", 3)
    mean1, mean64 = (f"{t[f'ours_batch{b}_s_per_query_mean']:.4g} s"
                     if f"ours_batch{b}_s_per_query_mean" in t else "not recorded"
                     for b in (1, SPEED_BATCH))
    lines += ["", "## Inference per query, paper scale (13,860 tools, d = 768)", "",
              "| | seconds per query | queries per second | ratio to the authors' |",
              "|---|---|---|---|",
              f"| authors' code, one query at a time (median of {t['theirs_queries']}) | "
              f"{t['theirs_s_per_query_median']:.4g} | {1 / t['theirs_s_per_query_median']:.3g}"
              f" | 1 |",
              f"| hyset-jax, batch 1 (median of {t['ours_batch1_queries']} queries) | "
              f"{t['ours_batch1_s_per_query']:.4g} | {1 / t['ours_batch1_s_per_query']:.3g} | "
              f"{t['ratio_batch1']:.3g}× |",
              f"| hyset-jax, batch {SPEED_BATCH} (median of {calls} calls) | "
              f"{t['ours_batch64_s_per_query']:.4g} | "
              f"{1 / t['ours_batch64_s_per_query']:.3g} | {t['ratio_batch64']:.3g}× |", "",
              *([f"Ours timed twice, {t['ours_rounds']} (every call of both in the medians): "
                 "the machine's speed drifts over minutes, and theirs takes over a minute.", ""]
                if t.get("ours_rounds") else []),
              f"Once per model: the authors' checkpoint load {t['theirs_load_s']:.3g} s; ours "
              f"`pipeline.prepare` (Z Pᵀ, Z M_m and the expansion's neighbour table) "
              f"{t['prepare_s']:.3g} s, not in the per-query times. The authors' mean per "
              f"query, first query included: {t['theirs_s_per_query_mean']:.4g} s; ours, "
              f"the mean of the same calls: batch 1 {mean1}, batch {SPEED_BATCH} {mean64}."]
  lines += training_md(training or [])
  return "\n".join(lines) + "\n"


def _parse(argv: list[str] | None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--peer", required=True, help="a checkout of the authors' repository")
  p.add_argument("--python", help="the peer environment's interpreter (default "
                                  "benchmarks/.venv-peer/bin/python)")
  p.add_argument("--quick", action="store_true",
                 help="the small models only (training at batch 8, 2 steps), no inference "
                      "timing, nothing written")
  p.add_argument("--queries", type=int, default=20,
                 help="queries for the paper-scale model (the authors' code is slow)")
  p.add_argument("--small-queries", type=int, default=64, help="queries for the small models")
  p.add_argument("--trained", metavar="WORKDIR",
                 help="also a model trained here: a hyset train workdir (its best/ model, its "
                      "data set's test queries)")
  p.add_argument("--trained-queries", type=int, default=20,
                 help="test queries for --trained")
  p.add_argument("--train-batches", default="32,256",
                 help="batch sizes of the training leg (the authors' default 32; --config "
                      "paper's 256); 'none' skips it")
  # The authors' step at the paper's scale takes ~10 s at batch 32 on 2 cores (a dense Z
  # gradient per candidate group): a few steps give its median.
  p.add_argument("--train-steps", type=int, default=3, help="timed training steps")
  p.add_argument("--train-warmup", type=int, default=1, help="untimed steps before them")
  p.add_argument("--train-rounds", type=int, default=2,
                 help="alternating rounds of the two training loops (each side's median is over "
                      "all its rounds' steps)")
  p.add_argument("--peer-device", default="cpu",
                 help="the authors' side's torch device (cuda on a GPU; ours: JAX's default)")
  p.add_argument("--out", default=str(RESULTS / "peer"),
                 help="results without suffix: <out>.json and <out>.md")
  p.add_argument("--force", action="store_true", help="overwrite existing results")
  args = p.parse_args(argv)
  try:
    args.train_batches = ([] if args.train_batches == "none" else
                          [int(b) for b in args.train_batches.split(",")])
  except ValueError:
    p.error(f"--train-batches {args.train_batches!r}: comma-separated integers or 'none'")
  if (any(b < 1 for b in args.train_batches) or args.train_steps < 1 or args.train_warmup < 1
      or args.train_rounds < 1):
    p.error("--train-batches, --train-steps, --train-warmup and --train-rounds must be positive")
  return args


def _run(args, peer: pathlib.Path, python: pathlib.Path):
  """Every leg: (agreement rows, inference timing, training rows)."""
  configs = [(SMALL, args.small_queries), (SMALL_MIXED, args.small_queries)] + (
      [] if args.quick else [(PAPER, args.queries)])
  results, timing, training = [], None, []
  for config, n in configs:
    with tempfile.TemporaryDirectory(prefix=f"peer-{config['name']}-") as tmp:
      print(f"{config['name']}: {config['n_tools']} tools, d = {config['dim']}, {n} queries",
            file=sys.stderr, flush=True)
      model = config_model(config)
      if config is PAPER:  # timed: ours before and after the authors' run
        prepared, prepare_s = prepare_timed(model)
        before = ours_times(model, prepared, n)
      result, model, _, peer_doc = agreement(config, peer, python, n, pathlib.Path(tmp),
                                             device=args.peer_device, model=model)
      results.append(result)
      if config is PAPER:
        timing = speed(model, peer_doc, n, prepared, prepare_s, before)
        timing.update(theirs_queries=n, ours_batch1_queries=2 * n)
  if args.trained:
    row, model, queries = trained_model(args.trained, args.trained_queries)
    print(f"{row['name']}: {row['n_tools']} tools, d = {row['dim']}, M = {row['max_size']}, "
          f"{len(queries)} queries", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="peer-trained-") as tmp:
      results.append(agreement_on(model, queries, row, peer, python, pathlib.Path(tmp),
                                  args.peer_device)[0])
  config, batches = (SMALL, [8]) if args.quick else (PAPER, args.train_batches)
  steps, warmup, rounds = ((2, 1, 1) if args.quick
                           else (args.train_steps, args.train_warmup, args.train_rounds))
  for batch in batches:
    print(f"training: {config['name']}, batch {batch}, {steps} steps", file=sys.stderr,
          flush=True)
    with tempfile.TemporaryDirectory(prefix="peer-train-") as tmp:
      training.append(train_speed(config, peer, python, batch, steps, warmup,
                                  pathlib.Path(tmp), device=args.peer_device, rounds=rounds))
  return results, timing, training


def main(argv: list[str] | None = None) -> int:
  args = _parse(argv)
  from hyset_jax import allocator
  if argv is None:
    # As `hyset` runs: huge pages asked for where the machine serves them. The authors' side
    # and ours are child processes of this one, so both run in the same environment.
    allocator.reexec()
  from hyset_jax import io_utils
  from hyset_jax.errors import UserError
  peer = pathlib.Path(args.peer)
  if not (peer / "src" / "hyset_model.py").is_file():
    raise SystemExit(f"error: {peer} has no src/hyset_model.py; --peer takes a checkout of the "
                     f"authors' repository")
  python = peer_python(args.python)
  if python is None:
    raise SystemExit("error: no peer environment with torch; create it (see python -m "
                     "benchmarks.peer --help) or pass --python")
  outs = ()
  try:
    if not args.quick:
      outs = tuple(io_utils.output_file(f"{args.out}{s}", args.force) for s in (".json", ".md"))
    results, timing, training = _run(args, peer, python)
  except UserError as e:
    raise SystemExit(f"error: {e}") from None
  import jax
  # The peer's path is the user's own checkout: recorded as DIR, never as a path here.
  words = [("DIR" if w == args.peer else w) for w in (argv if argv is not None else sys.argv[1:])]
  meta = {"command": "python -m benchmarks.peer " + " ".join(words),
          "date": datetime.date.today().isoformat(), "machine": provenance.machine(),
          "torch": results[0]["torch"], "peer_threads": results[0]["peer_threads"],
          "peer_device": args.peer_device, "jax_backend": jax.default_backend(),
          "jax": jax.__version__, "allocator": allocator.describe()}
  md = summary_md(results, timing, meta, training)
  print(md)
  if outs:
    doc = {"meta": meta, "agreement": results, "timing": timing, "training": training}
    with io_utils.atomic_write(outs[0]) as f:
      f.write(json.dumps(provenance.with_provenance(doc, meta["command"]), indent=1) + "\n")
    with io_utils.atomic_write(outs[1]) as f:
      f.write(md)
  ok = all(r["agree"]["all"] == r["queries"] for r in results)
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
