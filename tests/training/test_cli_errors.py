"""A user's mistake on the command line is one line and exit status 2, before
anything is written (issue: one line for every user mistake)."""

import os
import textwrap

import pytest

from runs import cli
from tiers import EXTENDED
from selfattn.training import workdir as workdir_lib

pytestmark = pytest.mark.slow


def _config_file(tmp_path, body):
  path = tmp_path / 'user_config.py'
  path.write_text(textwrap.dedent(body))
  return str(path)


def _refused(result, workdir, *expected):
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 2, result.stderr[-2000:]
  assert len(lines) == 1 and lines[0].startswith('error: '), result.stderr
  for text in expected:
    assert text in lines[0], lines[0]
  assert not os.path.exists(workdir)          # nothing left behind
  return lines[0]


# Extended: test_cli_checks.py makes these checks in process (the same
# functions selfattn.main calls before absl parses a flag), and
# test_train.py::test_cli_mistakes_get_one_line_not_a_traceback shows such a
# problem reaching the command line as one line and exit 2 (tests/README.md).
@EXTENDED
def test_misspelt_field_and_section(tmp_path):
  workdir = tmp_path / 'run'
  line = _refused(cli(workdir, '--config.model.postion=shaw'), workdir,
                  "config.model has no field 'postion'",
                  'did you mean config.model.position?')
  assert 'num_hiddens' in line                # the fields that exist
  _refused(cli(workdir, '--config.modle.position=shaw'), workdir,
           "config has no field 'modle'", 'did you mean config.model?')
  _refused(cli(workdir, '--config.model.num_layers.depth=3'), workdir,
           'config.model.num_layers is a value, not a section')


# Extended: test_cli_checks.py makes these checks in process (the same
# functions selfattn.main calls before absl parses a flag), and
# test_train.py::test_cli_mistakes_get_one_line_not_a_traceback shows such a
# problem reaching the command line as one line and exit 2 (tests/README.md).
@EXTENDED
def test_config_files_that_fail(tmp_path):
  workdir = tmp_path / 'run'
  _refused(cli(workdir, config='configs/chomsky.py:bogus'), workdir,
           'get_config raised ValueError', 'valid scales are full, small, quick')
  missing_module = _config_file(tmp_path, """
      import not_a_module_anywhere
      def get_config():
        return None
      """)
  _refused(cli(workdir, config=missing_module), workdir,
           "ModuleNotFoundError: No module named 'not_a_module_anywhere'")
  raising = _config_file(tmp_path, """
      def get_config():
        raise RuntimeError('broken on purpose')
      """)
  _refused(cli(workdir, config=raising), workdir,
           'get_config raised RuntimeError: broken on purpose')


# Extended: test_cli_checks.py makes these checks in process (the same
# functions selfattn.main calls before absl parses a flag), and
# test_train.py::test_cli_mistakes_get_one_line_not_a_traceback shows such a
# problem reaching the command line as one line and exit 2 (tests/README.md);
# the two values that only look valid are refused in process by
# test_train.py::test_values_that_would_train_wrongly_fail_first.
@EXTENDED
def test_space_separated_config_and_values_that_only_look_valid(tmp_path):
  """`--config PATH` (a space, as absl allows) gets the same one-line
  checks as `--config=PATH`; and two values that used to pass validation
  and fail later, after config.json was stored: a bool in a list of
  lengths (True is an int to Python) and a seed beyond int32."""
  import subprocess
  import sys
  from runs import ROOT, subprocess_env
  workdir = tmp_path / 'run'

  def spaced(*args):
    return subprocess.run(
        [sys.executable, '-m', 'selfattn.main', '--config', *args,
         f'--workdir={workdir}'], cwd=ROOT, env=subprocess_env(),
        capture_output=True, text=True, timeout=600)

  _refused(spaced('configs/tiny.py', '--config.model.postion=shaw'), workdir,
           "config.model has no field 'postion'")
  _refused(spaced('configs/nonexistent.py'), workdir,
           '--config=configs/nonexistent.py: no such file')
  _refused(cli(workdir, '--config.eval.lengths=8,True'), workdir,
           'config.eval.lengths must be a non-empty list of integers',
           '[8, True]')
  _refused(cli(workdir, '--config.seed=99999999999'), workdir,
           'config.seed must be an integer in [0, 2**31)')


# Extended: test_config_compat.py::test_a_config_without_a_field_is_refused_naming_it
# makes the same claim in process (the same check in validate_config), and
# a ConfigError from training reaches the command line as one line in
# test_train.py::test_cli_reports_bad_config_in_one_line (tests/README.md).
@EXTENDED
def test_a_config_missing_a_field(tmp_path):
  workdir = tmp_path / 'run'
  lacking = _config_file(tmp_path, """
      from configs import tiny
      def get_config():
        config = tiny.get_config()
        del config.model['num_layers']
        return config
      """)
  _refused(cli(workdir, config=lacking), workdir,
           "the config lacks the field 'num_layers'", 'configs/default.py')


def test_a_second_study_runner_on_a_locked_run_is_one_line(tmp_path, capsys,
                                                          tiny_config):
  """study.execute reports a run whose workdir another live process holds
  as one line and exit 2, not a traceback."""
  from experiments import study
  run = study.Run('position=sinusoidal,seed=0', tiny_config, {})
  with workdir_lib.workdir_lock(str(tmp_path / run.name)):
    with pytest.raises(SystemExit) as stop:
      study.execute([run], str(tmp_path), verbose=False)
  assert stop.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].startswith('error: position=sinusoidal,seed=0: workdir ')
  assert 'in use by another live run' in err[-1]


def _refused_in_process(config, workdir, capsys) -> str:
  """What `python -m selfattn.main` does with a run's error
  (exits.train_reporting_errors), in this process: status 2 and one
  'error: ' line on stderr. The subprocess route to that status and line
  is test_train.py::test_cli_reports_bad_config_in_one_line's, which every
  ConfigError takes alike; each subprocess here cost 2-3 s of start-up."""
  from selfattn.training import exits
  capsys.readouterr()
  assert exits.train_reporting_errors(config, str(workdir)) == 2
  err = capsys.readouterr().err
  lines = [line for line in err.splitlines() if line.startswith('error: ')]
  assert len(lines) == 1 and err.rstrip().endswith(lines[0]), err[-2000:]
  return lines[0]


# '[1, 2]' in the commit tier. Extended: '{not json' and '' fail to parse,
# as test_a_truncated_summary_and_a_lock_that_is_a_directory's summary.json
# does through the same reader (workdir.read_json_object) (tests/README.md).
@pytest.mark.parametrize('content,expected', [
    pytest.param('{not json', 'cannot be read: Expecting property name',
                 marks=EXTENDED),
    pytest.param('', 'cannot be read: Expecting value', marks=EXTENDED),
    ('[1, 2]', 'holds a JSON list, not an object'),
])
def test_a_damaged_config_json_in_the_workdir(tmp_path, content, expected,
                                              tiny_config, capsys):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  (workdir / 'config.json').write_text(content)
  line = _refused_in_process(tiny_config, workdir, capsys)
  assert line.startswith(f'error: {workdir}/config.json (the stored '
                         f'config) ') and expected in line
  assert (workdir / 'config.json').read_text() == content   # left as it was


def test_a_truncated_summary_and_a_lock_that_is_a_directory(tmp_path,
                                                            tiny_config,
                                                            capsys):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  (workdir / 'summary.json').write_text('{"step": 2')
  assert _refused_in_process(tiny_config, workdir, capsys) == (
      f'error: {workdir}/summary.json (the summary of a finished run) cannot '
      f"be read: Expecting ',' delimiter: line 1 column 11 (char 10); fix or "
      f'delete it, or use a new --workdir')
  other = tmp_path / 'other'
  (other / '.lock').mkdir(parents=True)
  line = _refused_in_process(tiny_config, other, capsys)
  assert 'cannot open the lock file' in line and 'Is a directory' in line


def test_a_run_refused_after_taking_the_lock_leaves_nothing(tmp_path,
                                                           tiny_config,
                                                           capsys):
  """init_from is checked inside the lock: the refused run's new workdir
  (and the parents made for it) disappear again."""
  workdir = tmp_path / 'new' / 'run'
  tiny_config.train.init_from = '/does/not/exist'
  line = _refused_in_process(tiny_config, workdir, capsys)
  assert "config.train.init_from='/does/not/exist'" in line
  assert not (tmp_path / 'new').exists()
