"""Checkpoints that detect corruption, a source workdir that init_from never
touches, and the run's JSON files written whole or not at all."""

import hashlib
import json
import logging as std_logging
import os
import pathlib
import shutil
import tempfile

import numpy as np
import pytest

from runs import thirty_steps_config
from selfattn.training import checkpoints
from selfattn import errors
from selfattn.training import train
from selfattn.training import workdir as workdir_lib
from selfattn.training.steps import Trainer
from runs import saved_params
from tiers import EXTENDED

# A probe that makes tensorstore's reading fail (below) can leave a late
# callback into orbax's closed event loop, as in test_faults: only that
# exact error is ignored.
pytestmark = pytest.mark.filterwarnings(
    r'ignore:(?s)Exception ignored in.*Event loop is closed'
    r':pytest.PytestUnraisableExceptionWarning')




@pytest.fixture(scope='module')
def finished_run(tmp_path_factory):
  """One finished 30-step run with checkpoints 10, 20, 30 (shared, read only)."""
  workdir = tmp_path_factory.mktemp('finished')
  train.train_and_evaluate(thirty_steps_config(), str(workdir))
  return workdir


@pytest.fixture(scope='module')
def template():
  """A fresh state laid out like the run's, to restore into."""
  return Trainer(thirty_steps_config()).init_state()


def _data_files(step_dir):
  """The array data files of a checkpoint (tensorstore's ocdbt layout:
  default/ocdbt.process_N/d/<hash>), largest first."""
  files = [os.path.join(d, f) for d, _, names in os.walk(step_dir / 'default')
           for f in names if os.path.basename(d) == 'd' and 'ocdbt' in d]
  assert files, f'no array data under {step_dir}'
  return sorted(files, key=os.path.getsize, reverse=True)


def _flip(path, offset):
  with open(path, 'r+b') as f:
    f.seek(offset)
    byte = f.read(1)
    f.seek(offset)
    f.write(bytes([byte[0] ^ 0xFF]))


def _restore_unverified(step_dir, template, part=None):
  """What orbax alone restores from a step directory (no checksum check),
  as a list of arrays: the whole state's, or `part`'s ('params')."""
  import jax
  import orbax.checkpoint as ocp
  target = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
  restored = ocp.StandardCheckpointer().restore(str(step_dir / 'default'),
                                                target)
  restored = restored if part is None else restored[part]
  return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(restored))]


def _flip_a_byte(step_dir, template, scratch, part=None):
  """Inverts one byte of the checkpoint's array data: the first byte, in a
  scan of the data files, that orbax restores without an error but with
  other values in the state, or in its `part` ('params') where one is named
  (much of a data file is never read back, and some bytes make
  tensorstore's decompression fail, which was caught before checksums).
  Each candidate is tried on a fresh copy under `scratch`, then flipped in
  `step_dir`."""
  scratch = pathlib.Path(tempfile.mkdtemp(dir=scratch))
  original = _restore_unverified(step_dir, template, part)
  for data in _data_files(step_dir):
    relative = os.path.relpath(data, step_dir)
    size = os.path.getsize(data)
    for offset in range(size // 32, size, max(1, size // 32)):
      probe = scratch / 'probe'
      shutil.rmtree(probe, ignore_errors=True)
      shutil.copytree(step_dir, probe)
      _flip(probe / relative, offset)
      try:
        restored = _restore_unverified(probe, template, part)
      except Exception:      # noqa: BLE001 - damage orbax already notices
        continue
      if any(not np.array_equal(a, b) for a, b in zip(original, restored)):
        _flip(data, offset)
        return
  pytest.fail(f'no byte of {step_dir} changes what orbax restores')


def _copy(finished_run, tmp_path, keep):
  """A copy of the finished run as if stopped after the last step in `keep`."""
  workdir = tmp_path / 'run'
  shutil.copytree(finished_run, workdir)
  os.remove(workdir / workdir_lib.SUMMARY_FILE)
  for step in (10, 20, 30):
    if step not in keep:
      shutil.rmtree(workdir / 'checkpoints' / str(step))
  return workdir


def _tree_digest(root):
  """Every path under root with its bytes' hash (directories included)."""
  out = {}
  for d, dirs, files in os.walk(root):
    for name in dirs:
      out[os.path.relpath(os.path.join(d, name), root)] = 'dir'
    for name in files:
      path = os.path.join(d, name)
      with open(path, 'rb') as f:
        out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
  return out


def test_each_checkpoint_stores_a_checksum_of_its_arrays(finished_run):
  with open(finished_run / 'checkpoints' / '30' / '_CHECKPOINT_METADATA') as f:
    stored = json.load(f)['custom_metadata'][checkpoints.CHECKSUM_KEY]
  assert stored['algorithm'] == 'sha256'
  assert any('params' in leaf for leaf in stored['leaves'])
  assert all(len(h) == 64 for h in stored['leaves'].values())


def test_a_flipped_byte_falls_back_to_the_previous_checkpoint(
    finished_run, template, tmp_path, caplog):
  """One flipped byte in the newest checkpoint's array data used to restore
  silently (one leaf wrong); now that step is rejected with a one-line
  warning naming it and the reason, moved aside, and the previous one
  restored exactly."""
  workdir = _copy(finished_run, tmp_path, keep=(10, 20))
  _flip_a_byte(workdir / 'checkpoints' / '20', template, tmp_path)
  # Step 20 was already set aside once (damaged, then written again).
  (workdir / 'checkpoints' / '20.damaged').mkdir()
  mngr = checkpoints.manager(str(workdir), 5)
  with caplog.at_level(std_logging.WARNING):
    state, step = checkpoints.restore_latest(mngr, template)
  mngr.close()
  assert step == 10
  import jax
  for a, b in zip(saved_params(finished_run, 10),
                  jax.tree.leaves(jax.device_get(state['params'])), strict=True):
    np.testing.assert_array_equal(a, b)
  warnings = [r.getMessage() for r in caplog.records
              if r.levelno >= std_logging.WARNING and 'step 20' in r.getMessage()]
  assert len(warnings) == 1 and 'checksum' in warnings[0], warnings
  assert '\n' not in warnings[0]
  assert os.path.isdir(workdir / 'checkpoints' / '20.damaged')
  assert os.path.isdir(workdir / 'checkpoints' / '20.damaged.1' / 'default')


def test_a_flipped_byte_in_the_only_checkpoint_is_a_clear_error(
    finished_run, template, tmp_path):
  workdir = _copy(finished_run, tmp_path, keep=(10,))
  _flip_a_byte(workdir / 'checkpoints' / '10', template, tmp_path)
  mngr = checkpoints.manager(str(workdir), 5)
  with pytest.raises(errors.CheckpointError,
                     match=r'no checkpoint .* restores: step 10 \(.*checksum'):
    checkpoints.restore_latest(mngr, template)
  mngr.close()


def test_divergence_after_a_rejected_checkpoint_names_the_restored_one(
    finished_run, template, tmp_path, monkeypatch):
  """The non-finite guard names the checkpoint to go back to: the one this
  run restored and verified, never a corrupted one (which used to be
  restored silently and then named as 'the last good checkpoint')."""
  workdir = _copy(finished_run, tmp_path, keep=(10, 20))
  _flip_a_byte(workdir / 'checkpoints' / '20', template, tmp_path)
  # Divergence, as the loop sees it at its next checkpoint.
  class Diverging(Trainer):
    def __init__(self, config, mesh=None, task=None):
      super().__init__(config, mesh, task)
      self.healthy = lambda state: False

  monkeypatch.setattr(train, 'make_trainer', Diverging)
  with pytest.raises(errors.NonFiniteError,
                     match=r'the last good checkpoint is step 10 in '):
    train.train_and_evaluate(thirty_steps_config(), str(workdir))


def test_a_checkpoint_saved_without_a_checksum_still_restores(
    finished_run, template, tmp_path, caplog):
  """Checkpoints written before checksums existed restore as before, with a
  warning that they were not verified."""
  workdir = _copy(finished_run, tmp_path, keep=(10,))
  path = workdir / 'checkpoints' / '10' / '_CHECKPOINT_METADATA'
  metadata = json.loads(path.read_text())
  del metadata['custom_metadata'][checkpoints.CHECKSUM_KEY]
  path.write_text(json.dumps(metadata))
  mngr = checkpoints.manager(str(workdir), 5)
  with caplog.at_level(std_logging.WARNING):
    _, step = checkpoints.restore_latest(mngr, template)
  mngr.close()
  assert step == 10
  assert any('without a checksum' in r.getMessage() for r in caplog.records)


def test_init_from_never_modifies_the_source_workdir(finished_run, template,
                                                     tmp_path, caplog):
  """Damaged checkpoints in the source used to be renamed to .damaged (an
  emptied one) or restored silently (a flipped byte): the source is another
  run's workdir and must stay byte for byte as it was. The new run starts
  from the source's newest good checkpoint; a source whose checkpoints are
  all damaged stops the run with one clear error."""
  source = tmp_path / 'source'
  shutil.copytree(finished_run, source)
  for entry in (source / 'checkpoints' / '30').iterdir():
    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
  # A parameter's byte: init_from reads the parameters alone.
  _flip_a_byte(source / 'checkpoints' / '20', template, tmp_path, 'params')
  before = _tree_digest(source)
  config = thirty_steps_config()
  config.train.init_from = str(source)
  config.train.num_steps = config.eval.every = config.train.checkpoint_every = 10
  # The absl logger's own level, not the root's: a test that parsed absl
  # flags earlier in the same worker leaves it at WARNING (--verbosity=-1).
  with caplog.at_level(std_logging.INFO, logger='absl'):
    summary = train.train_and_evaluate(config, str(tmp_path / 'new'))
  assert _tree_digest(source) == before
  assert summary['step'] == 10
  messages = [r.getMessage() for r in caplog.records]
  assert any(f'parameters of {source} (its step 10)' in m for m in messages)
  skipped = [m for m in messages if m.startswith('skipping checkpoint')]
  assert len(skipped) == 2 and all('left in place' in m for m in skipped)
  assert 'step 30' in skipped[0]
  assert 'step 20' in skipped[1] and 'checksum' in skipped[1]

  only = tmp_path / 'only'
  shutil.copytree(finished_run, only)
  for step in (10, 20):
    shutil.rmtree(only / 'checkpoints' / str(step))
  _flip_a_byte(only / 'checkpoints' / '30', template, tmp_path, 'params')
  before = _tree_digest(only)
  config.train.init_from = str(only)
  with pytest.raises(errors.CheckpointError,
                     match=f'config.train.init_from={str(only)!r}: no '
                     r'checkpoint .* restores: step 30 \(.*checksum'):
    train.train_and_evaluate(config, str(tmp_path / 'new2'))
  assert _tree_digest(only) == before
  # Read before config.json is stored: the command with a good source runs
  # in the same workdir.
  assert not (tmp_path / 'new2' / 'config.json').exists()


def test_read_params_verifies_the_parameters_alone(finished_run, tmp_path,
                                                   caplog):
  """checkpoints.read_params restores {'params'} alone, laid out as asked: a
  recorded digest that no longer matches a parameter makes the step
  unreadable (skipped for an older one, or an error when named), while one
  of the optimiser state's, which it does not verify, changes nothing."""
  import jax
  workdir = _copy(finished_run, tmp_path, keep=(10, 20))
  layout = Trainer(thirty_steps_config()).params_layout()

  def tamper(step, prefix):
    path = workdir / 'checkpoints' / str(step) / '_CHECKPOINT_METADATA'
    metadata = json.loads(path.read_text())
    leaves = metadata['custom_metadata'][checkpoints.CHECKSUM_KEY]['leaves']
    name = next(k for k in sorted(leaves) if k.startswith(prefix))
    leaves[name] = '0' * 64
    path.write_text(json.dumps(metadata))
    return name

  tamper(20, "['opt_state']")
  params, step = checkpoints.read_params(str(workdir), layout)
  assert step == 20
  for got, want, saved in zip(jax.tree.leaves(params), jax.tree.leaves(layout),
                              saved_params(finished_run, 20), strict=True):
    assert got.sharding == want.sharding
    np.testing.assert_array_equal(np.asarray(got), saved)

  name = tamper(20, "['params']")
  with caplog.at_level(std_logging.WARNING):
    _, step = checkpoints.read_params(str(workdir), layout)
  assert step == 10
  skipped = [r.getMessage() for r in caplog.records
             if r.getMessage().startswith('skipping checkpoint at step 20')]
  assert len(skipped) == 1 and name in skipped[0]
  with pytest.raises(errors.CheckpointError,
                     match=r'step 20 .*\(checksum mismatch: 1 of \d+ arrays'):
    checkpoints.read_params(str(workdir), layout, step=20)


def test_read_params_refuses_a_layout_of_other_parameters(finished_run):
  """Orbax's partial restore alone would drop a saved parameter the layout
  leaves out and hand back a placeholder for one it adds: each is named."""
  from flax import nnx
  layout = Trainer(thirty_steps_config()).params_layout()
  flat = dict(nnx.to_flat_state(layout))
  dropped = sorted(flat)[0]
  fewer = nnx.from_flat_state({k: v for k, v in flat.items() if k != dropped})
  with pytest.raises(errors.CheckpointError,
                     match=r"step 30 .*its params are not this layout's: "
                     + '/'.join(map(str, dropped)) + ': not in this model'):
    checkpoints.read_params(str(finished_run), fewer, step=30)
  extra = dict(flat)
  extra[('extra', 'kernel')] = flat[dropped]
  with pytest.raises(errors.CheckpointError,
                     match=r'no checkpoint in .* restores: step 30 .*'
                     r'extra/kernel: not in the checkpoint'):
    checkpoints.read_params(str(finished_run), nnx.from_flat_state(extra))


# Extended: init_from's source is read once, at the start, in
# test_init_from_never_modifies_the_source_workdir and
# test_train.py::test_training_longer_goes_through_init_from_and_the_guard_needs_no_config_json
# (tests/README.md); this regression test reruns and resumes a derived run
# after its source is gone.
@EXTENDED
def test_a_derived_run_outlives_its_source(finished_run, tmp_path):
  """init_from is read when a run starts, and only then: once the source
  workdir is gone, rerunning the finished derived run returns its summary
  and resuming it from its own checkpoint works (both used to fail with
  'init_from is not a workdir'). A source whose config.json is truncated
  is one ConfigError naming the file, and the new workdir is not left
  behind (it used to be a JSONDecodeError traceback and a stray .lock)."""
  source = tmp_path / 'source'
  shutil.copytree(finished_run, source)
  config = thirty_steps_config()
  config.train.init_from = str(source)
  config.train.num_steps = config.eval.every = config.train.checkpoint_every = 10
  derived = tmp_path / 'derived'
  first = train.train_and_evaluate(config, str(derived))
  shutil.rmtree(source)
  assert train.train_and_evaluate(config, str(derived)) == first
  (derived / 'summary.json').unlink()          # stopped after its checkpoint
  assert train.train_and_evaluate(config, str(derived))['step'] == 10

  truncated = tmp_path / 'truncated'
  shutil.copytree(finished_run, truncated)
  (truncated / 'config.json').write_text('{"model": {"num_')
  config.train.init_from = str(truncated)
  fresh = tmp_path / 'fresh'
  with pytest.raises(errors.ConfigError, match=(
      r'truncated/config.json \(the config of config.train.init_from=.*\) '
      r'cannot be read')):
    train.train_and_evaluate(config, str(fresh))
  assert not fresh.exists()


def test_an_interrupted_summary_write_leaves_no_partial_file(
    finished_run, tmp_path, monkeypatch):
  """summary.json is replaced whole (temp file + os.replace): a write that
  fails half way (a full disk) leaves no truncated summary behind, which the
  next run would read as the finished run's."""
  workdir = _copy(finished_run, tmp_path, keep=(30,))
  real_dump = json.dump
  failed = []

  def half_then_fail(obj, f, *args, **kwargs):
    if isinstance(obj, dict) and 'score' in obj and 'history' in obj:
      text = json.dumps(obj, *args, **kwargs)
      f.write(text[:len(text) // 2])
      f.flush()
      failed.append(True)
      raise OSError(28, 'No space left on device')
    return real_dump(obj, f, *args, **kwargs)

  monkeypatch.setattr(json, 'dump', half_then_fail)
  with pytest.raises(OSError, match='No space left'):
    train.train_and_evaluate(thirty_steps_config(), str(workdir))
  assert failed
  assert not (workdir / workdir_lib.SUMMARY_FILE).exists()
  assert not [n for n in os.listdir(workdir) if 'tmp' in n]


def test_rerunning_a_finished_run_does_not_rewrite_its_config(finished_run,
                                                              tmp_path):
  """The stored config is the one the summary came from: a rerun (even with
  other evaluation lengths, which a resumed run may change) leaves it as it
  was, contents and modification time."""
  workdir = tmp_path / 'run'
  shutil.copytree(finished_run, workdir)
  path = workdir / workdir_lib.CONFIG_FILE
  contents, mtime = path.read_bytes(), path.stat().st_mtime_ns
  config = thirty_steps_config()
  assert train.train_and_evaluate(config, str(workdir))['step'] == 30
  config.eval.lengths = [4, 8]
  assert train.train_and_evaluate(config, str(workdir))['step'] == 30
  assert path.read_bytes() == contents
  assert path.stat().st_mtime_ns == mtime


def _listing(workdir):
  """Every file and folder under workdir with its size and modification
  time."""
  return sorted((os.path.relpath(os.path.join(d, f), workdir),
                 os.path.getsize(os.path.join(d, f)),
                 os.path.getmtime(os.path.join(d, f)))
                for d, folders, names in os.walk(workdir)
                for f in folders + names)


def test_load_model_gives_a_run_back_from_its_workdir_alone(finished_run,
                                                            tmp_path):
  """selfattn.training.load_model: the stored config, the latest or a named
  kept checkpoint's parameters (read here by orbax directly), the workdir
  untouched; a folder that is not a run, or a run without checkpoints, is
  a clear error."""
  import jax
  from flax import nnx
  from selfattn.training import load_model
  before = _listing(finished_run)
  run = load_model(str(finished_run))
  model, config = run.model, run.config
  assert run.step == 30
  expected = thirty_steps_config()
  assert config.model.to_dict() == expected.model.to_dict()
  assert config.task.name == expected.task.name
  assert config.train.num_steps == 30

  def params(m):
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(m, nnx.Param))]

  for got, saved in zip(params(model), saved_params(finished_run), strict=True):
    np.testing.assert_array_equal(got, saved)
  at_10 = load_model(str(finished_run), step=10).model
  for got, saved in zip(params(at_10), saved_params(finished_run, 10),
                        strict=True):
    np.testing.assert_array_equal(got, saved)
  assert any((a != b).any() for a, b in zip(params(at_10), params(model)))
  assert _listing(finished_run) == before          # read only
  with pytest.raises(FileNotFoundError, match='holds no config.json'):
    load_model(str(tmp_path))
  no_checkpoints = tmp_path / 'no_checkpoints'
  no_checkpoints.mkdir()
  shutil.copy(finished_run / 'config.json', no_checkpoints / 'config.json')
  with pytest.raises(FileNotFoundError, match='no checkpoint in'):
    load_model(str(no_checkpoints))
