"""Metrics against values computed by hand (see the comment above each expected value)."""
import math

import numpy as np
import pytest

from hyset_jax.evaluation import metrics

# Three queries used by several tests.
RANKINGS = [
    ["a", "x", "b", "y", "c"],  # gold {a, b, c}: hits at ranks 1, 3, 5
    ["x", "y", "z", "w", "d"],  # gold {d}: hit at rank 5
    ["e", "f", "x", "y", "z"],  # gold {e, f}: hits at ranks 1, 2
]
GOLD = [{"a", "b", "c"}, {"d"}, {"e", "f"}]


def log2(r):
  return math.log2(r + 1)  # discount of 1-based rank r


def test_recall_at_k():
  # k=3: 2/3, 0/1, 2/2.  k=5: 3/3, 1/1, 2/2.
  np.testing.assert_allclose(metrics.recall_at_k(RANKINGS, GOLD, 3), [2 / 3, 0, 1])
  np.testing.assert_allclose(metrics.recall_at_k(RANKINGS, GOLD, 5), [1, 1, 1])
  # k=1: 1/3, 0, 1/2.
  np.testing.assert_allclose(metrics.recall_at_k(RANKINGS, GOLD, 1), [1 / 3, 0, 1 / 2])


def test_ndcg_at_k():
  # q0, k=3: DCG = 1 + 1/log2(4) = 1.5; IDCG over min(3,3)=3: 1 + 1/log2(3) + 1/2.
  q0_k3 = (1 + 1 / log2(3)) / (1 + 1 / log2(2) + 1 / log2(3))
  # q1, k=3: no hit. q2: hits at 1, 2 with |G|=2 -> perfect.
  np.testing.assert_allclose(metrics.ndcg_at_k(RANKINGS, GOLD, 3), [q0_k3, 0, 1])
  # q0, k=5: DCG = 1 + 1/2 + 1/log2(6); IDCG still over 3 positions.
  q0_k5 = (1 + 1 / log2(3) + 1 / log2(5)) / (1 + 1 / log2(2) + 1 / log2(3))
  # q1, k=5: DCG = 1/log2(6), IDCG over min(1,5)=1 position = 1.
  q1_k5 = 1 / log2(5)
  np.testing.assert_allclose(metrics.ndcg_at_k(RANKINGS, GOLD, 5), [q0_k5, q1_k5, 1])


def test_ndcg_ideal_is_capped_at_k():
  # |G| = 4 > k = 2 and both top positions are gold: a perfect top-2 is 1, not 2/4-ish.
  assert metrics.ndcg_at_k([["a", "b"]], [{"a", "b", "c", "d"}], 2).tolist() == [1.0]


def test_comp_at_k_is_whole_set_in_top_k():
  # k=3: q0 misses c (rank 5), q1 misses d, q2 has both.  k=5: all complete.
  np.testing.assert_array_equal(metrics.comp_at_k(RANKINGS, GOLD, 3), [0, 0, 1])
  np.testing.assert_array_equal(metrics.comp_at_k(RANKINGS, GOLD, 5), [1, 1, 1])
  # Recall 2/3 is not completeness: COMP stays 0 until the last gold tool is in.
  assert metrics.comp_at_k([["a", "b", "x", "c"]], [{"a", "b", "c"}], 3).tolist() == [0.0]
  # |G| > k can never be complete.
  assert metrics.comp_at_k([["a", "b"]], [{"a", "b", "c"}], 2).tolist() == [0.0]


def test_coverage_at_depth_is_any_gold_tool():
  # depth 1: only q0 (a) and q2 (e) start with a gold tool.
  np.testing.assert_array_equal(metrics.coverage_at_depth(RANKINGS, GOLD, 1), [1, 0, 1])
  np.testing.assert_array_equal(metrics.coverage_at_depth(RANKINGS, GOLD, 4), [1, 0, 1])
  np.testing.assert_array_equal(metrics.coverage_at_depth(RANKINGS, GOLD, 5), [1, 1, 1])


def test_repeated_tool_counts_once():
  # "a" repeated must not count twice toward recall or the DCG.
  assert metrics.recall_at_k([["a", "a", "a"]], [{"a", "b"}], 3).tolist() == [0.5]
  assert metrics.comp_at_k([["a", "a"]], [{"a", "b"}], 2).tolist() == [0.0]
  ndcg = metrics.ndcg_at_k([["a", "a", "b"]], [{"a", "b"}], 3)[0]
  assert ndcg == pytest.approx((1 + 1 / log2(3)) / (1 + 1 / log2(2)))


def test_short_rankings_count_missing_positions_as_misses():
  assert metrics.recall_at_k([["a"]], [{"a", "b"}], 5).tolist() == [0.5]
  assert metrics.recall_at_k([[]], [{"a"}], 5).tolist() == [0.0]


def test_set_metrics():
  predicted = [["a", "x"], ["d"], [], ["e", "f", "g", "h"]]
  gold = [{"a", "b", "c"}, {"d"}, {"e"}, {"e", "f"}]
  # precision: 1/2, 1/1, empty -> 0, 2/4.
  np.testing.assert_allclose(metrics.set_precision(predicted, gold), [0.5, 1, 0, 0.5])
  # recall: 1/3, 1/1, 0/1, 2/2.
  np.testing.assert_allclose(metrics.set_recall(predicted, gold), [1 / 3, 1, 0, 1])
  # f1 = 2PR/(P+R): 2*(1/2)(1/3)/(5/6) = 0.4, 1, 0, 2*(1/2)(1)/(3/2) = 2/3.
  np.testing.assert_allclose(metrics.set_f1(predicted, gold), [0.4, 1, 0, 2 / 3])
  np.testing.assert_array_equal(metrics.set_exact(predicted, gold), [0, 1, 0, 0])
  # Order and repeats do not matter for a set.
  assert metrics.set_exact([["b", "a", "b"]], [("a", "b")]).tolist() == [1.0]


def test_evaluate_keys_and_means():
  m = metrics.evaluate(RANKINGS, GOLD)
  assert tuple(m) == metrics.METRIC_KEYS
  assert set(m) == {"recall@3", "recall@5", "ndcg@3", "ndcg@5", "comp@3", "comp@5",
                    "set_precision", "set_recall", "set_f1", "set_exact", "n_queries"}
  assert m["n_queries"] == 3 and isinstance(m["n_queries"], int)
  assert m["recall@3"] == pytest.approx((2 / 3 + 0 + 1) / 3)
  assert m["recall@5"] == pytest.approx(1.0)
  assert m["comp@3"] == pytest.approx(1 / 3)
  assert m["comp@5"] == pytest.approx(1.0)
  # Rank-only: the predicted set is the top 5. precision 3/5, 1/5, 2/5; recall all 1.
  assert m["set_precision"] == pytest.approx((3 / 5 + 1 / 5 + 2 / 5) / 3)
  assert m["set_recall"] == pytest.approx(1.0)
  # f1 = 2|P∩G|/(|P|+|G|): 6/8, 2/6, 4/7.
  assert m["set_f1"] == pytest.approx((6 / 8 + 2 / 6 + 4 / 7) / 3)
  assert m["set_exact"] == 0.0
  for key, value in m.items():
    if key != "n_queries":
      assert 0.0 <= value <= 1.0 and isinstance(value, float)


def test_evaluate_uses_predicted_sets_when_given():
  m = metrics.evaluate(RANKINGS, GOLD, predicted_sets=[["a", "b", "c"], ["x"], ["e"]])
  assert m["set_exact"] == pytest.approx(1 / 3)
  assert m["set_precision"] == pytest.approx((1 + 0 + 1) / 3)
  assert m["set_recall"] == pytest.approx((1 + 0 + 1 / 2) / 3)
  # The rank metrics do not depend on the sets.
  assert m["recall@5"] == metrics.evaluate(RANKINGS, GOLD)["recall@5"]


def test_bad_inputs():
  with pytest.raises(ValueError, match="empty gold set"):
    metrics.recall_at_k([["a"]], [set()], 3)
  with pytest.raises(ValueError, match="1 rankings but 2 gold"):
    metrics.evaluate([["a"]], [{"a"}, {"b"}])
  with pytest.raises(ValueError, match="k must be >= 1"):
    metrics.comp_at_k([["a"]], [{"a"}], 0)
  with pytest.raises(ValueError, match="no queries"):
    metrics.evaluate([], [])
