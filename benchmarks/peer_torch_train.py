"""The authors' side of ``benchmarks.peer``'s training leg: their training loop, timed per step.
Runs in the peer's own environment (torch, no hyset_jax).

  python benchmarks/peer_torch_train.py --peer DIR --checkpoint init.pt --queries q.npy \
      --gold gold.json --batch-size 32 --steps 10 --warmup 2 --out train.json

DIR is a checkout of the authors' repository: ``DIR/src/train_hyset.py`` and
``DIR/src/hyset_model.py`` are imported from there at run time (nothing of them is copied
here). One epoch of their ``main()`` loop, with their pieces: the examples shuffled by
``random.Random(seed + epoch)``, their ``HardNeighborIndex`` (built once per epoch, timed apart
from the steps), their ``NegativeSampler.build_pool`` per example (K_neg candidates: the gold
set and 50/30/20 uniform / in-batch / hard), their ``score_candidate_sets`` and log-softmax per
example, the self-training term with their ``RewardCache`` (empty: η = 0, their A-only mode),
their ``regularisation``, ``AdamW(weight_decay=0)``, ``project_constraints_()`` and
``cosine_warmup_scheduler``. What is left out: ``encode_texts`` (the frozen encoder; both sides
take precomputed query embeddings), validation and checkpoint saving (once per epoch).

Output: JSON with seconds per step (the first ``--warmup`` steps excluded), the part of each
step spent building pools, the neighbour index's seconds, and the process's peak RSS (VmHWM).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import random
import sys
import time


def peak_rss_bytes() -> int:
  """This process's peak resident set (VmHWM), the figure both sides report."""
  for line in pathlib.Path("/proc/self/status").read_text().splitlines():
    if line.startswith("VmHWM:"):
      return int(line.split()[1]) * 1024
  import resource
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class _Model:
  """What their HardNeighborIndex and RewardCache read of an HYSETModel (no text encoder)."""

  def __init__(self, scorer, func_names):
    self.scorer, self.func_names, self.num_tools = scorer, func_names, scorer.num_tools


def _step(torch, model, sampler, rewards, batch, embeddings, optimizer, scheduler, eta, lam):
  """One iteration of their loop body; returns the seconds spent in build_pool."""
  pool_s = 0.0
  retrieval, self_terms = [], []
  for example in batch:
    t0 = time.perf_counter()
    candidates = sampler.build_pool(example, batch)
    pool_s += time.perf_counter() - t0
    logits = model.scorer.score_candidate_sets(embeddings[int(example.query_id)], candidates)
    log_p = torch.log_softmax(logits, dim=0)
    retrieval.append(-log_p[0])
    chosen = int(logits.detach().argmax().item())
    reward = rewards.get(example, candidates[chosen], model.func_names)
    self_terms.append(-reward * log_p[chosen])
  loss = (torch.stack(retrieval).sum() + eta * torch.stack(self_terms).sum()
          + model.scorer.regularisation(lam))
  optimizer.zero_grad(set_to_none=True)
  loss.backward()
  optimizer.step()
  model.scorer.project_constraints_()
  scheduler.step()
  float(loss.item())  # their loop reads the loss every step (its running mean)
  return pool_s


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--peer", required=True, help="the authors' repository (has src/)")
  p.add_argument("--checkpoint", required=True, help="the starting θ (their format)")
  p.add_argument("--queries", required=True, help="float32 [Q, d_r] .npy")
  p.add_argument("--gold", required=True, help="JSON list of Q gold sets (tool rows)")
  p.add_argument("--batch-size", type=int, required=True)
  p.add_argument("--steps", type=int, required=True, help="timed steps")
  p.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
  p.add_argument("--k-neg", type=int, default=64)
  p.add_argument("--hard-neighbor-k", type=int, default=50)
  p.add_argument("--lr", type=float, default=1e-4)
  p.add_argument("--eta", type=float, default=0.0, help="their A-only mode (no rewards)")
  p.add_argument("--lambda-interaction", type=float, default=0.01)
  p.add_argument("--seed", type=int, default=42)
  p.add_argument("--device", default="cpu", help="torch device (their default: cuda)")
  p.add_argument("--out", required=True)
  args = p.parse_args(argv)

  import numpy as np
  import torch
  sys.path.insert(0, str(pathlib.Path(args.peer).resolve() / "src"))
  import train_hyset as th  # the authors' module, from --peer
  from hyset_model import HYSETScorer

  th.set_seed(args.seed)
  payload = torch.load(args.checkpoint, map_location="cpu", weights_only=True)
  scorer = HYSETScorer(len(payload["func_names"]), int(payload["d_z"]), int(payload["d_r"]),
                       int(payload["m_max"]))
  scorer.load_state_dict(payload["scorer_state"], strict=True)
  scorer.project_constraints_()
  scorer.to(args.device)
  model = _Model(scorer, list(payload["func_names"]))
  scorer.train()
  embeddings = torch.from_numpy(np.load(args.queries).astype(np.float32)).to(args.device)
  gold = json.loads(pathlib.Path(args.gold).read_text(encoding="utf-8"))
  # query_id is the embedding row; the text is unused without the encoder.
  training = [th.QueryExample(str(i), f"query {i}", tuple(sorted(g))) for i, g in enumerate(gold)]
  total = args.warmup + args.steps
  if len(training) < total * args.batch_size:
    raise SystemExit(f"{len(training)} queries are fewer than {total} steps of "
                     f"{args.batch_size}: one epoch must cover the run")

  optimizer = torch.optim.AdamW(scorer.parameters(), lr=args.lr, weight_decay=0.0)
  scheduler = th.cosine_warmup_scheduler(optimizer, total, 0.06)
  rewards = th.RewardCache("", set())
  epoch = 1
  epoch_rng = random.Random(args.seed + epoch)
  examples = list(training)
  epoch_rng.shuffle(examples)
  t0 = time.perf_counter()
  index = th.HardNeighborIndex(model, (t for e in training for t in e.ground_truth),
                               neighbor_count=args.hard_neighbor_k)
  index_s = time.perf_counter() - t0
  sampler = th.NegativeSampler(model.num_tools, args.k_neg, epoch_rng, index)
  steps, pools = [], []
  for s in range(total):
    batch = examples[s * args.batch_size:(s + 1) * args.batch_size]
    t0 = time.perf_counter()
    pool_s = _step(torch, model, sampler, rewards, batch, embeddings, optimizer, scheduler,
                   args.eta, args.lambda_interaction)
    if s >= args.warmup:
      steps.append(time.perf_counter() - t0)
      pools.append(pool_s)
  doc = {"torch": torch.__version__, "threads": torch.get_num_threads(), "device": args.device,
         "batch_size": args.batch_size, "k_neg": args.k_neg, "steps": args.steps,
         "warmup": args.warmup, "s_per_step": [float(x) for x in steps],
         "pool_s_per_step": [float(x) for x in pools], "neighbor_index_s": index_s,
         "peak_rss_bytes": peak_rss_bytes()}
  pathlib.Path(args.out).write_text(json.dumps(doc) + "\n", encoding="utf-8")
  return 0


if __name__ == "__main__":
  sys.exit(main())
