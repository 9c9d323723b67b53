"""A config's task and model: the one place that reads config.task and
config.model to build them (validation and the trainers both call it)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import ml_collections
from flax import nnx

from selfattn import tasks
from selfattn.nn import positions
from selfattn.nn.decoder import TransformerDecoder
from selfattn.nn.encoder import TransformerEncoder
from selfattn.nn.models import LanguageModel
from selfattn.nn.models import Seq2SeqModel
from selfattn.nn.models import SequenceModel
from selfattn.tasks import Task


def position_options(model: ml_collections.ConfigDict) -> dict[str, Any]:
  """The encoding options set in config.model (None fields left out). The
  option names come from the registry (positions.POSITIONS), never a list here."""
  return {name: model[name] for name in positions.option_types()
          if name in model and model[name] is not None}


def task_from_config(config: ml_collections.ConfigDict) -> tasks.Task:
  """The config's task (name, alphabet, layout, options)."""
  t = config.task
  options = {name: t[name] for name in tasks.DEFAULT_OPTIONS}
  return tasks.get_task(t.name, t.vocab_size, layout=t.layout, **options)



def build_model(config: ml_collections.ConfigDict, task: Task,
                rngs: nnx.Rngs) -> SequenceModel | LanguageModel | Seq2SeqModel:
  """The config's model for `task`: a LanguageModel (causal decoder) for a
  language-model task, a Seq2SeqModel for translation, else a
  SequenceModel (encoder and a linear head)."""
  m = config.model
  stack = dict(
      position=m.position, max_len=m.max_len, norm=m.norm,
      norm_type=m.norm_type, residual=m.residual,
      attention_impl=m.attention_impl,
      remat=bool(m.remat), scan_layers=bool(m.scan_layers), dtype=jnp.dtype(m.dtype),
      meter_period=int(m.meter_period), meter_step_tokens=int(m.meter_step_tokens),
      rngs=rngs, **position_options(m))
  sizes = (task.input_vocab_size, m.num_hiddens, m.ffn_num_hiddens,
           m.num_heads, m.num_layers, m.dropout)
  if task.spec.seq2seq:
    tie = bool(m.tie_embeddings)
    encoder = TransformerEncoder(*sizes, **stack)
    decoder = TransformerDecoder(*sizes, cross_attention=True,
                                 tie_output=tie, **stack)
    return Seq2SeqModel(encoder, decoder, tie_embeddings=tie)
  if task.spec.language_model:
    return LanguageModel(TransformerDecoder(*sizes, **stack), task.num_classes)
  encoder = TransformerEncoder(*sizes, causal=task.causal, **stack)
  return SequenceModel(encoder, task.num_classes, causal=task.causal,
                       rngs=rngs)
