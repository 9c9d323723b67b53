"""A trained run's model, from its workdir: where analysis after training
starts (attention maps, probes, sampling) without the training loop.

    from selfattn.training import load_model
    run = load_model('runs/shaw')                    # its latest checkpoint
    logits = run.model(tokens, valid_lens)           # (B, L, vocab)

The run's own config.json says what to build (the fields added to selfattn
since it was written take the values that reproduce it), validated as a
run's config is, so the caller names nothing but the workdir. The model is
built on this process's first device, whatever mesh trained it. The
workdir is only read: no checkpoint manager is opened on it, so a run
still training there is not disturbed. An encoding or task the run
registered itself must be registered again first (import the module that
registers it): the config names it, the registry holds it.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import ml_collections
from flax import nnx

from selfattn.training import checkpoints
from selfattn.training import workdir as workdir_lib


class Trained(NamedTuple):
  """What load_model gives back.

  model: the nnx.Module with the checkpoint's parameters, in eval mode
    (dropout off; `model.train()` turns it back on). A synthetic task's or
    music's is called as `model(tokens, valid_lens)`; translation's as
    `model(source, source_lens, decoder_inputs=...)`.
  config: the run's stored config.
  step: the step of the checkpoint loaded (the latest that restores
    unless one was named: a damaged newest one is skipped, with a warning).
  trainer: the run's trainer, for what the model does not hold: its task
    (`trainer.task`), and for translation its corpus and tokenizer
    (`trainer.corpus.tokenizer`) and decoding
    (`trainer.translate_texts(nnx.state(model, nnx.Param), sentences)`).
  """
  model: nnx.Module
  config: ml_collections.ConfigDict
  step: int
  trainer: Any


def stored_config(workdir: str) -> ml_collections.ConfigDict:
  """The config the run in `workdir` trained with: its config.json, with
  every field added since it was written set to the value that reproduces
  it. Raises FileNotFoundError where there is none, ConfigError where it
  is not a JSON object."""
  path = os.path.join(workdir, workdir_lib.CONFIG_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(
        f'{workdir} holds no {workdir_lib.CONFIG_FILE}: not the workdir of a '
        f'training run (python -m selfattn.main --workdir=...)')
  stored = workdir_lib.read_json_object(path, 'the stored config')
  return ml_collections.ConfigDict(workdir_lib.with_added_fields(stored))


def load_model(workdir: str, step: int | None = None,
               config: ml_collections.ConfigDict | None = None) -> Trained:
  """The run in `workdir` with the parameters of its latest checkpoint, or
  of `step` (one of the kept ones, checkpoints.saved_steps). `config`
  replaces the stored one (a study that built it holds it already). Only
  the parameters are read (not the optimiser state), verified against the
  checksums saved with them.

  Raises FileNotFoundError when the workdir has no config or no
  checkpoint, ConfigError when its config does not validate (a task or
  encoding not registered in this process, say), CheckpointError when the
  step asked for does not restore, or without a step when none does (a
  `config` that builds other parameters than the run's is named there).
  Builds the run's trainer, so a music or translation run needs its data
  set, as its training did."""
  from selfattn.training.config_checks import validate_config
  from selfattn.training.steps import data_mesh
  from selfattn.training.trainers import make_trainer
  config = stored_config(workdir) if config is None else config
  task = validate_config(config)
  trainer = make_trainer(config, data_mesh(1), task)
  found = checkpoints.read_params(workdir, trainer.params_layout(), step)
  if found is None:
    raise FileNotFoundError(f'no checkpoint in {workdir}')
  params, step = found
  model = trainer.model(params)
  model.eval()
  return Trained(model, config, int(step), trainer)
