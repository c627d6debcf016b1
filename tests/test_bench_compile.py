"""`hyset bench compile`: the CPU path compiles every configuration and reports sane numbers;
the TPU path without libtpu and the argument errors exit 2 naming what is wrong."""
import importlib.util
import json

import pytest

from hyset_jax import cli


def test_cpu_topology_rows_are_present_and_sane(tmp_path, capsys):
  out = tmp_path / "compile.json"
  assert cli.main(["bench", "compile", "--topology", "cpu:8", "--num-tools", "200", "--dim", "16",
                   "--batches", "1,16", "--methods", "gather", "--sharded-tools", "400",
                   "--sharded-batch", "4", "--json", str(out)]) == 0
  r = json.loads(out.read_text())
  assert r["topology"] == "cpu:8" and r["num_devices"] == 8
  assert "provenance" in r or "command" in r
  rows = r["rows"]
  # 2 batches × 2 parts (e2e, stage 2), then one tools-sharded row.
  assert [(x["config"], x["part"], x["batch"]) for x in rows] == [
      ("replicated", "e2e", 1), ("replicated", "stage2", 1),
      ("replicated", "e2e", 16), ("replicated", "stage2", 16), ("tools-sharded", "e2e", 4)]
  for x in rows:
    assert x["error"] is None, x
    assert x["total_bytes"] > 0 and x["flops"] > 0 and x["bytes_accessed"] > 0
    assert x["total_bytes"] == (x["argument_bytes"] + x["output_bytes"] + x["temp_bytes"]
                                - x["alias_bytes"])
  assert (rows[0]["data_shards"], rows[2]["data_shards"]) == (1, 8)  # batch 1 cannot split
  sharded = rows[-1]
  assert (sharded["num_tools"], sharded["data_shards"], sharded["tool_shards"]) == (400, 1, 8)
  # Z, P Zᵀ, Z M_m and the table split 8 ways: a device holds less than the whole library.
  library = 400 * 16 * 4 * (1 + 1 + 4) + 400 * 20 * 8
  assert sharded["argument_bytes"] < library
  assert "| replicated | e2e | gather |" in capsys.readouterr().out


def test_pallas_compiles_on_eight_devices_with_bf16_products(tmp_path):
  """The Pallas stage 2 on a mesh of 8 devices: wrapped in a shard_map over the batch, so it
  compiles (Mosaic on a TPU slice refuses automatic partitioning); here with the bf16
  products of ``--precision bf16`` too."""
  out = tmp_path / "compile.json"
  assert cli.main(["bench", "compile", "--topology", "cpu:8", "--num-tools", "200", "--dim", "16",
                   "--batches", "16", "--methods", "pallas", "--sharded-tools", "0",
                   "--precision", "bf16", "--json", str(out)]) == 0
  r = json.loads(out.read_text())
  assert r["precision"] == "bf16"
  assert [(x["part"], x["data_shards"], x["error"]) for x in r["rows"]] == [
      ("e2e", 8, None), ("stage2", 8, None)]


def test_tpu_topology_without_libtpu_says_how_to_install(capsys, monkeypatch):
  if importlib.util.find_spec("libtpu") is not None:
    # With libtpu present, JAX's own missing-runtime error is what the command must translate.
    from jax.experimental import topologies

    def missing(**_):
      raise RuntimeError("JAX TPU support not installed; cannot generate TPU topology")
    monkeypatch.setattr(topologies, "get_topology_desc", missing)
  monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "1")
  assert cli.main(["bench", "compile", "--topology", "tpu:v5e:2x4"]) == 2
  assert "pip install libtpu" in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [
    (["--topology", "gpu:h100"], "expected tpu:NAME"),
    (["--topology", "cpu:0"], "cpu:N with N ≥ 1"),
    (["--topology", "cpu:9999"], "xla_force_host_platform_device_count=9999"),
    (["--topology", "cpu:1", "--k1", "30"], "k1"),
    (["--topology", "cpu:1", "--num-tools", "10"], "10"),
])
def test_argument_errors_exit_2(argv, says, capsys):
  assert cli.main(["bench", "compile", *argv]) == 2
  assert says in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["--topology", "cpu:1", "--batches", "1,x"],
    ["--topology", "cpu:1", "--batches", "0"],
    ["--topology", "cpu:1", "--methods", "native"],
    ["--num-tools", "100"],  # --topology is required
])
def test_bad_flags_are_refused_by_argparse(argv):
  with pytest.raises(SystemExit) as e:
    cli.main(["bench", "compile", *argv])
  assert e.value.code == 2


def test_sharded_tools_must_split_over_the_devices(capsys):
  assert cli.main(["bench", "compile", "--topology", "cpu:8", "--num-tools", "100", "--dim", "8",
                   "--sharded-tools", "1001"]) == 2
  assert "multiple of 8" in capsys.readouterr().err
