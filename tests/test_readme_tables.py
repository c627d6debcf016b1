"""The README's results tables are what the result files say (benchmarks/readme_tables.py)."""

import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_readme_tables_match_the_result_files():
  """`python -m benchmarks.readme_tables --check`: a README edited by hand, or a result file
  rewritten without regenerating the README, fails here."""
  done = subprocess.run([sys.executable, "-m", "benchmarks.readme_tables", "--check"], cwd=REPO,
                        capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_check_fails_on_a_drifted_table(tmp_path):
  readme = tmp_path / "README.md"
  text = (REPO / "README.md").read_text(encoding="utf-8")
  assert "93.67 ± 0.76" in text
  readme.write_text(text.replace("93.67 ± 0.76", "99.99 ± 0.01", 1), encoding="utf-8")
  from benchmarks import readme_tables
  assert readme_tables.main(["--check", "--readme", str(readme)]) == 1
  assert readme_tables.main(["--readme", str(readme)]) == 0  # regenerates
  assert readme.read_text(encoding="utf-8") == text


def test_every_source_file_records_its_provenance():
  from benchmarks import readme_tables
  for rel in (r for files in readme_tables.SOURCES.values() for r in files
              if r.startswith("benchmarks/")):
    prov = json.loads((REPO / rel).read_text(encoding="utf-8"))["provenance"]
    assert {"commit", "command", "date", "machine"} <= set(prov), rel
    assert prov["command"].startswith("python -m benchmarks."), rel


def test_write_json_adds_provenance(tmp_path):
  from benchmarks import provenance
  path = provenance.write_json(tmp_path / "r.json", {"meta": {"x": 1}}, "python -m benchmarks.x")
  doc = json.loads(path.read_text())
  assert list(doc) == ["provenance", "meta"]
  assert doc["provenance"]["command"] == "python -m benchmarks.x"
  assert {"commit", "date", "machine"} <= set(doc["provenance"])
  rows = json.loads(provenance.write_json(tmp_path / "l.json", [1, 2]).read_text())
  assert rows["rows"] == [1, 2] and "provenance" in rows
