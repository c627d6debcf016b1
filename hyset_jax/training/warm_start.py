"""θ to start training from a saved model instead of the dense start (``train.init_model``).

Continued training — the paper's k-shot adaptation (a model trained without some categories,
trained on for a few steps on k labelled queries of each), a target-domain fine-tune after
cross-domain transfer, or a catalogue that grew since training — starts from a model directory
(the ``best/`` of a ``hyset train`` run, or any ``hyset import``). The model is carried onto the
data set's library first, exactly as ``hyset eval --model`` carries it
(:mod:`hyset_jax.io.carry`): a tool the model has not seen gets its frozen encoder embedding
(the z a tool gets at the dense start), a model tool the data set does not list is dropped.
Z's rows then follow the data set's tool order. Only θ's trained leaves are taken (Z, P, the
M_m, the query tower, the conditioned term); the post-θ fits (seen-set prior, lexical β,
abstention, the ranking) are fitted again on the new data after training, and the optimiser
starts fresh (Adam's moments of the old data would steer the first steps).
"""
from __future__ import annotations

import logging
import pathlib

import jax
import numpy as np

from hyset_jax import config as config_lib
from hyset_jax.errors import UserError
from hyset_jax.model import parameters
from hyset_jax.training.train_data import tool_encoder

log = logging.getLogger(__name__)


def _check(saved, path, data, mc: config_lib.ModelConfig) -> None:
  """The model and the config must describe the same θ layout and the same encoder."""
  if saved.query_encoder and data.query_encoder and saved.query_encoder != data.query_encoder:
    raise UserError(f"{path}: its query encoder {saved.query_encoder!r} is not the config's "
                    f"({data.query_encoder!r}); θ only fits the embeddings it was trained on")
  if saved.max_set_size != mc.max_set_size:
    raise UserError(f"{path}: max_set_size {saved.max_set_size}, the config has "
                    f"model.max_set_size = {mc.max_set_size}")
  params = saved.params
  if (params.tower is not None) != (mc.tower_depth > 0):
    raise UserError(f"{path}: {'has' if params.tower is not None else 'has no'} query tower, "
                    f"the config has model.tower_depth = {mc.tower_depth}")
  if (params.conditioned is not None) != mc.conditioned:
    raise UserError(f"{path}: {'has' if params.conditioned is not None else 'has no'} "
                    f"query-conditioned term, the config has model.conditioned = {mc.conditioned}")


def _library(data):
  from hyset_jax.data.types import ToolLibrary
  return ToolLibrary(tuple(data.tool_ids), tuple(data.tool_texts), ({},) * len(data.tool_ids))


def theta_from_model(path: str | pathlib.Path, data, mc: config_lib.ModelConfig) -> dict:
  """θ's trained leaves (``parameters.init_theta``'s layout, host arrays) from the model at
  ``path``, carried onto ``data``'s tools (a :class:`TrainingData`) in ``data``'s row order.

  Raises:
    UserError: an unreadable model, another encoder, M or term layout than the config's, or a
      library the model cannot be carried onto (tools without texts to embed).
  """
  from hyset_jax.io import carry, modeldir
  from hyset_jax.training.post_theta import strip
  # Without the post-θ fits: they are fitted again, and θ is what training left (Z as trained,
  # not the row blend's).
  saved = strip(modeldir.load_model_dir(path))
  _check(saved, path, data, mc)
  if tuple(saved.tool_ids) != tuple(data.tool_ids):
    if len(data.tool_texts) != len(data.tool_ids):
      raise UserError(f"{path}: its tools are not the data set's, and the data set carries no "
                      f"tool texts to add the missing ones with")
    # The data set's own encoder output is the z a new tool gets (carry's "encoder").
    saved, report = carry.carry(saved, _library(data), tool_encoder(data), name=str(path))
    log.info("%s", report.message(f"the training data ({path} carried onto it)"))
  rows = {t: i for i, t in enumerate(saved.tool_ids)}
  order = np.asarray([rows[t] for t in data.tool_ids])
  params = jax.tree.map(lambda a: np.asarray(a, np.float32), saved.params)
  params = params._replace(tool_embeddings=params.tool_embeddings[order])
  return parameters.theta_of(params, mc)
