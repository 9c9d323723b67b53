"""The config's trainer: one place that knows every Trainer (steps.py's, and
translation_steps.py's for the encoder_decoder layout), above both."""

from __future__ import annotations

import jax
import ml_collections

from selfattn.tasks import Task
from selfattn.training.steps import Trainer
from selfattn.training.translation_steps import TranslationTrainer


def make_trainer(config: ml_collections.ConfigDict,
                 mesh: jax.sharding.Mesh | None = None,
                 task: Task | None = None) -> Trainer:
  """TranslationTrainer for the encoder_decoder layout, else Trainer;
  `task`: the one validate_config built (else built here)."""
  if config.task.layout == 'encoder_decoder':
    return TranslationTrainer(config, mesh, task)
  return Trainer(config, mesh, task)
