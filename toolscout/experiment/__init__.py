"""The paper's main experiment end to end (``toolscout experiment``), one module per stage:

1. :mod:`~toolscout.experiment.data` — the suite (:mod:`toolscout.sources`), frozen
   embeddings of tools and queries, gold rows.
2. :mod:`~toolscout.experiment.training` — off-the-shelf dense (W = I), the specialist
   (adapter trained on the reference source) and the aggregate (adapter trained on
   every source's training queries, natural mix).
3. :mod:`~toolscout.experiment.evaluation` — depth-20 pools on every source's test split
   for those three and the controls BM25, BM25+dense RRF and BM25+specialist RRF
   (BM25 scores: :mod:`~toolscout.experiment.lexical`);
   :mod:`~toolscout.experiment.reranking` — linear and MLP rerankers per dense retriever
   (P@1 among covered, G = coverage · P@1; :mod:`~toolscout.experiment.outcomes`).
4. :mod:`~toolscout.experiment.detectors` — per-source TF-IDF (query and tool side),
   sentence-embedding, length and multi-step proxies; correlations with specialist
   coverage; leave-one-source-out unsafe-source accuracy; the TF-IDF source classifier.
5. :mod:`~toolscout.experiment.routing` — batch (one decision per source), rolling-window
   and per-request routing on the mixed stream with LOSO-calibrated τ, and with the
   label-free default τ of ``toolscout fit``; window accuracy; the coverage-floor sweep;
   :mod:`~toolscout.experiment.latency`.
6. :mod:`~toolscout.experiment.repair` — few-shot continuation from the specialist on the
   collapsed sources; paired natural/API-template transfer.
7. :mod:`~toolscout.experiment.skill_cards` — stages 2, 3 and batch routing again with
   tools rendered as skill cards.

:mod:`~toolscout.experiment.pipeline` runs them in order (:func:`run` returns the report as
a dict; its tables come from :mod:`~toolscout.experiment.summary`);
:mod:`~toolscout.experiment.output` writes the report directory (:func:`run_and_write`).
"""
from toolscout.experiment.output import run_and_write
from toolscout.experiment.pipeline import run

__all__ = ["run", "run_and_write"]
