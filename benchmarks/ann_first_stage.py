"""The approximate first stage (hyset_jax/inference/ann.py) against the exact one, at N = 10⁵ and 10⁶.

  python -m benchmarks.ann_first_stage                  # both libraries, N = 10⁵ and 10⁶
  python -m benchmarks.ann_first_stage --quick          # N = 20,000, 100 queries: a smoke run
  python -m benchmarks.ann_first_stage --libraries synthetic --sizes 100000 \\
      --ef-search 128 256 512 1024                      # a sweep of the search effort
  python -m benchmarks.ann_first_stage --libraries real --sizes 1000000 --index hnsw \
      --hnsw-m 48 --ef-construction 200 --ef-search 1024 2048 \
      --expansion lowrank index --cache /tmp/ann/cache  # a denser graph, both expansions
  python -m benchmarks.ann_first_stage --index ivf --nlist 4096 --nprobe 128 256 512
  python -m benchmarks.ann_first_stage --libraries real --sizes 1000000 --index ivf_sq8 \
      --nprobe 128 256 384 --expansion lowrank --cache /tmp/ann/cache  # 8-bit IVF lists

Libraries (d = 256 for the synthetic one: at 10⁶ tools Z, P Zᵀ and Z M_m already take 1 + 1 +
4 GB at M = 5; the paper's d_z = 768 would need three times that):

- ``synthetic``: a random model of the paper's shape (d_r = d_z = 256, P = I + G/√d, symmetric
  M_m of scale 0.1, K1 = 15, K_pool = 20, M = 5) over clustered unit vectors shaped like real
  sentence embeddings (:func:`clustered`: a common mean, clusters of ~50 tools, a covariance
  spectrum falling as j^-0.75 — matched to the MiniLM embeddings of the real tools: |mean| 0.61
  against 0.59, median nearest-neighbour cosine 0.88 against 0.85 at 10⁵). Queries: the mean of
  1-3 random tools plus noise. ``isotropic``: the same model over isotropic Gaussian vectors
  (no structure: the worst case for any ANN index).
- ``real``: the real tools of ToolLens, BFCL and Seal-Tools (6,393, MiniLM embeddings from the
  frozen encoder's cache) padded with distractors, under the trained Seal-Tools model's P and
  M_2, M_3 (runs/seal_tools/best, d = 384, M = 3 to fit 10⁶ tools in memory; its lexical term
  left out: with it the first stage is exact anyway). Encoding 10⁶ distractor texts would take
  hours on this CPU, so a distractor is a mixture of two real tools' embeddings:
  normalise(λ z_a + (1 − λ) z_b + ε), λ ~ U(0.35, 0.65), ε ~ N(0, 0.3²/d) — the embedding-space
  counterpart of benchmarks/distractors.py's generated tools (half of one real tool's text
  joined to half of another's). Queries: the three data sets' test queries. ``real-near``: the
  same with λ ~ U(0.5, 1), mostly near one real tool (a fifth of them within cosine 0.99 of
  it: near-duplicates, the hardest case for "the same best set").

For each (library, N): the index build time (faiss HNSW, IVF-Flat or IVF-SQ8, the settings
printed); for each
search setting (efSearch or nprobe × the expansion's: index searches with their effort and W, or
the low-rank scan with its rank and candidate count), over the
queries, against the exact path (``predict_batched`` without the index: stage 1 scans every
tool, the expansion scans every tool): recall of S0 (the K1 stage-1 tools), of the expansion and
of the whole K_pool shortlist, the fraction of queries whose best set is identical, and
ms/query at batch 1 and 64 of stage 1 alone (exact: ℓ of every tool and the top K1; ANN: the
index search and the candidates' exact ℓ), of the shortlist (stage 1 + the expansion) and of
the whole prediction, each pair timed interleaved. Writes
benchmarks/results/ann_first_stage.{json,md,png}; run it under ``flock /tmp/hyset-heavy.lock``.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import itertools
import os
import pathlib
import statistics
import sys
import time

import numpy as np

from benchmarks import provenance

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "results"
ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
REAL_SPECS = (f"beir:{DATA / 'toollens'}", "bfcl", f"seal:{DATA / 'seal_tools'}")
REAL_MODEL = ROOT / "runs" / "seal_tools" / "best"
ENCODER = "sentence-transformers/all-MiniLM-L6-v2"
K1, K_POOL = 15, 20
TARGET = {"shortlist_recall": 0.99, "best_set_identical": 0.99, "stage1_speedup_b1": 10.0}


def _unit(x: np.ndarray) -> np.ndarray:
  return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


# --------------------------------------------------------------------------- libraries


def clustered(n: int, d: int, seed: int, per_cluster: int = 50, mean_norm: float = 0.8,
              between: float = 0.9, within: float = 0.55, slope: float = 0.75) -> np.ndarray:
  """f32[n, d] unit rows shaped like sentence embeddings: a common mean, n/per_cluster
  clusters, and a covariance whose spectrum falls as j^-slope (in a random basis)."""
  rng = np.random.default_rng(seed)
  basis = np.linalg.qr(rng.standard_normal((d, d)))[0]
  s = np.arange(1, d + 1, dtype=np.float64) ** -slope
  a = (basis * np.sqrt(s / s.sum())).astype(np.float32)       # total variance 1
  mu = _unit(rng.standard_normal((1, d)))[0] * mean_norm
  k = max(1, n // per_cluster)
  centers = mu + between * rng.standard_normal((k, d)).astype(np.float32) @ a.T
  out = np.empty((n, d), np.float32)
  for i in range(0, n, 100_000):
    m = min(100_000, n - i)
    noise = within * rng.standard_normal((m, d)).astype(np.float32) @ a.T
    out[i:i + m] = _unit(centers[rng.integers(0, k, m)] + noise)
  return out


def isotropic(n: int, d: int, seed: int) -> np.ndarray:
  rng = np.random.default_rng(seed)
  out = np.empty((n, d), np.float32)
  for i in range(0, n, 100_000):
    out[i:i + 100_000] = _unit(rng.standard_normal((min(100_000, n - i), d)))
  return out


def synthetic_model(z: np.ndarray, n_queries: int, max_size: int, seed: int):
  """(HysetParams, query embeddings) of a random model over ``z``."""
  from hyset_jax.model.scoring import HysetParams
  rng = np.random.default_rng(seed + 1)
  n, d = z.shape
  p = (np.eye(d) + rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32)
  m = rng.normal(scale=0.1, size=(max_size - 1, d, d)).astype(np.float32)
  gold = rng.integers(0, n, (n_queries, 3))
  size = rng.integers(1, 4, n_queries)
  mean = np.stack([z[g[:s]].mean(0) for g, s in zip(gold, size)])
  queries = _unit(mean + 0.3 * _unit(rng.standard_normal((n_queries, d))))
  return HysetParams(tool_embeddings=z, projection=p,
                     interactions=(m + m.transpose(0, 2, 1)) / 2), queries


def real_embeddings() -> tuple[np.ndarray, np.ndarray]:
  """(tool embeddings f32[6393, 384], test query embeddings) of ToolLens, BFCL and Seal-Tools
  under the frozen MiniLM encoder (its on-disk cache; what is missing is encoded)."""
  from hyset_jax.data.specs import load_dataset
  from hyset_jax.encoder import encode_cached, load_query_encoder
  tools, queries = [], []
  for spec in REAL_SPECS:
    data = load_dataset(spec)
    tools += list(data.tools.texts)
    queries += [q.text for q in data.split("test")]
  encoder = load_query_encoder(ENCODER, 384)
  return _unit(encode_cached(encoder, tools)), _unit(encode_cached(encoder, queries))


def real_model(n: int, n_queries: int, max_size: int, seed: int, real=None,
               mix: tuple[float, float] = (0.35, 0.65)):
  """(HysetParams, query embeddings): the real tools padded with mixtures to ``n`` (λ ~
  U(``mix``)), under the trained Seal-Tools model's P and M_2..M_M."""
  from hyset_jax.io.modeldir import load_model_dir
  from hyset_jax.model.scoring import HysetParams
  tools, queries = real if real is not None else real_embeddings()
  model = load_model_dir(REAL_MODEL)
  rng = np.random.default_rng(seed)
  z = np.empty((n, tools.shape[1]), np.float32)
  z[:len(tools)] = tools
  for i in range(len(tools), n, 100_000):
    m = min(100_000, n - i)
    a, b = rng.integers(0, len(tools), (2, m))
    lam = rng.uniform(*mix, (m, 1)).astype(np.float32)
    eps = rng.standard_normal((m, tools.shape[1])).astype(np.float32) * (0.3 / np.sqrt(tools.shape[1]))
    z[i:i + m] = _unit(lam * tools[a] + (1 - lam) * tools[b] + eps)
  pick = np.random.default_rng(seed + 1).permutation(len(queries))[:n_queries]
  return HysetParams(tool_embeddings=z, projection=model.params.projection,
                     interactions=model.params.interactions[:max_size - 1]), queries[pick]


# --------------------------------------------------------------------------- measuring


def _sampler(fn, min_sample_s: float = 0.2):
  """After two warm-up calls (the first compiles), a function that times one sample of
  ``fn``: seconds per call over as many calls as last ≥ min_sample_s."""
  fn()
  start = time.perf_counter()
  fn()
  calls = max(1, int(np.ceil(min_sample_s / max(time.perf_counter() - start, 1e-6))))

  def sample() -> float:
    start = time.perf_counter()
    for _ in range(calls):
      fn()
    return (time.perf_counter() - start) / calls
  return sample


def _overlap(a: np.ndarray, b: np.ndarray) -> float:
  """Mean over rows of |a_i ∩ b_i| / |b_i|."""
  return float(np.mean([len(set(x.tolist()) & set(y.tolist())) / len(y) for x, y in zip(a, b)]))


def quality(exact, approx) -> dict:
  """Recall of the exact S0, expansion and shortlist; identical best sets; score gap."""
  same = [sorted(x[x >= 0].tolist()) == sorted(y[y >= 0].tolist())
          for x, y in zip(approx.set_tools, exact.set_tools)]
  gap = exact.set_score - approx.set_score
  return {"s0_recall": _overlap(approx.shortlist[:, :K1], exact.shortlist[:, :K1]),
          "expansion_recall": _overlap(approx.shortlist[:, K1:], exact.shortlist[:, K1:]),
          "shortlist_recall": _overlap(approx.shortlist, exact.shortlist),
          "best_set_identical": float(np.mean(same)),
          "set_score_gap_max": float(np.max(gap)), "set_score_gap_mean": float(np.mean(gap))}


def timings(prep, indexes: dict, queries: np.ndarray, max_size: int, batches, repeats: int,
            log) -> dict:
  """ms/query of stage 1, the shortlist and the whole prediction, exact and through each of
  ``indexes`` ((effort, expansion kind, its two parameters) -> ann.Index), per batch:
  {key: {"<stage>_b<batch>": {exact_ms, ann_ms, speedup}}}. The exact form and every index are
  timed interleaved, sample by sample; stage 1 once per effort (the expansion's settings do not
  touch it)."""
  import jax

  from hyset_jax.inference import ann, pipeline
  stages = {
      "stage1": lambda index: jax.jit(
          (lambda p, x: pipeline.stage1_prepared(p, x, K1)[1]) if index is None else
          (lambda p, x: ann.stage1(index, p, x, K1, K_POOL).s0)),
      "shortlist": lambda index: jax.jit(lambda p, x: pipeline.shortlist_prepared(
          p, x, K1, K_POOL, first_stage=index).tools),
      "predict": lambda index: lambda p, x: pipeline.predict_prepared(
          p, x, k1=K1, k_pool=K_POOL, max_size=max_size, first_stage=index).set_tools}
  out: dict = {ef: {} for ef in indexes}
  for batch in batches:
    x = jax.device_put(queries[:batch])
    for name, make in stages.items():
      timed = indexes
      if name == "stage1":  # one per stage-1 effort
        timed = {k: v for k, v in reversed(indexes.items())}
        timed = {k: timed[k] for k in {key[0]: key for key in indexes}.values()}
      samplers = {ef: _sampler(lambda fn=make(index): jax.block_until_ready(fn(prep, x)))
                  for ef, index in [(None, None), *timed.items()]}
      times: dict = {ef: [] for ef in samplers}
      for _ in range(repeats):  # interleaved: a change in load hits each alike
        for ef, sample in samplers.items():
          times[ef].append(sample())
      e = 1e3 * statistics.median(times[None]) / batch
      for ef in indexes:
        same = next(k for k in timed if k[0] == ef[0]) if name == "stage1" else ef
        a = 1e3 * statistics.median(times[same]) / batch
        out[ef][f"{name}_b{batch}"] = {"exact_ms": e, "ann_ms": a, "speedup": e / a}
        if same == ef:
          log(f"    {name:9s} batch {batch:3d}: exact {e:9.3f} ms/query, ANN {ef} "
              f"{a:8.3f} ({e / a:.1f}×)")
  return out


def measure(library: str, n: int, args, log=print, real=None) -> list[dict]:
  """Rows (one per --ef-search or --nprobe value and expansion setting: --expansion index ×
  --expansion-effort × --neighbors, --expansion lowrank × --expansion-rank ×
  --expansion-candidates) for one library at one size."""
  import jax

  from hyset_jax.inference import ann, pipeline
  max_size = 3 if library.startswith("real") else args.max_size
  start = time.perf_counter()
  if library.startswith("real"):
    params, queries = real_model(n, args.queries, max_size, args.seed, real,
                                 (0.5, 1.0) if library == "real-near" else (0.35, 0.65))
  else:
    z = (clustered if library == "synthetic" else isotropic)(n, args.dim, args.seed)
    params, queries = synthetic_model(z, args.queries, max_size, args.seed)
    del z
  log(f"{library} N={n:,} d={params.tool_embeddings.shape[1]} M={max_size}: library made in "
      f"{time.perf_counter() - start:.0f} s")
  prep = pipeline.prepare(params, max_size=max_size, neighbor_table=False)
  del params
  gc.collect()
  z = np.asarray(prep.params.tool_embeddings)
  settings = ann.Settings(index=args.index, hnsw_m=args.hnsw_m, ef_construction=args.ef_construction,
                          nlist=args.nlist, candidates=args.candidates)
  start = time.perf_counter()
  index = ann.load_or_build(z, settings, args.cache, progress=True)
  build_s = index.build_s
  log(f"  index: {settings.describe()}: {'built in %.0f s' % build_s if build_s else 'cached'} "
      f"({time.perf_counter() - start:.0f} s with hashing and I/O)")
  start = time.perf_counter()
  exact = pipeline.predict_batched(prep, queries, k1=K1, k_pool=K_POOL, max_size=max_size,
                                   batch_size=64)
  exact_s = time.perf_counter() - start
  log(f"  exact path over {len(queries)} queries: {exact_s:.0f} s")
  rows, timed = [], {}
  ivf = settings.index in ann.IVF_INDEXES
  expansions = [("lowrank", exp, w) if kind == "lowrank" else ("index", exp, w)
                for kind in args.expansion
                for exp, w in itertools.product(
                    *((args.expansion_rank, args.expansion_candidates) if kind == "lowrank"
                      else (args.expansion_effort, args.neighbors)))]
  for ef, (kind, exp, w) in itertools.product(args.nprobe if ivf else args.ef_search,
                                              expansions):
    lowrank = kind == "lowrank"
    searched = dataclasses.replace(
        settings, expansion=kind,
        **({"expansion_rank": exp, "expansion_candidates": w} if lowrank else
           {"expansion_effort": exp, "neighbors": w}),
        **{"nprobe" if ivf else "ef_search": ef})
    idx = ann.Index(index.index, searched, index.num_tools, index.dim, index.build_s, index.z)
    approx = pipeline.predict_batched(prep, queries, k1=K1, k_pool=K_POOL, max_size=max_size,
                                      batch_size=64, first_stage=idx)
    q = quality(exact, approx)
    how = (f"low-rank expansion r {exp}, C2 {w}" if lowrank else
           f"expansion effort {exp or ef}, W {w}")
    log(f"  {'nprobe' if ivf else 'efSearch'} {ef}, {how}: S0 "
        f"recall {q['s0_recall']:.4f}, expansion {q['expansion_recall']:.4f}, shortlist "
        f"{q['shortlist_recall']:.4f}, best set identical {q['best_set_identical']:.4f}")
    rows.append({"library": library, "num_tools": n, "dim": int(z.shape[1]),
                 "max_size": max_size, "k1": K1, "k_pool": K_POOL, "queries": len(queries),
                 "index": settings.index, "hnsw_m": settings.hnsw_m,
                 "ef_construction": settings.ef_construction, "effort": ef,
                 "ef_search": None if ivf else ef,
                 "nlist": int(index.index.nlist) if ivf else None, "nprobe": ef if ivf else None,
                 "expansion": kind, "candidates": settings.candidates,
                 **({"expansion_rank": exp, "expansion_candidates": w} if lowrank else
                    {"expansion_effort": exp, "neighbors": w}),
                 "build_s": build_s, "exact_s": exact_s,
                 "load_average": round(os.getloadavg()[0], 2), **q})
    if ef in args.time_ef:
      timed[(ef, kind, exp, w)] = idx
  if timed and not args.no_timing:
    ms = timings(prep, timed, queries, max_size, args.batches, args.repeats, log)
    for row in rows:
      key = ((row["effort"], "lowrank", row["expansion_rank"], row["expansion_candidates"])
             if row["expansion"] == "lowrank" else
             (row["effort"], "index", row["expansion_effort"], row["neighbors"]))
      if key in ms:
        row["ms_per_query"] = ms[key]
  jax.clear_caches()
  del prep, index, z
  gc.collect()
  return rows


# --------------------------------------------------------------------------- output


def _fmt_ms(t: dict | None, key: str) -> str:
  if not t or key not in t:
    return "–"
  m = t[key]
  return f"{m['exact_ms']:.2f} / {m['ann_ms']:.2f} ({m['speedup']:.1f}×)"


def _index_label(r: dict) -> str:
  from hyset_jax.inference import ann
  if r.get("index") in ann.IVF_INDEXES:
    codes = "-SQ8" if r["index"] == "ivf_sq8" else ""
    label = f"IVF{codes} {r['nlist']} / {r['nprobe']}"
  else:
    codes = " sq8" if r.get("index", "hnsw_sq8") == "hnsw_sq8" else ""
    label = f"HNSW{codes} {r['hnsw_m']} / {r['ef_construction']} / {r['ef_search']}"
  if r.get("expansion") == "lowrank":
    return label + f", low-rank r {r['expansion_rank']} / C2 {r['expansion_candidates']}"
  if r.get("expansion_effort"):
    label += f", exp {r['expansion_effort']}"
  return label + f", W {r.get('neighbors', 40)}"


def markdown(rows: list[dict], command: str) -> str:
  lines = [f"`{command}` — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
           f"{provenance.machine()}. K1 = {K1}, K_pool = {K_POOL}; faiss index over Z (inner "
           f"product): HNSW M / efConstruction / efSearch, or IVF nlist / nprobe; \"exp\": the "
           f"expansion's own effort, W: the tools per S0 member it asks for; \"low-rank r / "
           f"C2\": the expansion by a scan under M_M's rank-r factor, C2 candidates; recall "
           f"against the exact path's S0 / expansion / shortlist; ms per query as exact / ANN "
           f"(speed-up).", "",
           "| library | N | d | M | index | build s | S0 recall | expansion "
           "recall | shortlist recall | best set identical | stage 1 b1 | stage 1 b64 | "
           "shortlist b1 | shortlist b64 | predict b1 |",
           "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|---|---|---|---|"]
  for r in rows:
    t = r.get("ms_per_query")
    build = f"{r['build_s']:.0f}" if r.get("build_s") else "cached"
    lines.append(
        f"| {r['library']} | {r['num_tools']:,} | {r['dim']} | {r['max_size']} | "
        f"{_index_label(r)} | {build} | "
        f"{r['s0_recall']:.4f} | {r['expansion_recall']:.4f} | {r['shortlist_recall']:.4f} | "
        f"{r['best_set_identical']:.4f} | {_fmt_ms(t, 'stage1_b1')} | "
        f"{_fmt_ms(t, 'stage1_b64')} | {_fmt_ms(t, 'shortlist_b1')} | "
        f"{_fmt_ms(t, 'shortlist_b64')} | {_fmt_ms(t, 'predict_b1')} |")
  lines += ["", f"Target at 10⁶ tools (issue #36): shortlist recall ≥ "
            f"{TARGET['shortlist_recall']}, best set identical on ≥ "
            f"{100 * TARGET['best_set_identical']:.0f}% of queries, stage 1 ≥ "
            f"{TARGET['stage1_speedup_b1']:.0f}× faster than exact at batch 1."]
  return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: pathlib.Path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  timed = [r for r in rows if r.get("ms_per_query")]
  fig, (ax, at) = plt.subplots(1, 2, figsize=(10, 3.8))
  for lib in dict.fromkeys(r["library"] for r in rows):
    rs = [r for r in rows if r["library"] == lib]
    for n in sorted({r["num_tools"] for r in rs}):
      pts = sorted((r["effort"], r["shortlist_recall"], r["best_set_identical"])
                   for r in rs if r["num_tools"] == n)
      ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
              label=f"{lib} {n:,}: shortlist recall")
      ax.plot([p[0] for p in pts], [p[2] for p in pts], marker="s", ls="--",
              label=f"{lib} {n:,}: best set identical")
  ax.axhline(0.99, color="grey", lw=0.8)
  ax.set_xscale("log", base=2)
  ax.set_xlabel("efSearch (HNSW) / nprobe (IVF)")
  ax.set_title("agreement with the exact first stage", fontsize=9)
  ax.legend(fontsize=6)
  labels, exact_ms, ann_ms = [], [], []
  for r in timed:
    for b in (1, 64):
      m = r["ms_per_query"].get(f"stage1_b{b}")
      if m:
        labels.append(f"{r['library'][:5]} {r['num_tools'] // 1000}k\n"
                      f"{'ef' if r.get('index', 'hnsw').startswith('hnsw') else 'np'}"
                      f"{r['effort']} b{b}")
        exact_ms.append(m["exact_ms"])
        ann_ms.append(m["ann_ms"])
  x = np.arange(len(labels))
  at.bar(x - 0.2, exact_ms, 0.4, label="exact stage 1")
  at.bar(x + 0.2, ann_ms, 0.4, label="ANN stage 1")
  at.set_yscale("log")
  at.set_xticks(x, labels, fontsize=6)
  at.set_ylabel("ms per query")
  at.set_title("stage 1, ms per query", fontsize=9)
  at.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv: list[str] | None = None) -> int:
  from hyset_jax import cli
  from hyset_jax.inference import ann
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--libraries", nargs="+", default=["synthetic", "real"],
                 choices=("synthetic", "isotropic", "real", "real-near"))
  p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
  p.add_argument("--queries", type=int, default=500, help="queries per library (default 500)")
  p.add_argument("--dim", type=int, default=256, help="d of the synthetic libraries")
  p.add_argument("--max-size", type=int, default=5, help="M of the synthetic model")
  p.add_argument("--index", default="hnsw_sq8", choices=ann.INDEXES)
  p.add_argument("--hnsw-m", type=int, default=32)
  p.add_argument("--ef-construction", type=int, default=40)
  p.add_argument("--ef-search", type=int, nargs="+", default=[512],
                 help="HNSW: the efSearch values to measure")
  p.add_argument("--nlist", type=int, default=4096, help="IVF lists")
  p.add_argument("--nprobe", type=int, nargs="+", default=[256],
                 help="IVF: the nprobe values to measure")
  p.add_argument("--expansion-effort", type=int, nargs="+", default=[0],
                 help="the expansion's own efSearch / nprobe values (0: the stage-1 one)")
  p.add_argument("--time-ef", type=int, nargs="*", default=None,
                 help="the efSearch / nprobe values to time (default: every one)")
  p.add_argument("--candidates", type=int, default=128)
  p.add_argument("--neighbors", type=int, nargs="+", default=[40],
                 help="the tools per S0 member the expansion asks the index for")
  p.add_argument("--expansion", nargs="+", default=["index"], choices=("index", "lowrank"),
                 help="the expansion's candidates: the index's searches, or a low-rank scan")
  p.add_argument("--expansion-rank", type=int, nargs="+", default=[32],
                 help="--expansion lowrank: the ranks r to measure")
  p.add_argument("--expansion-candidates", type=int, nargs="+", default=[256],
                 help="--expansion lowrank: the candidate counts C2 to measure")
  p.add_argument("--batches", type=int, nargs="+", default=[1, 64])
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--no-timing", action="store_true")
  p.add_argument("--cache", metavar="DIR", help="keep the built indexes here (default: none)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--tag", default="", help="suffix of the result files")
  p.add_argument("--quick", action="store_true", help="N = 20,000, 100 queries, 2 repeats")
  p.set_defaults(func=run)
  return cli.run(p, argv)


def run(args: argparse.Namespace) -> int:
  if args.quick:
    args.sizes, args.queries, args.repeats = [20_000], min(args.queries, 100), 2
  if args.time_ef is None:
    from hyset_jax.inference import ann
    args.time_ef = args.nprobe if args.index in ann.IVF_INDEXES else args.ef_search
  command = provenance.command()
  real = real_embeddings() if any(x.startswith("real") for x in args.libraries) else None
  rows: list[dict] = []
  for library in args.libraries:
    for n in args.sizes:
      rows += measure(library, n, args, real=real)
      _write(rows, args, command)  # after each size: a long run keeps what it has
  print(markdown(rows, command))
  return 0


def _write(rows: list[dict], args, command: str) -> None:
  RESULTS.mkdir(exist_ok=True)
  stem = RESULTS / f"ann_first_stage{'_' + args.tag if args.tag else ''}"
  provenance.write_json(stem.with_suffix(".json"), {"rows": rows, "target": TARGET}, command)
  stem.with_suffix(".md").write_text(markdown(rows, command), encoding="utf-8")
  plot(rows, stem.with_suffix(".png"))


if __name__ == "__main__":
  sys.exit(main())
