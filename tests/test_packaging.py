"""A wheel built from the checkout works on its own: installed into a temporary folder and run
from another folder, it imports the installed copy (not the checkout), has its presets and its
console scripts."""
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

REPO = pathlib.Path(__file__).resolve().parents[1]
# What a source distribution holds for the build: the build files, the readme, the packages.
SOURCES = ("pyproject.toml", "setup.py", "README.md", "hyset_jax", "toolscout", "configs")


def _run(cmd, cwd, env, timeout=300):
  proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
  assert proc.returncode == 0, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
  return proc.stdout


def test_wheel_installs_and_runs_from_elsewhere(tmp_path):
  # Build from a copy, so the build's own files (build/, *.egg-info) never land in the checkout.
  src = tmp_path / "src"
  src.mkdir()
  for name in SOURCES:
    if not (REPO / name).exists():
      continue
    if (REPO / name).is_dir():
      shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    else:
      shutil.copy(REPO / name, src / name)
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
  _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
        "--wheel-dir", str(tmp_path / "wheel"), str(src)], tmp_path, env)
  (wheel,) = (tmp_path / "wheel").glob("hyset_jax-*.whl")
  site = tmp_path / "site"
  _run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(site), str(wheel)],
       tmp_path, env)

  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  env["PYTHONPATH"] = str(site)
  env["JAX_PLATFORMS"] = "cpu"
  out = _run([sys.executable, "-c", textwrap.dedent("""
      import hyset_jax, toolscout
      from hyset_jax import config
      from hyset_jax.io import reference
      print(hyset_jax.__file__)
      print(toolscout.__file__)
      print(reference.__file__)
      for name in ("tiny", "toollens", "bfcl"):
        print(name, type(config.resolve(name)).__name__)
      # the kernel's source ships, so it builds from the wheel
      from hyset_jax.inference import native
      import pathlib
      for f in native.SOURCES + native.HEADERS:
        assert f.is_file() and f.is_relative_to(pathlib.Path(reference.__file__).parents[1]), f
      """)], elsewhere, env)
  lines = out.splitlines()
  for line in lines[:3]:
    assert pathlib.Path(line).is_relative_to(site), (line, "imported the checkout, not the wheel")
  assert lines[3:] == ["tiny Config", "toollens Config", "bfcl Config"], out
  # The console scripts pip wrote into the target.
  for script, needle in (("hyset", "predict"), ("toolscout", "route")):
    text = _run([str(site / "bin" / script), "--help"], elsewhere, env)
    assert needle in text
  text = _run([sys.executable, "-m", "hyset_jax.io.reference", "--help"], elsewhere, env)
  assert "--query-embeddings" in text


# Files allowed to cite the background notes outside the repository: none (a new citation fails).
CITES_OUTSIDE: dict[str, str] = {}


def test_nothing_points_users_outside_the_repository():
  files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.split()
  me = pathlib.Path(__file__).relative_to(REPO).as_posix()
  citing = set()
  for name in files:
    path = REPO / name
    if name == me or not path.is_file() or path.suffix not in (".py", ".md", ".toml", ".txt",
                                                                 ".sh", ".yaml", ".sbatch"):
      continue
    text = path.read_text(encoding="utf-8", errors="replace")
    if "design.md" in text or "shared/docs" in text:
      citing.add(name)
  new, fixed = citing - set(CITES_OUTSIDE), set(CITES_OUTSIDE) - citing
  assert not new, f"cite the repository's docs (docs/contracts.md) instead: {sorted(new)}"
  assert not fixed, f"fixed: drop from CITES_OUTSIDE: {sorted(fixed)}"


def test_every_relative_link_in_the_docs_resolves():
  """README.md and docs/*.md link to files by relative paths (the results moved between them
  once); a link to a missing file fails here, not in a reader's browser."""
  import re
  broken = []
  for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text(encoding="utf-8")):
      if "://" not in target and not (doc.parent / target).exists():
        broken.append(f"{doc.relative_to(REPO)} -> {target}")
  assert not broken, broken
