"""The config's trainer: one place that knows every Trainer (steps.py's, and
translation_steps.py's for the encoder_decoder layout), above both."""

from __future__ import annotations

import jax
import ml_collections

from selfattn.training.steps import Trainer
from selfattn.training.translation_steps import TranslationTrainer


def make_trainer(config: ml_collections.ConfigDict,
                 mesh: jax.sharding.Mesh | None = None) -> Trainer:
  """TranslationTrainer for the encoder_decoder layout, else Trainer."""
  if config.task.layout == 'encoder_decoder':
    return TranslationTrainer(config, mesh)
  return Trainer(config, mesh)
