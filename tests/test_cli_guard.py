"""The guard: every sub-command of ``hyset``, ``toolscout`` and ``reference.py`` against bad input
and bad outputs.

Each row of :data:`ROWS` is one command line with an input slot ``IN`` and an output slot
``OUT``; each case of :data:`CASES` fills them with something wrong:

  missing    IN does not exist
  garbage    IN exists but is not what the command reads
  existing   OUT exists (no --force)
  kind       OUT is the other kind (a folder for a file output, a file for a folder output),
             with --force
  onto-input OUT is the input itself, with --force
  unwritable OUT is under a regular file (``somefile/out``): the parent folder cannot be created
             or written. We run as root, which writes through any permission bits, and a read-only
             bind mount needs privileges tests should not assume; a path under a file is
             unwritable for every user.

and asserts exit code 2, exactly one ``error:`` line naming the offending path, no traceback,
and every file in the case's folder byte-identical afterwards (nothing created, nothing lost).
A new sub-command is covered by adding one row; :func:`test_every_sub_command_has_a_row` fails
until it has one.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from hyset_jax import cli
from hyset_jax.io import reference
from toolscout import cli as toolscout_cli

from test_predict_cli import write_model_dir

REPO = pathlib.Path(__file__).resolve().parents[1]
PRECIOUS = b"precious: must survive\n"


@dataclasses.dataclass(frozen=True)
class Row:
  """One command line. ``argv`` holds ``{IN}`` and ``{OUT}`` placeholders and ``{MODEL}``,
  ``{Q}``, ``{BEIR}``, ``{TEXTS}``, ``{ROUTER}``, ``{REF}``, ``{CKPT}`` for the valid inputs."""
  prog: str                       # "hyset", "toolscout" or "reference"
  argv: tuple[str, ...]
  inp: str | None                 # which valid input IN stands for (None: the row has none)
  out_kind: str                   # "file" or "dir"
  garbage: str = "file"           # "file": IN is a garbage file; "dir": a folder of garbage
  cases: tuple[str, ...] = ()     # default: all that apply
  force: bool = True              # the command has --force

  @property
  def name(self) -> str:
    words = [a for a in self.argv if not a.startswith(("-", "{")) and "{" not in a]
    return " ".join([self.prog] + words[:2])


ROWS = (
    Row("hyset", ("import", "--from", "hyset-pytorch", "{IN}", "--tools", "beir:{BEIR}",
                  "--out", "{OUT}"), "CKPT", "dir"),
    Row("hyset", ("compare", "{IN}", "{IN}", "--data", "beir:{BEIR}", "--split", "test", "--out",
                  "{OUT}"), "REF", "file"),
    Row("hyset", ("predict", "--model", "{MODEL}", "--query-embeddings", "{IN}", "--out",
                  "{OUT}"), "Q", "file"),
    Row("hyset", ("predict", "--model", "{IN}", "--query-embeddings", "{Q}", "--out", "{OUT}"),
        "MODEL", "file", garbage="dir"),
    Row("hyset", ("encode", "--texts", "{IN}", "--out", "{OUT}"), "TEXTS", "file"),
    Row("hyset", ("data", "stats", "beir:{IN}", "--json", "{OUT}"), "BEIR", "file",
        garbage="dir"),
    Row("hyset", ("data", "prepare", "beir:{IN}", "--out", "{OUT}"), "BEIR", "dir",
        garbage="dir"),
    Row("hyset", ("eval", "--data", "beir:{IN}", "--split", "test", "--method", "bm25", "--out",
                  "{OUT}"), "BEIR", "file", garbage="dir"),
    Row("hyset", ("eval", "--data", "beir:{BEIR}", "--split", "test", "--method", "hyset",
                  "--model", "{IN}", "--out", "{OUT}"), "MODEL", "file", garbage="dir"),
    # A workdir is resumed, so an existing one is not an error; a file or a model directory is.
    Row("hyset", ("train", "--config", "tiny", "--data", "beir:{IN}", "--workdir", "{OUT}"),
        "BEIR", "dir", garbage="dir",
        cases=("missing", "garbage", "kind", "model-dir", "unwritable"), force=False),
    Row("hyset", ("finetune", "--config", "tiny", "--data", "beir:{IN}", "--out", "{OUT}"),
        "BEIR", "dir", garbage="dir"),
    Row("hyset", ("export", "--workdir", "{IN}", "--out", "{OUT}"), "MODEL", "dir",
        garbage="dir"),
    Row("hyset", ("export", "--workdir", "{IN}", "--out", "{OUT}", "--format", "npz"), "MODEL",
        "dir", garbage="dir"),
    Row("hyset", ("bench", "enumerate", "--k-pool", "6", "--max-size", "3", "--batch", "2",
                  "--repeats", "1", "--impl", "numpy", "--json", "{OUT}"), None, "file"),
    Row("hyset", ("bench", "e2e", "--tools", "40", "--dim", "8", "--batch", "1", "--k1", "4",
                  "--k-pool", "8", "--max-size", "3", "--repeats", "1", "--json", "{OUT}"), None,
        "file"),
    Row("hyset", ("bench", "compile", "--topology", "cpu:1", "--num-tools", "40", "--dim", "8",
                  "--batches", "1", "--k1", "4", "--k-pool", "8", "--max-size", "3", "--methods",
                  "gather", "--sharded-tools", "0", "--json", "{OUT}"), None, "file"),
    Row("hyset", ("tools", "add", "--tools", "beir:{BEIR}", "--model", "{IN}", "--out", "{OUT}"),
        "MODEL", "dir", garbage="dir"),
    Row("hyset", ("tools", "remove", "--ids", "tool_0", "--model", "{IN}", "--out", "{OUT}"),
        "MODEL", "dir", garbage="dir"),
    # A server writes nothing: only its model input is guarded here (its requests: serve's tests).
    Row("hyset", ("serve", "--model", "{IN}"), "MODEL", "file", garbage="dir",
        cases=("missing", "garbage"), force=False),
    Row("toolscout", ("fit", "--reference", "{IN}", "--out", "{OUT}"), "REF", "dir"),
    Row("toolscout", ("route", "--router", "{ROUTER}", "--queries", "{IN}", "--out", "{OUT}"),
        "REF", "file"),
    Row("toolscout", ("route", "--router", "{IN}", "--queries", "{REF}", "--out", "{OUT}"),
        "ROUTER", "file", garbage="dir"),
    Row("toolscout", ("experiment", "--config", "tiny", "--out", "{OUT}"), None, "dir"),
    Row("reference", ("--model", "{MODEL}", "--query-embeddings", "{IN}", "--out", "{OUT}"), "Q",
        "file"),
    Row("reference", ("--model", "{IN}", "--query-embeddings", "{Q}", "--out", "{OUT}"), "MODEL",
        "file", garbage="dir"),
)

CASES = ("missing", "garbage", "existing", "kind", "onto-input", "unwritable")

# Rows and cases that do not hold yet, in code outside this test's owner's files: each entry
# says who fixes what. The test asserts the gap is still there, so fixing one fails here until
# its entry is deleted (it then runs as a normal case).
KNOWN_GAPS: dict[tuple[str, str], str] = {}


def _applies(row: Row, case: str) -> bool:
  if row.cases:
    return case in row.cases
  if case in ("missing", "garbage"):
    return row.inp is not None
  if case == "onto-input":
    # Writing a file onto a folder input is the "kind" case; a folder onto a file input too.
    return row.inp is not None and (row.out_kind == "file") == (row.garbage == "file")
  return True


PARAMS = [pytest.param(row, case, id=f"{row.name}[{i}]-{case}")
          for i, row in enumerate(ROWS) for case in CASES if _applies(row, case)]


# --------------------------------------------------------------------------- valid inputs

def _write_beir(root: pathlib.Path) -> pathlib.Path:
  (root / "qrels").mkdir(parents=True)
  tools = [{"_id": f"tool_{i}", "title": "", "text": f"tool {i} does thing {i}"}
           for i in range(24)]
  (root / "corpus.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tools))
  queries = [{"_id": f"q{i}", "text": f"please do thing {i % 24}"} for i in range(30)]
  (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
  for split, rows in (("train", range(20)), ("test", range(20, 30))):
    (root / "qrels" / f"{split}.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\ttool_{i % 24}\t1\n" for i in rows))
  return root


@pytest.fixture(scope="module")
def valid(tmp_path_factory, shared_data) -> dict[str, pathlib.Path]:
  """Valid inputs for every row, shared (read-only) by all cases."""
  root = tmp_path_factory.mktemp("valid")
  write_model_dir(root / "model")
  # The authors' checkpoint of the same model (its func_names are the BEIR library's ids).
  from hyset_jax.io.modeldir import load_model_dir
  from hyset_jax.io.peer.convert import write_export
  write_export(root / "ckpt", load_model_dir(root / "model"))
  np.save(root / "q.npy", np.random.default_rng(0).normal(size=(3, 6)).astype(np.float32))
  (root / "texts.jsonl").write_text('{"text": "get the weather"}\n')
  _write_beir(root / "beir")
  lines = (shared_data / "toollens" / "queries.jsonl").read_text().splitlines()[:200]
  (root / "ref.jsonl").write_text("\n".join(lines) + "\n")
  assert toolscout_cli.main(["fit", "--reference", str(root / "ref.jsonl"), "--out",
                             str(root / "router")]) == 0
  return {"MODEL": root / "model", "Q": root / "q.npy", "TEXTS": root / "texts.jsonl",
          "BEIR": root / "beir", "REF": root / "ref.jsonl", "ROUTER": root / "router",
          "CKPT": root / "ckpt" / "best.pt"}


# --------------------------------------------------------------------------- running

def run(prog: str, argv: list[str], capsys) -> tuple[int, str]:
  """Exit code and stderr of one in-process run (SystemExit from argparse included)."""
  main = {"hyset": cli.main, "toolscout": toolscout_cli.main, "reference": reference.main}[prog]
  try:
    rc = main(argv)
  except SystemExit as e:
    rc = e.code
  out, err = capsys.readouterr()
  return rc, out + err


def snapshot(root: pathlib.Path) -> dict[str, str]:
  """Every file and folder under ``root``: relative path -> sha256 of its bytes (or "dir")."""
  found = {}
  for dirpath, dirnames, filenames in os.walk(root):
    for name in dirnames:
      found[os.path.relpath(os.path.join(dirpath, name), root)] = "dir"
    for name in filenames:
      p = os.path.join(dirpath, name)
      found[os.path.relpath(p, root)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
  return found


def _copy(src: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
  import shutil
  if src.is_dir():
    shutil.copytree(src, dst)
  else:
    shutil.copy(src, dst)
  return dst


def _garbage(row: Row, where: pathlib.Path) -> pathlib.Path:
  if row.garbage == "file":
    where.write_bytes(b"\x00garbage, not what this command reads\n{{{\n")
  else:
    where.mkdir()
    for name in ("corpus.jsonl", "queries.jsonl", "manifest.json", "params.safetensors",
                 "arrays.npz", "vocabulary.json"):
      (where / name).write_bytes(b"{not json\n")
    (where / "qrels").mkdir()
    (where / "qrels" / "test.tsv").write_bytes(b"garbage\n")
  return where


def setup_case(row: Row, case: str, case_dir: pathlib.Path,
               valid: dict[str, pathlib.Path]) -> tuple[list[str], pathlib.Path]:
  """The argv of ``row`` under ``case`` and the path the error must name."""
  paths = {k: str(v) for k, v in valid.items()}
  inp = None
  if row.inp is not None:
    inp = _copy(valid[row.inp], case_dir / f"input_{valid[row.inp].name}")
  suffix = ".json" if row.out_kind == "file" else ""
  out = case_dir / f"out{suffix}"
  blame = out
  force = []
  if case == "missing":
    inp = case_dir / f"no_such_{valid[row.inp].name}"
    blame = inp
  elif case == "garbage":
    import shutil
    shutil.rmtree(inp) if inp.is_dir() else inp.unlink()
    inp = _garbage(row, inp)
    blame = inp
  elif case == "existing":
    if row.out_kind == "file":
      out.write_bytes(PRECIOUS)
    else:
      out.mkdir()
      (out / "mine.txt").write_bytes(PRECIOUS)
  elif case == "kind":
    if row.out_kind == "file":
      out.mkdir()
      (out / "mine.txt").write_bytes(PRECIOUS)
    else:
      out.write_bytes(PRECIOUS)
    force = ["--force"] if row.force else []
  elif case == "model-dir":
    out = _copy(valid["MODEL"], case_dir / "a_model")
    blame = out
  elif case == "onto-input":
    out = blame = inp
    force = ["--force"] if row.force else []
  elif case == "unwritable":
    (case_dir / "somefile").write_bytes(PRECIOUS)
    out = blame = case_dir / "somefile" / f"out{suffix}"
    force = ["--force"] if row.force else []
  paths["IN"] = str(inp) if inp is not None else ""
  paths["OUT"] = str(out)
  argv = [a.format(**paths) for a in row.argv] + force
  return argv, blame


def check_guard(row: Row, case: str, valid, case_dir: pathlib.Path, capsys) -> None:
  argv, blame = setup_case(row, case, case_dir, valid)
  before = snapshot(case_dir)
  rc, text = run(row.prog, argv, capsys)
  errors = [line for line in text.splitlines() if "error:" in line]
  assert rc == 2, (argv, text)
  assert "Traceback" not in text, text
  assert len(errors) == 1, text
  assert str(blame) in errors[0], (str(blame), errors[0])
  assert snapshot(case_dir) == before, "files changed"


@pytest.mark.parametrize("row,case", PARAMS)
def test_guard(row, case, valid, tmp_path, capsys):
  gap = KNOWN_GAPS.get((row.name, case))
  if gap is None:
    check_guard(row, case, valid, tmp_path, capsys)
    return
  try:
    check_guard(row, case, valid, tmp_path, capsys)
  except AssertionError:
    return
  pytest.fail(f"fixed ({gap}): delete its KNOWN_GAPS entry")


# --------------------------------------------------------------------------- coverage

def _sub_commands(parser) -> set[str]:
  names = set()
  for p in cli.subparsers_of(parser):
    if not any(a.__class__.__name__ == "_SubParsersAction" for a in p._actions):
      names.add(" ".join(p.prog.split()[:3]))
  return names


def test_every_sub_command_has_a_row():
  have = {row.name for row in ROWS}
  want = _sub_commands(cli.build_parser()) | _sub_commands(toolscout_cli.build_parser())
  missing = sorted(w for w in want if not any(h.startswith(w) for h in have))
  assert not missing, f"add a row to ROWS for: {missing}"


def test_reference_as_a_script_and_a_module(valid, tmp_path):
  """reference.py run as a file and as ``python -m``: the same guard, in a real process."""
  out = tmp_path / "out.json"
  out.write_bytes(PRECIOUS)
  for launcher in ([str(REPO / "hyset_jax" / "io" / "reference.py")], ["-m", "hyset_jax.io.reference"]):
    proc = subprocess.run([sys.executable, *launcher, "--model", str(valid["MODEL"]),
                           "--query-embeddings", str(valid["Q"]), "--out", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("error:") == 1 and str(out) in proc.stderr
    assert "Traceback" not in proc.stderr
  assert out.read_bytes() == PRECIOUS
