"""The TF-IDF source classifier (paper Table 22 note): is the source recoverable from a query?

TF-IDF (the fingerprint's settings) + multinomial logistic regression, scored
by stratified k-fold cross-validation over sources with enough queries (the
paper keeps sources with at least 50). It answers a different question from the
router: the router uses the fixed centroid rule, the classifier shows that the
source footprint is in the query text at all.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, f1_score
from sklearn.model_selection import StratifiedKFold, cross_val_predict
from sklearn.pipeline import make_pipeline

from toolscout.fingerprint import TFIDF_PARAMS


def source_classifier_cv(texts: Sequence[str], sources: Sequence[str], min_count: int = 50,
                         folds: int = 5, seed: int = 0) -> dict:
  """Cross-validated accuracy and macro-F1 of the TF-IDF source classifier.

  Args:
    texts: queries.
    sources: their source names.
    min_count: sources with fewer queries are left out.
    folds: cross-validation folds (reduced to the smallest kept class size).

  Returns:
    ``{"accuracy", "macro_f1", "n_queries", "sources", "folds"}``; accuracy and
    macro-F1 are NaN when fewer than two sources are kept.
  """
  counts = Counter(sources)
  kept = sorted(s for s, c in counts.items() if c >= min_count)
  keep = [i for i, s in enumerate(sources) if s in kept]
  result = {"sources": kept, "n_queries": len(keep), "folds": 0,
            "accuracy": float("nan"), "macro_f1": float("nan")}
  if len(kept) < 2:
    return result
  x = [texts[i] for i in keep]
  y = np.array([sources[i] for i in keep])
  k = min(folds, min(counts[s] for s in kept))
  model = make_pipeline(TfidfVectorizer(**TFIDF_PARAMS), LogisticRegression(max_iter=2000))
  predicted = cross_val_predict(model, x, y, cv=StratifiedKFold(k, shuffle=True, random_state=seed))
  result.update(folds=k, accuracy=float(accuracy_score(y, predicted)),
                macro_f1=float(f1_score(y, predicted, average="macro")))
  return result
