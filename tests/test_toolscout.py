"""ToolScout: fingerprint distances, routing, calibration, the CLI and the tiny experiment."""
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from toolscout import cli, router, routerdir
from toolscout import fingerprint as fpr


# --- Distances -------------------------------------------------------------------


def test_distance_matches_hand_computation():
  # Vocabulary (stop words and 1-letter tokens out): book, flight, hotel.
  fp = fpr.fit_fingerprint(["book a flight", "book a hotel"])
  assert fp.vocabulary == ["book", "flight", "hotel"]
  # Smooth idf = ln((1 + n) / (1 + df)) + 1 with n = 2.
  idf = np.array([math.log(3 / 3) + 1, math.log(3 / 2) + 1, math.log(3 / 2) + 1])
  rows = np.array([[1, 1, 0], [1, 0, 1]]) * idf
  rows /= np.linalg.norm(rows, axis=1, keepdims=True)
  centroid = rows.mean(axis=0)
  np.testing.assert_allclose(fp.centroid, centroid)

  def distance(tf):
    v = np.asarray(tf, float) * idf
    v /= np.linalg.norm(v)
    return 1 - v @ centroid / np.linalg.norm(centroid)

  texts = ["book a flight", "flight", "hotel hotel book", "the weather"]
  expected = [distance([1, 1, 0]), distance([0, 1, 0]), distance([1, 0, 2]), 1.0]
  np.testing.assert_allclose(fpr.request_distances(fp, texts), expected, atol=1e-12)
  assert expected[0] == pytest.approx(0.18266, abs=1e-5)  # the number worked out by hand
  # A batch is scored by its centroid: the reference itself is at distance 0.
  assert fpr.batch_distance(fp, ["book a flight", "book a hotel"]) == pytest.approx(0.0, abs=1e-12)


def test_distances_in_unit_interval_and_modes_agree():
  rng = np.random.default_rng(0)
  words = ["flight", "hotel", "book", "weather", "rain", "convert", "currency", "the", "a"]
  ref = [" ".join(rng.choice(words[:3], 3)) for _ in range(30)]
  stream = [" ".join(rng.choice(words, rng.integers(0, 5))) for _ in range(40)]
  fp = fpr.fit_fingerprint(ref)
  for d in (fpr.request_distances(fp, stream), fpr.window_distances(fp, stream, 7),
            fpr.chunk_distances(fp, stream, 6)):
    assert d.shape == (40,) and (d >= 0).all() and (d <= 1).all()
  np.testing.assert_allclose(fpr.window_distances(fp, stream, 1), fpr.request_distances(fp, stream))
  # The last rolling window of size n covers the whole stream, as does one batch.
  assert fpr.window_distances(fp, stream, 40)[-1] == pytest.approx(fpr.batch_distance(fp, stream))
  window = fpr.window_distances(fp, stream, 5)
  assert window[10] == pytest.approx(fpr.batch_distance(fp, stream[6:11]))
  chunks = fpr.chunk_distances(fp, stream, 6)
  assert chunks[13] == pytest.approx(fpr.batch_distance(fp, stream[12:18]))


# --- Routing and calibration ---------------------------------------------------------


def test_routing_follows_threshold():
  d = np.array([0.0, 0.29, 0.3, 0.31, 1.0])
  assert router.route(d, 0.3).tolist() == ["specialist", "specialist", "aggregate", "aggregate",
                                           "aggregate"]
  assert (router.route(d, 1.01) == "specialist").all()
  assert router.threshold_for_window({1: 0.9, 10: 0.6, 50: 0.4}, 1) == 0.9
  assert router.threshold_for_window({1: 0.9, 10: 0.6, 50: 0.4}, 11) == 0.4


def test_calibration_hand_worked_example():
  # Specialist coverage per source and its distance from the reference:
  #   A 0.90 @ 0.10, B 0.85 @ 0.30, C 0.05 @ 0.50, D 0.60 @ 0.60, E 0.01 @ 0.70.
  # Floor 30%: C and E are unsafe. Candidate cuts: -0.9, 0.2, 0.4, 0.55, 0.65, 1.7,
  # with 2, 3, 4, 3, 4, 3 sources classified right; 0.4 and 0.65 tie at 4 and the
  # smaller (more traffic to the aggregate) wins.
  coverage = np.array([0.90, 0.85, 0.05, 0.60, 0.01])
  d = np.array([0.10, 0.30, 0.50, 0.60, 0.70])
  unsafe = router.unsafe_labels(coverage, 0.30)
  assert unsafe.tolist() == [False, False, True, False, True]
  assert router.calibrate_threshold(d, unsafe) == pytest.approx(0.4)
  # Leave one source out, worked by hand:
  #   without A: cuts 0.4 and 0.65 tie (3 of 4)  -> 0.4,  A at 0.1 safe     (right)
  #   without B: cuts 0.3 and 0.65 tie (3 of 4)  -> 0.3,  B at 0.3 unsafe   (wrong: d >= tau)
  #   without C: 0.65 separates all four         -> 0.65, C at 0.5 safe     (wrong)
  #   without D: 0.4 separates all four          -> 0.4,  D at 0.6 unsafe   (wrong)
  #   without E: 0.4, 0.55, 1.6 tie (3 of 4)     -> 0.4,  E at 0.7 unsafe   (right)
  loso = router.leave_one_source_out(d, unsafe)
  np.testing.assert_allclose(loso.thresholds, [0.4, 0.3, 0.65, 0.4, 0.4])
  assert loso.predicted_unsafe.tolist() == [False, True, False, True, True]
  assert loso.accuracy == pytest.approx(2 / 5)
  assert loso.f1 == pytest.approx(2 * 1 / (2 + 3))  # one true positive, 2 unsafe, 3 predicted


# --- CLI ---------------------------------------------------------------------------------

TRAVEL = ["book a flight from {} to {} next week", "find a hotel in {} near {}",
          "reserve a rental car in {} for the trip to {}", "book train tickets from {} to {}"]
CITIES = ["paris", "rome", "berlin", "madrid", "lisbon", "vienna", "prague", "oslo"]
MATH = ["integrate x squared from {} to {}", "solve the quadratic equation with roots {} and {}",
        "compute the determinant of a matrix with entries {} and {}"]


def _write_queries(path, texts, prefix="q"):
  with open(path, "w") as f:
    for i, text in enumerate(texts):
      f.write(json.dumps({"_id": f"{prefix}{i}", "text": text}) + "\n")


def _travel(n, offset=0):
  return [TRAVEL[i % 4].format(CITIES[(i + offset) % 8], CITIES[(3 * i + 1 + offset) % 8])
          for i in range(n)]


def test_fit_and_route_end_to_end(tmp_path, capsys):
  _write_queries(tmp_path / "ref.jsonl", _travel(60))
  incoming = _travel(10, offset=3) + [MATH[i % 3].format(i, i + 2) for i in range(10)]
  _write_queries(tmp_path / "in.jsonl", incoming)

  assert cli.main(["fit", "--reference", str(tmp_path / "ref.jsonl"), "--out",
                   str(tmp_path / "router")]) == 0
  manifest = json.loads((tmp_path / "router" / "manifest.json").read_text())
  assert manifest["format"] == "toolscout-router/1"
  assert manifest["threshold_source"] == "reference-holdout"
  assert all(0 <= t <= 1 for t in manifest["thresholds"].values())

  out = tmp_path / "routes.jsonl"
  assert cli.main(["route", "--router", str(tmp_path / "router"), "--queries",
                   str(tmp_path / "in.jsonl"), "--out", str(out)]) == 0
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert [r["query_id"] for r in rows] == [f"q{i}" for i in range(20)]
  assert all(set(r) == {"query_id", "distance", "route"} for r in rows)
  tau = manifest["thresholds"]["1"]
  for r in rows:
    assert 0 <= r["distance"] <= 1
    assert r["route"] == ("specialist" if r["distance"] < tau else "aggregate")
  assert all(r["route"] == "aggregate" for r in rows[10:])  # no shared vocabulary
  assert sum(r["route"] == "specialist" for r in rows[:10]) >= 8

  # A given threshold overrides the default; window and batch modes run.
  assert cli.main(["fit", "--reference", str(tmp_path / "ref.jsonl"), "--out",
                   str(tmp_path / "router"), "--threshold", "0.5", "--force"]) == 0
  for mode in (["--window", "5"], ["--batch", "4"]):
    assert cli.main(["route", "--router", str(tmp_path / "router"), "--queries",
                     str(tmp_path / "in.jsonl"), "--out", str(out), "--force"] + mode) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(r["route"] == ("specialist" if r["distance"] < 0.5 else "aggregate") for r in rows)
  assert rows[0]["distance"] == rows[3]["distance"]  # one batch of 4
  # Refuses to clobber without --force.
  assert cli.main(["route", "--router", str(tmp_path / "router"), "--queries",
                   str(tmp_path / "in.jsonl"), "--out", str(out)]) == 2
  assert "already exists" in capsys.readouterr().err


def test_router_directory_round_trip(tmp_path):
  texts = _travel(40)
  fp = fpr.fit_fingerprint(texts)
  thresholds = router.default_thresholds([f"q{i}" for i in range(40)], texts)
  routerdir.save_router(routerdir.Router(fp, thresholds, "reference-holdout"), tmp_path / "r")
  loaded = routerdir.load_router(tmp_path / "r")
  assert loaded.thresholds == pytest.approx(thresholds)
  assert sorted(thresholds) == [1, 2, 5]  # 8 held-out queries: windows up to 5 fit
  probe = _travel(6, offset=5) + ["integrate x squared", ""]
  np.testing.assert_allclose(fpr.request_distances(loaded.fingerprint, probe),
                             fpr.request_distances(fp, probe))


def _run_script(*args):
  """The CLI in a fresh interpreter, as a user would run it."""
  return subprocess.run([sys.executable, "-m", "toolscout.cli", *args], capture_output=True,
                        text=True, timeout=120)


@pytest.mark.heavy
def test_bad_inputs_are_clear_errors(tmp_path):
  _write_queries(tmp_path / "ref.jsonl", _travel(40))
  (tmp_path / "empty.jsonl").write_text("")
  _write_queries(tmp_path / "small.jsonl", _travel(5))
  assert cli.main(["fit", "--reference", str(tmp_path / "ref.jsonl"), "--out",
                   str(tmp_path / "router")]) == 0
  manifest = tmp_path / "router" / "manifest.json"
  info = json.loads(manifest.read_text())
  (tmp_path / "old").mkdir()
  for name in ("vocabulary.json", "arrays.npz"):
    (tmp_path / "old" / name).write_bytes((tmp_path / "router" / name).read_bytes())
  (tmp_path / "old" / "manifest.json").write_text(json.dumps({**info, "format": "toolscout-router/0"}))
  (tmp_path / "bad_tau").mkdir()
  for name in ("vocabulary.json", "arrays.npz"):
    (tmp_path / "bad_tau" / name).write_bytes((tmp_path / "router" / name).read_bytes())
  (tmp_path / "bad_tau" / "manifest.json").write_text(json.dumps({**info, "thresholds": {"1": 1.5}}))

  cases = [
      (["route", "--router", str(tmp_path / "router"), "--queries", str(tmp_path / "empty.jsonl"),
        "--out", str(tmp_path / "o.jsonl")], "no queries"),
      (["fit", "--reference", str(tmp_path / "small.jsonl"), "--out", str(tmp_path / "r2")],
       "only 5 reference queries"),
      (["route", "--router", str(tmp_path / "old"), "--queries", str(tmp_path / "ref.jsonl"),
        "--out", str(tmp_path / "o.jsonl")], "'toolscout-router/0' is not supported"),
      (["route", "--router", str(tmp_path / "bad_tau"), "--queries", str(tmp_path / "ref.jsonl"),
        "--out", str(tmp_path / "o.jsonl")], "thresholds {1: 1.5} are not window sizes"),
  ]
  for args, message in cases:
    result = _run_script(*args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
  assert not (tmp_path / "o.jsonl").exists()
  assert not (tmp_path / "r2").exists()


@pytest.mark.heavy
def test_experiment_tiny_writes_report(tmp_path, shared_data):
  out = tmp_path / "report"
  assert cli.main(["experiment", "--config", "tiny", "--out", str(out), "--set",
                   f"toollens_spec=beir:{shared_data / 'toollens'}"]) == 0
  report = json.loads((out / "report.json").read_text())
  assert (out / "report.png").stat().st_size > 10_000
  text = (out / "report.md").read_text()
  assert "Coverage@20 per source" in text and "Skill-card rendering check" in text
  assert report["config"]["name"] == "tiny"
  names = list(report["per_source"])
  assert names[0] == "toollens" and "toollens_api" in names
  for entry in report["per_source"].values():
    for value in entry["coverage"].values():
      assert 0 <= value <= 1
    assert 0 <= entry["detectors"]["tfidf"] <= 1
  assert set(report["detectors"]) == {"tfidf", "tfidf_tool", "semantic", "length_gap",
                                      "multistep_gap"}
  assert 0 <= report["summary"]["mixed_routed_batch"] <= 1
  assert report["skill_cards"]["example_card"].startswith("Skill: ")
  # Mode keys are typed; the Markdown shows their labels.
  assert list(report["routing"]["modes"]) == ["loso/batch", "loso/window_1", "loso/window_10",
                                              "default/batch", "default/window_1",
                                              "default/window_10"]
  assert "| rolling window 10, default tau (no labels) |" in text
  # A second run refuses to replace the report without --force, before any work.
  before = _snapshot(out)
  assert cli.main(["experiment", "--config", "tiny", "--out", str(out)]) == 2
  assert _snapshot(out) == before


# --- Outputs: --force replaces only its own kind; missing places are clear errors ---------------


def _snapshot(path):
  """Every file under ``path`` (or ``path`` itself) with its bytes."""
  if path.is_file():
    return {path.name: path.read_bytes()}
  return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _hyset_model_dir(path):
  """A directory shaped like a hyset model directory (its own manifest.json format)."""
  from hyset_jax.io import modeldir
  path.mkdir()
  (path / "manifest.json").write_text(json.dumps({"format": modeldir.FORMAT, "tool_ids": ["a"],
                                                  "max_set_size": 5, "k1": 15, "k_pool": 20}))
  (path / "params.safetensors").write_bytes(b"\x00weights\x01" * 10)
  return path


def _error(capsys):
  err = capsys.readouterr().err
  assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
  return err


def test_route_on_a_hyset_model_dir_is_not_a_router(tmp_path, capsys):
  model = _hyset_model_dir(tmp_path / "hyset_model")
  _write_queries(tmp_path / "in.jsonl", _travel(10))
  before = _snapshot(model)
  assert cli.main(["route", "--router", str(model), "--queries", str(tmp_path / "in.jsonl"),
                   "--out", str(tmp_path / "r.jsonl")]) == 2
  err = _error(capsys)
  assert "is not a toolscout router directory" in err and "'hyset/" in err
  assert "--force" not in err  # following the hint must not destroy the model
  # An older router is a router: refitting it (with --force) is the right hint there.
  (tmp_path / "router").mkdir()
  (tmp_path / "router" / "manifest.json").write_text('{"format": "toolscout-router/0"}')
  assert cli.main(["route", "--router", str(tmp_path / "router"), "--queries",
                   str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "r.jsonl")]) == 2
  assert "--force" in _error(capsys)
  assert _snapshot(model) == before and not (tmp_path / "r.jsonl").exists()


def test_fit_force_replaces_only_a_router(tmp_path, capsys):
  _write_queries(tmp_path / "ref.jsonl", _travel(40))
  fit = ["fit", "--reference", str(tmp_path / "ref.jsonl"), "--out"]
  model = _hyset_model_dir(tmp_path / "hyset_model")
  notes = tmp_path / "notes"
  notes.mkdir()
  (notes / "todo.txt").write_text("mine")
  (tmp_path / "file").write_text("a file")
  keep = {p: _snapshot(p) for p in (model, notes, tmp_path / "file")}
  for target, without, with_force in (
      (model, "pass --force", "not a toolscout router directory"),
      (notes, "pass --force", "not a toolscout router directory"),
      (tmp_path / "file", "is a file", "is a file")):
    for force, message in (([], without), (["--force"], with_force)):
      assert cli.main(fit + [str(target)] + force) == 2
      assert message in _error(capsys), (target, force)
  assert {p: _snapshot(p) for p in keep} == keep  # nothing of another kind was touched

  # A router is replaced with --force only; an empty folder is written into.
  (tmp_path / "empty").mkdir()
  assert cli.main(fit + [str(tmp_path / "empty")]) == 0
  router_dir = tmp_path / "empty"
  first = _snapshot(router_dir)
  assert cli.main(fit + [str(router_dir), "--threshold", "0.5"]) == 2
  assert "pass --force" in _error(capsys) and _snapshot(router_dir) == first
  assert cli.main(fit + [str(router_dir), "--threshold", "0.5", "--force"]) == 0
  manifest = json.loads((router_dir / "manifest.json").read_text())
  assert manifest["thresholds"] == {"1": 0.5} and manifest["threshold_source"] == "given"
  assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_route_window_larger_than_the_stream_is_an_error(tmp_path, capsys):
  _write_queries(tmp_path / "ref.jsonl", _travel(40))
  _write_queries(tmp_path / "in.jsonl", _travel(20, offset=1))
  assert cli.main(["fit", "--reference", str(tmp_path / "ref.jsonl"), "--out",
                   str(tmp_path / "router")]) == 0
  route = ["route", "--router", str(tmp_path / "router"), "--queries", str(tmp_path / "in.jsonl"),
           "--out", str(tmp_path / "r.jsonl"), "--force"]
  for mode in (["--window", "21"], ["--batch", "50"]):
    assert cli.main(route + mode) == 2
    err = _error(capsys)
    assert f"{mode[0]} {mode[1]} is larger than the 20 queries in" in err
  assert not (tmp_path / "r.jsonl").exists()
  assert cli.main(route + ["--window", "20"]) == 0


def test_partial_windows_take_the_threshold_of_their_size(tmp_path):
  ref = _travel(40)
  fp = fpr.fit_fingerprint(ref)
  stream = _travel(7, offset=2)
  _write_queries(tmp_path / "in.jsonl", stream)
  window = fpr.window_distances(fp, stream, 5)
  chunks = fpr.chunk_distances(fp, stream, 5)  # chunks of 5 and 2
  # τ(1) and τ(2) just above the warm-up / last-chunk distances, τ(5) below every distance:
  # with τ(5) applied to every decision all would go to the aggregate.
  taus = {1: window[0] + 0.01, 2: max(window[1], chunks[-1]) + 0.01,
          5: min(window.min(), chunks.min()) - 0.01}
  routerdir.save_router(routerdir.Router(fp, taus, "given"), tmp_path / "router")
  for mode, sizes in ((["--window", "5"], [1, 2, 5, 5, 5, 5, 5]),
                      (["--batch", "5"], [5, 5, 5, 5, 5, 2, 2])):
    out = tmp_path / f"{mode[0][2:]}.jsonl"
    assert cli.main(["route", "--router", str(tmp_path / "router"), "--queries",
                     str(tmp_path / "in.jsonl"), "--out", str(out)] + mode) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    expected = ["specialist" if r["distance"] < router.threshold_for_window(taus, k)
                else "aggregate" for r, k in zip(rows, sizes)]
    assert [r["route"] for r in rows] == expected
    assert "specialist" in expected and "aggregate" in expected  # the sizes decided it
  np.testing.assert_array_equal(fpr.window_sizes(7, 5), [1, 2, 3, 4, 5, 5, 5])
  np.testing.assert_array_equal(fpr.chunk_sizes(7, 5), [5, 5, 5, 5, 5, 2, 2])


def test_every_command_refuses_bad_output_places(tmp_path, capsys):
  _write_queries(tmp_path / "ref.jsonl", _travel(40))
  assert cli.main(["fit", "--reference", str(tmp_path / "ref.jsonl"), "--out",
                   str(tmp_path / "router")]) == 0
  # A reference kept inside an (older) router directory: refitting over it would delete it.
  (tmp_path / "router" / "ref.jsonl").write_bytes((tmp_path / "ref.jsonl").read_bytes())
  (tmp_path / "file").write_text("a file")
  (tmp_path / "routes.jsonl").write_text("previous routes\n")
  under_file = str(tmp_path / "file" / "sub" / "out")
  missing = str(tmp_path / "no_such_folder" / "out")
  route = ["route", "--router", str(tmp_path / "router"), "--queries", str(tmp_path / "ref.jsonl"),
           "--out"]
  fit = ["fit", "--reference", str(tmp_path / "ref.jsonl"), "--out"]
  experiment = ["experiment", "--config", "tiny", "--out"]
  notes = tmp_path / "notes"
  notes.mkdir()
  (notes / "todo.txt").write_text("mine")
  keep = {p: _snapshot(p) for p in (tmp_path / "file", tmp_path / "routes.jsonl", notes,
                                    tmp_path / "router", tmp_path / "ref.jsonl")}
  cases = [
      (fit + [under_file], "is a file, not a folder"),
      (fit + [missing], "does not exist; create it first"),
      (["fit", "--reference", str(tmp_path / "router" / "ref.jsonl"), "--out",
        str(tmp_path / "router"), "--force"], "holds this command's input"),
      (route + [under_file + ".jsonl"], "is a file, not a folder"),
      (route + [missing + ".jsonl"], "does not exist; create it first"),
      (route + [str(tmp_path / "routes.jsonl")], "already exists"),
      (route + [str(notes), "--force"], "is a directory"),
      (route + [str(tmp_path / "ref.jsonl"), "--force"], "is one of this command's inputs"),
      (route + [str(tmp_path / "router" / "manifest.json"), "--force"], "inside this command's"),
      (experiment + [under_file], "is a file, not a folder"),
      (experiment + [missing], "does not exist; create it first"),
      (experiment + [str(tmp_path / "file"), "--force"], "is a file"),
      (experiment + [str(notes)], "pass --force"),
      (experiment + [str(notes), "--force"], "not a toolscout report directory"),
      (experiment + [str(tmp_path / "router"), "--force"], "not a toolscout report directory"),
  ]
  for args, message in cases:
    assert cli.main(args) == 2, args
    err = _error(capsys)
    assert message in err and err.startswith(f"error: --out {args[args.index('--out') + 1]}"), err
  assert {p: _snapshot(p) for p in keep} == keep
  assert not (tmp_path / "no_such_folder").exists()
  result = _run_script(*route, under_file + ".jsonl")  # as a user runs it: no traceback
  assert result.returncode == 2 and result.stderr.startswith(f"error: --out {under_file}.jsonl")
  assert "Traceback" not in result.stderr
