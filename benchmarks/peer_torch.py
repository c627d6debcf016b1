"""The authors' side of ``benchmarks.peer``: their HYSETScorer on a checkpoint, one query at a
time, as their code is written. Runs in the peer's own environment (torch, no hyset_jax).

  python benchmarks/peer_torch.py --peer DIR --checkpoint best.pt --queries q.npy \
      --k1 15 --k-pool 20 --out peer.json

DIR is a checkout of the authors' repository: ``DIR/src/hyset_model.py`` is imported from
there at run time (nothing of it is copied here). The checkpoint is loaded the way their
``HYSETModel.load`` loads one (``torch.load(weights_only=True)``, format_version 2,
``load_state_dict(strict=True)``, ``project_constraints_()``) without the text encoder, which
needs transformers and weights and plays no part given query embeddings. Each query runs
their ``retrieve_from_embedding`` (build_shortlist, predict_set, greedy_ranking of length M)
and is timed alone. Output: JSON with the load time and, per query, the shortlist, the best
set, its score, the ranking (tool rows) and the seconds it took.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--peer", required=True, help="the authors' repository (has src/)")
  p.add_argument("--checkpoint", required=True)
  p.add_argument("--queries", required=True, help="float32 [Q, d_r] .npy")
  p.add_argument("--k1", type=int, required=True)
  p.add_argument("--k-pool", type=int, required=True)
  p.add_argument("--device", default="cpu", help="torch device")
  p.add_argument("--out", required=True)
  args = p.parse_args(argv)

  import numpy as np
  import torch
  sys.path.insert(0, str(pathlib.Path(args.peer).resolve() / "src"))
  from hyset_model import HYSETScorer  # the authors' module, from --peer

  start = time.perf_counter()
  payload = torch.load(args.checkpoint, map_location="cpu", weights_only=True)
  if payload.get("format_version") != 2:
    raise SystemExit(f"{args.checkpoint}: format_version {payload.get('format_version')!r}")
  scorer = HYSETScorer(len(payload["func_names"]), int(payload["d_z"]), int(payload["d_r"]),
                       int(payload["m_max"]))
  scorer.load_state_dict(payload["scorer_state"], strict=True)
  scorer.project_constraints_()
  scorer.to(args.device)
  scorer.eval()
  load_s = time.perf_counter() - start

  queries = torch.from_numpy(np.load(args.queries).astype(np.float32)).to(args.device)
  rows = []
  for q in queries:
    t0 = time.perf_counter()
    out = scorer.retrieve_from_embedding(q, k1=args.k1, k_pool=args.k_pool,
                                         ranking_length=scorer.m_max)
    rows.append({"shortlist": list(out.shortlist), "set": list(out.predicted_set),
                 "score": out.predicted_score, "ranking": list(out.ranking),
                 "seconds": time.perf_counter() - t0})
  doc = {"torch": torch.__version__, "threads": torch.get_num_threads(), "device": args.device,
         "load_s": load_s,
         "queries": rows}
  pathlib.Path(args.out).write_text(json.dumps(doc) + "\n", encoding="utf-8")
  return 0


if __name__ == "__main__":
  sys.exit(main())
