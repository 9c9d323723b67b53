"""A trained run's model, from its workdir: where analysis after training
starts (attention maps, probes, sampling) without the training loop.

    from selfattn.training import load_model
    model, config = load_model('runs/shaw')          # its latest checkpoint
    logits = model(tokens, valid_lens)               # (B, L, vocab)

The run's own config.json says what to build (the fields added to selfattn
since it was written take the values that reproduce it), so the caller
names nothing but the workdir. The workdir is only read: no checkpoint
manager is opened on it, so a run still training there is not disturbed.
An encoding or task the run registered itself must be registered again
before loading (the config names it; the registry holds it).
"""

from __future__ import annotations

import os

import ml_collections

from selfattn.training import checkpoints
from selfattn.training import workdir as workdir_lib


def stored_config(workdir: str) -> ml_collections.ConfigDict:
  """The config the run in `workdir` trained with: its config.json, with
  every field added since it was written set to the value that reproduces
  it. Raises FileNotFoundError where there is none."""
  path = os.path.join(workdir, workdir_lib.CONFIG_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(
        f'{workdir} holds no {workdir_lib.CONFIG_FILE}: not the workdir of a '
        f'training run (python -m selfattn.main --workdir=...)')
  stored = workdir_lib.read_json_object(path, 'the stored config')
  return ml_collections.ConfigDict(workdir_lib.with_added_fields(stored))


def load_model(workdir: str, step: int | None = None,
               config: ml_collections.ConfigDict | None = None):
  """(model, config) of the run in `workdir`: the model (an nnx.Module in
  eval mode, dropout off; `model.train()` turns it back on) with the
  parameters of its latest checkpoint, or of `step` (one of the
  kept ones, checkpoints.saved_steps). `config` replaces the stored one
  (a study that built it holds it already). Every checkpoint is verified
  against its checksum; raises FileNotFoundError when there is none and
  CheckpointError when the one asked for does not restore.

  Builds the run's trainer, so a music or translation run needs its data
  set, as its training did."""
  from selfattn.training.trainers import make_trainer
  config = stored_config(workdir) if config is None else config
  trainer = make_trainer(config)
  if step is not None:
    restored = checkpoints.restore_step_read_only(
        workdir, trainer.init_state(), step)
  else:
    latest = checkpoints.restore_latest_read_only(workdir,
                                                  trainer.init_state())
    if latest is None:
      raise FileNotFoundError(f'no checkpoint in {workdir}')
    restored = latest[0]
  model = trainer.model(restored['params'])
  model.eval()
  return model, config
