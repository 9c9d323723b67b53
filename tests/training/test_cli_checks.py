"""The command line's checks before absl parses a flag
(selfattn/training/cli_checks.py), in process: each problem is one line that
names what is wrong. That selfattn.main prints such a line and exits 2 with
nothing written is checked through real processes in test_train.py
(test_cli_mistakes_get_one_line_not_a_traceback,
test_cli_reports_bad_config_in_one_line); the same cases through the
command line are test_cli_errors.py's, in the extended tier."""

import os
import textwrap

import pytest

from runs import ROOT
from selfattn.training import cli_checks

TINY = os.path.join(ROOT, 'configs', 'tiny.py')


def _problem(*argv: str) -> str:
  config, _, problem = cli_checks.config_from_argv(list(argv))
  assert config is None and problem, argv
  assert '\n' not in problem
  return problem


def _config_file(tmp_path, body: str) -> str:
  path = tmp_path / 'user_config.py'
  path.write_text(textwrap.dedent(body))
  return str(path)


def test_a_good_command_line_gives_the_config_and_the_other_arguments():
  for argv in (['--config=' + TINY, '--workdir=w', '--config.seed=3'],
               ['--config', TINY, '--workdir=w', '--config.seed=3']):
    config, rest, problem = cli_checks.config_from_argv(argv)
    assert problem is None
    assert config.model.position == 'sinusoidal'       # configs/tiny.py
    # The overrides stay for absl to apply; --config is taken out.
    assert rest == ['--workdir=w', '--config.seed=3']


def test_misspelt_fields_and_sections_are_named_with_the_ones_that_exist():
  problem = _problem('--config=' + TINY, '--config.model.postion=shaw')
  assert "config.model has no field 'postion'" in problem
  assert 'did you mean config.model.position?' in problem
  assert 'num_hiddens' in problem                      # the fields that exist
  assert ("config has no field 'modle'; did you mean config.model?"
          in _problem('--config=' + TINY, '--config.modle.position=shaw'))
  assert ('config.model.num_layers is a value, not a section'
          in _problem('--config=' + TINY, '--config.model.num_layers.depth=3'))
  # `--config PATH`, with a space, as absl allows: the same checks.
  assert "config.model has no field 'postion'" in _problem(
      '--config', TINY, '--config.model.postion=shaw')


def test_override_values_that_cannot_become_the_fields_type():
  """absl printed a FATAL flags-parsing error and its help line, exit 1,
  for these (a helper's probe); now one line naming the field and its type.
  Values of the type pass: an int for a float field, any case of a
  boolean."""
  for arg, message in (
      ('--config.train.num_steps=abc',
       "config.train.num_steps is an integer; got 'abc'"),
      ('--config.mesh.data=2.0', "config.mesh.data is an integer; got '2.0'"),
      ('--config.model.scan_layers=yes',
       "config.model.scan_layers is True or False; got 'yes'"),
      ('--config.train.learning_rate=fast',
       "config.train.learning_rate is a number; got 'fast'")):
    assert message in _problem(f'--config={TINY}', arg)
  config, _, problem = cli_checks.config_from_argv([
      f'--config={TINY}', '--config.train.learning_rate=1',
      '--config.model.scan_layers=FALSE', '--config.train.num_steps=-3'])
  assert problem is None and config is not None


def test_config_files_that_are_missing_broken_or_fail(tmp_path):
  assert _problem('--workdir=w') == ('--config is required '
                                     '(e.g. --config=configs/default.py)')
  assert _problem('--config', 'configs/nonexistent.py') == (
      '--config=configs/nonexistent.py: no such file')
  broken = _config_file(tmp_path, 'def get_config(:\n')
  assert 'syntax error on line 1' in _problem('--config=' + broken)
  noget = _config_file(tmp_path, 'x = 1\n')
  assert 'defines no get_config() function' in _problem('--config=' + noget)
  problem = _problem('--config=' + os.path.join(ROOT, 'configs', 'chomsky.py')
                     + ':bogus')
  assert 'get_config raised ValueError' in problem
  assert 'valid scales are full, small, quick' in problem
  missing_module = _config_file(tmp_path, """
      import not_a_module_anywhere
      def get_config():
        return None
      """)
  assert ("ModuleNotFoundError: No module named 'not_a_module_anywhere'"
          in _problem('--config=' + missing_module))
  raising = _config_file(tmp_path, """
      def get_config():
        raise RuntimeError('broken on purpose')
      """)
  assert ('get_config raised RuntimeError: broken on purpose'
          in _problem('--config=' + raising))
  # A scale given to a config without scales was ignored: tiny.py:bogus
  # trained tiny.py.
  problem = _problem('--config=' + os.path.join(ROOT, 'configs', 'tiny.py')
                     + ':bogus')
  assert ('this config takes no scale or argument after ":"; got \'bogus\''
          in problem)


def test_workdirs_that_cannot_hold_a_run(tmp_path):
  assert cli_checks.workdir_problem('') == '--workdir is empty'
  (tmp_path / 'afile').write_text('')
  assert 'is a file, not a directory' in cli_checks.workdir_problem(
      str(tmp_path / 'afile'))
  assert cli_checks.workdir_problem(str(tmp_path / 'new' / 'run')) is None
  # Under a file: os.access said writable and the study drivers, which
  # checked only the workdir itself, ended in a NotADirectoryError traceback.
  assert cli_checks.workdir_problem(str(tmp_path / 'afile' / 'run')) == (
      f'--workdir={tmp_path}/afile/run: {tmp_path}/afile is a file, so no '
      f'directory can be made under it')
  # Where creating fails though the checks pass (root on /proc, say), the
  # lock that makes the directory says so in one line.
  from selfattn.errors import ConfigError
  from selfattn.training import workdir as workdir_lib
  with pytest.raises(ConfigError, match='cannot create the workdir'):
    with workdir_lib.workdir_lock(str(tmp_path / 'afile' / 'run')):
      pass
  # A run that fails before writing anything (an init_from source whose
  # checkpoints do not restore raised a CheckpointError, and left the
  # new workdir holding its .lock): nothing left; a failure after it wrote
  # keeps what it wrote, and a workdir that existed before is kept.
  for error in (ConfigError('refused'), RuntimeError('no checkpoint')):
    with pytest.raises(type(error)):
      with workdir_lib.workdir_lock(str(tmp_path / 'new2' / 'run')):
        raise error
    assert not (tmp_path / 'new2').exists()
  with pytest.raises(RuntimeError):
    with workdir_lib.workdir_lock(str(tmp_path / 'new3')):
      (tmp_path / 'new3' / 'config.json').write_text('{}')
      raise RuntimeError('later')
  assert (tmp_path / 'new3' / 'config.json').exists()
  with pytest.raises(RuntimeError):
    with workdir_lib.workdir_lock(str(tmp_path)):
      raise RuntimeError('existing')
  assert tmp_path.is_dir()
  if os.geteuid() != 0:                  # root ignores permissions
    readonly = tmp_path / 'readonly'
    readonly.mkdir()
    os.chmod(readonly, 0o500)
    assert 'is not writable' in cli_checks.workdir_problem(
        str(readonly / 'run'))


def test_every_shipped_config_file_passes_the_checks_before_absl():
  """configs/default.py, the README's first command, was refused as
  defining no get_config() once it imported selfattn's instead of defining
  its own (the check read only `def`s). Every file in configs/ is checked
  as the command line checks it, at its default scale."""
  # own_encoding_and_task.py registers an encoding and a task when loaded,
  # which would stay registered for this worker's later tests: its own test
  # runs it through the same checks in a process of its own.
  names = sorted(n for n in os.listdir(os.path.join(ROOT, 'configs'))
                 if n.endswith('.py') and n not in ('__init__.py',
                                                    'own_encoding_and_task.py'))
  assert 'default.py' in names
  for name in names:
    path = os.path.join(ROOT, 'configs', name)
    config, _, problem = cli_checks.config_from_argv([f'--config={path}'])
    assert problem is None and config is not None, (name, problem)


def test_get_config_may_be_imported_or_assigned(tmp_path):
  for body in ('from selfattn.training.default_config import get_config\n',
               'from selfattn.training import default_config\n'
               'get_config = default_config.get_config\n',
               'from selfattn.training.default_config import (\n'
               '    get_config as get_config)\n'):
    path = _config_file(tmp_path, body)
    config, _, problem = cli_checks.config_from_argv([f'--config={path}'])
    assert problem is None and config.task.name == 'reverse', (body, problem)
  # Imported under another name, it is not get_config.
  other = _config_file(
      tmp_path, 'from selfattn.training.default_config import get_config as g\n')
  assert 'defines no get_config() function' in _problem('--config=' + other)


@pytest.mark.parametrize('argv, message', [
    (['--seeds=abc'], "error: flag --seeds=abc: invalid literal for int()"),
    (['--steps_typo=3'], "error: Unknown command line flag 'steps_typo'"),
    (['--seeds=2', 'stray'], 'error: unexpected arguments stray: every '
     'setting is a --name=value flag'),
])
def test_flag_errors_are_one_line_and_exit_2(argv, message, capsys):
  """absl's own flag errors were a FATAL line and a hint, exit 1, and a word
  that is not a flag was ignored by some programs; every program parses
  through parse_flags (selfattn.main's case runs as a process in
  test_train.py::test_cli_mistakes_get_one_line_not_a_traceback)."""
  from absl import flags
  from absl.testing import flagsaver
  from experiments import common   # defines --seeds, as a study does
  del common
  with flagsaver.flagsaver():
    with pytest.raises(SystemExit) as stop:
      cli_checks.parse_flags(['prog'] + argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(message) and '\n' not in err, err
    assert cli_checks.parse_flags(['prog', '--seeds=3']) == ['prog']
    assert flags.FLAGS.seeds == 3


def test_a_required_flag_left_out_is_named_with_what_it_is_for(capsys):
  """absl words a missing required flag as one set to None ("flag
  --workdir=None: Flag --workdir must have a value other than None."); the
  line names the flag and its help instead. Its own FlagValues: a required
  flag's validator would run on every later parse of flags.FLAGS."""
  from absl import flags
  flag_values = flags.FlagValues()
  flags.DEFINE_string('workdir', None, 'Directory for checkpoints.',
                      flag_values=flag_values)
  flags.mark_flag_as_required('workdir', flag_values=flag_values)
  with pytest.raises(SystemExit) as stop:
    cli_checks.parse_flags(['prog'], flag_values)
  assert stop.value.code == 2
  assert capsys.readouterr().err == (
      'error: --workdir is required (Directory for checkpoints.) '
      '(--helpfull lists the flags)\n')
  assert cli_checks.parse_flags(['prog', '--workdir=w'], flag_values) == [
      'prog']
  assert flag_values.workdir == 'w'
