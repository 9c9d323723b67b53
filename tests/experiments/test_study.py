"""The study runner's bookkeeping, without training: diverged runs are
recorded outcomes, and the tables and plots leave them out visibly."""

import contextlib
import math
import os
import signal
import threading
import time
import unittest.mock

import ml_collections
import pytest

from absl import flags
from absl.testing import flagsaver

from experiments import common
from experiments import skeleton
from experiments import study
from selfattn.errors import NonFiniteError


def _run(name, seed):
  config = ml_collections.ConfigDict({'seed': seed,
                                      'train': {'num_steps': 10}})
  return study.Run(name, config, {'seed': seed})


@pytest.fixture(autouse=True)
def _stand_in_configs_pass(monkeypatch):
  """The runs here hold stand-in configs (a seed and a step count) that no
  training reads; the study's up-front config check would refuse them.
  test_a_bad_config_stops_the_study_before_any_run_trains checks it with
  the real validate_config."""
  monkeypatch.setattr(study, 'validate_config', lambda config, num_devices: None)


def test_a_bad_config_stops_the_study_before_any_run_trains(
    tmp_path, monkeypatch, capsys, tiny_config):
  """The second run's config is invalid: the study says so in one line
  (exit status 2) before the first run trains or gets a workdir."""
  from selfattn.training.config_checks import validate_config
  monkeypatch.setattr(study, 'validate_config', validate_config)
  monkeypatch.setattr(study, 'train_and_evaluate',
                      lambda *a: pytest.fail('a run trained'))
  bad = tiny_config.copy_and_resolve_references()
  bad.model.position = 'sinusoidall'
  runs = [study.Run('position=sinusoidal,seed=0', tiny_config, {}),
          study.Run('position=sinusoidall,seed=0', bad, {})]
  with pytest.raises(SystemExit) as stop:
    study.execute(runs, str(tmp_path), verbose=False)
  assert stop.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].startswith('error: position=sinusoidall,seed=0: ')
  assert 'sinusoidall' in err[-1].split(': ', 2)[2]
  assert not (tmp_path / 'position=sinusoidal,seed=0').exists()


def test_configs_that_differ_only_in_their_seed_are_checked_once(tiny_config):
  seeded = tiny_config.copy_and_resolve_references()
  seeded.seed = 7
  other = tiny_config.copy_and_resolve_references()
  other.model.num_layers = 3
  runs = [study.Run('a,seed=0', tiny_config, {}),
          study.Run('a,seed=7', seeded, {}),
          study.Run('b,seed=0', other, {})]
  assert [r.name for r in study.distinct_but_seed(runs)] == ['a,seed=0',
                                                             'b,seed=0']


def test_a_diverged_run_is_recorded_once_and_not_retrained(tmp_path,
                                                           monkeypatch):
  trained = []

  def fake_train(config, workdir):
    trained.append(config.seed)
    if config.seed == 1:
      raise NonFiniteError('loss is nan at step 7')
    return {'step': 10, 'eval': {'8': {'token_accuracy': 0.75}}}

  monkeypatch.setattr(study, 'train_and_evaluate', fake_train)
  # finished_summary of a healthy run reads summary.json: stand in for it.
  done = {}
  monkeypatch.setattr(study.workdir_lib, 'finished_summary',
                      lambda path, steps: done.get(path))
  runs = [_run('a,seed=0', 0), _run('a,seed=1', 1)]
  (tmp_path / 'a,seed=0').mkdir()
  (tmp_path / 'a,seed=1').mkdir()

  scored = []
  first = study.execute(runs, str(tmp_path), verbose=False,
                        after_each=lambda run, summary: scored.append(
                            (run.name, summary['step'])))
  assert trained == [0, 1]
  assert scored == [('a,seed=0', 10)]       # the diverged run is not scored
  assert study.diverged(first['a,seed=1'])
  assert 'loss is nan at step 7' in first['a,seed=1']['diverged']
  assert not study.diverged(first['a,seed=0'])

  done[str(tmp_path / 'a,seed=0')] = first['a,seed=0']
  again = study.execute(runs, str(tmp_path), verbose=False,
                        after_each=lambda run, summary: scored.append(run.name))
  assert trained == [0, 1]                  # neither run trained again
  assert len(scored) == 1                   # nor scored again
  assert again == first


@pytest.mark.parametrize('text, seconds', [
    ('90m', 5400), ('2h30m', 9000), ('45s', 45), ('1h', 3600),
    ('1h0m5s', 3605)])
def test_a_duration_is_read_in_hours_minutes_and_seconds(text, seconds):
  assert study.parse_duration(text) == seconds


@pytest.mark.parametrize('text', ['', '90', '30m1h', '1.5h', 'm', '0s',
                                  '9' * 400 + 's', '\u0663m'])
def test_a_malformed_or_empty_duration_is_refused(text):
  with pytest.raises(ValueError):
    study.parse_duration(text)


def test_a_study_stops_between_runs_once_its_time_has_passed(
    tmp_path, monkeypatch, capsys):
  """stop_after: the run under way finishes (a session's or allocation's
  end would kill it, and its checkpoints may not outlive the machine); no
  run starts after it, and rerunning trains the rest."""
  clock = [1000.0]
  trained = []

  def fake_train(config, workdir):
    trained.append(config.seed)
    clock[0] += 3600                     # each run takes an hour
    return {'step': 10}

  monkeypatch.setattr(study.time, 'monotonic', lambda: clock[0])
  monkeypatch.setattr(study, 'train_and_evaluate', fake_train)
  done = {}
  monkeypatch.setattr(study.workdir_lib, 'finished_summary',
                      lambda path, steps: done.get(path))
  runs = [_run(f'a,seed={i}', i) for i in range(4)]
  first = study.execute(runs, str(tmp_path), deadline=clock[0] + 90 * 60)
  # Run 0 ends at 60 min (< 90: run 1 starts), run 1 at 120 (stop).
  assert trained == [0, 1] and sorted(first) == ['a,seed=0', 'a,seed=1']
  out = capsys.readouterr().out
  assert ('stopping between runs: the time given (--stop_between_runs_after) '
          'has passed; 2 run(s) left untrained') in out
  # Run 0's line has an ETA; run 1's, after which nothing starts, none.
  progress = [line for line in out.splitlines() if ' done: ' in line]
  assert len(progress) == 2 and '; 3 left, ETA ' in progress[0]
  assert progress[1].endswith('; 2 left')
  done.update({str(tmp_path / n): s for n, s in first.items()})
  assert len(study.execute(runs, str(tmp_path), verbose=False)) == 4
  assert trained == [0, 1, 2, 3]


@pytest.fixture
def no_process_cache():
  """This process without the session's XLA cache (conftest), as a user's
  process is by default; the cache comes back afterwards."""
  import jax
  from jax.experimental.compilation_cache import compilation_cache
  before = jax.config.jax_compilation_cache_dir
  jax.config.update('jax_compilation_cache_dir', None)
  compilation_cache.reset_cache()
  yield
  jax.config.update('jax_compilation_cache_dir', before)
  compilation_cache.reset_cache()


def test_a_study_shares_compilations_on_disk_only_while_it_runs(
    tmp_path, monkeypatch, no_process_cache):
  """Inside execute, XLA's executables go to the study's .xla_cache; after
  it, the process's settings are back, so a caller that runs a study
  in-process (these tests) does not write every later compilation there."""
  import jax
  import jax.numpy as jnp
  assert jax.config.jax_compilation_cache_dir is None
  min_seconds = jax.config.jax_persistent_cache_min_compile_time_secs
  seen = []

  def fake_train(config, workdir):
    seen.append(jax.config.jax_compilation_cache_dir)
    jax.jit(lambda x: x * 3.0 + 1.0)(jnp.ones(5)).block_until_ready()
    return {'step': 10}

  monkeypatch.setattr(study, 'train_and_evaluate', fake_train)
  monkeypatch.setattr(study.workdir_lib, 'finished_summary',
                      lambda path, steps: None)
  study.execute([_run('a,seed=0', 0)], str(tmp_path), verbose=False)
  cache = tmp_path / '.xla_cache'
  assert seen == [str(cache)]
  written = set(os.listdir(cache))
  assert written                    # the run's compilation went to disk

  assert jax.config.jax_compilation_cache_dir is None
  assert jax.config.jax_persistent_cache_min_compile_time_secs == min_seconds
  jax.jit(lambda x: x * 5.0 - 2.0)(jnp.ones(7)).block_until_ready()
  assert set(os.listdir(cache)) == written


def test_tables_leave_diverged_runs_out_and_say_how_many():
  ok = {'eval': {'16': {'token_accuracy': 0.5}}}
  good = {'eval': {'16': {'token_accuracy': 1.0}}}
  lost = {'diverged': 'loss is nan'}
  assert math.isnan(common.accuracy(lost, 16))
  values = [common.accuracy(s, 16) for s in (ok, good, lost)]
  assert common.mean_std(values) == '0.750 ± 0.354 (1 of 3 diverged)'
  assert common.mean_std([math.nan, math.nan]) == 'all 2 diverged'
  assert common.mean_std([0.25]) == '0.250'
  assert common.steps_to(lost, 16) is None
  # The first evaluation reaching it, skipping one without the length (a
  # resume that changed eval.lengths; before: a KeyError).
  resumed = {'history': [
      {'step': 100, 'eval': {'8': {'token_accuracy': 1.0}}},
      {'step': 200, 'eval': {'16': {'token_accuracy': 0.5}}},
      {'step': 300, 'eval': {'16': {'token_accuracy': 0.995}}}]}
  assert common.steps_to(resumed, 16) == 300
  assert common.steps_to(resumed, 8) == 100


def test_length_generalization_report_names_diverged_runs(tmp_path):
  from experiments import length_generalization as lengthgen
  runs = lengthgen.study_runs('quick', 1, tasks=('parity_check',),
                              positions=('rope',))
  fixed, randomized = runs

  def summary(run, score):
    return {'task': 'parity_check', 'position': 'rope', 'chance': 0.5,
            'randomize_positions': run.tags['random'], 'score': score,
            'config': {'seed': 0}, 'train_seconds': 1.0,
            'eval': {'20': {'token_accuracy': score}}}

  text = lengthgen.report(str(tmp_path), runs,
                          {fixed.name: summary(fixed, 0.6),
                           randomized.name: {'diverged': 'loss is nan'}},
                          'quick')
  assert '2 of 2 runs finished. 1 diverged' in text
  assert randomized.name in text
  assert '0.600 (max 0.600, n=1)' in text   # the fixed run's cell


def test_the_interval_across_seeds_is_students_t_on_per_seed_means():
  from experiments import length_generalization as lengthgen
  by_cell = {('t', 'rope', False): {0: 0.5, 1: 0.5, 2: 0.5},
             ('t', 'rope', True): {0: 0.6, 1: 0.7, 2: 0.8},
             ('t', 'alibi', False): {0: 0.5, 1: 0.5},
             ('t', 'alibi', True): {0: 0.6, 1: 0.7}}
  by_seed = lengthgen.per_seed_differences(by_cell, ['t'], ['none', 'rope', 'alibi'])
  assert {s: [round(d, 6) for d in v] for s, v in by_seed.items()} == {
      0: [0.1, 0.1], 1: [0.2, 0.2], 2: [0.3]}
  lo, hi = common.seed_interval([0.1, 0.2, 0.3])
  half = 4.302653 * 0.1 / 3 ** 0.5       # t(0.975, df=2) * sd / sqrt(k)
  assert (lo, hi) == pytest.approx((0.2 - half, 0.2 + half))
  with pytest.raises(ValueError):
    common.seed_interval([0.1])


def test_the_max_over_seeds_comparison_waits_for_matching_seeds():
  from experiments import length_generalization as lengthgen
  by_cell = {('t', 'rope', False): {0: 0.5, 1: 0.7, 2: 0.6},
             ('t', 'rope', True): {0: 0.9, 1: 0.6, 2: 0.8},
             # the randomized column is a seed behind: no max comparison yet
             ('t', 'alibi', False): {0: 0.5, 1: 0.5},
             ('t', 'alibi', True): {0: 0.6},
             ('u', 'rope', False): {0: 0.8},
             ('u', 'rope', True): {0: 0.7}}
  best = lengthgen.max_over_seeds_differences(by_cell, ['t', 'u'],
                                              ['none', 'rope', 'alibi'])
  assert best == pytest.approx({('t', 'rope'): 0.9 - 0.7,
                                ('u', 'rope'): 0.7 - 0.8})


def test_the_breakdown_groups_pairs_by_task_and_by_encoding():
  from experiments import length_generalization as lengthgen
  by_cell = {('t', 'rope', False): {0: 0.5, 1: 0.5},
             ('t', 'rope', True): {0: 0.7, 1: 0.4},
             ('u', 'rope', False): {0: 0.5},
             ('u', 'rope', True): {0: 0.6}}
  text = lengthgen.breakdown(by_cell, ['t', 'u'], ['none', 'rope'])
  assert text == ('Per task: t +0.050 (1 of 2 positive); u +0.100 (1 of 1 '
                  'positive). Per encoding: rope +0.067 (2 of 3 positive).')
  table = lengthgen.per_seed_table(by_cell, ['t', 'u'], ['none', 'rope'])
  assert '| t | +0.200 -0.100 |' in table and '| u | +0.100 |' in table


def test_paired_by_seed_is_the_hand_computed_t_interval():
  """Two seeds, differences 5 and 10 points: mean 7.5, sd 5/sqrt(2), and
  t(0.975, 1 df) = 12.706 gives 7.5 +- 12.706 * 2.5 = [-24.27, +39.27]."""
  by_label = {'pope': {0: 0.10, 1: 0.20}, 'rope': {0: 0.05, 1: 0.10, 2: 0.3}}
  line = common.paired_by_seed(by_label, ('pope',), ('rope',),
                               'pope minus rope at lengths 44-52',
                               unit='points', scale=100, digits=2,
                               seed_digits=1)
  assert line == ('pope minus rope at lengths 44-52: +7.50 points over 2 '
                  'seeds (95% t-interval across seeds [-24.27, +39.27]; '
                  'per seed +5.0, +10.0)')
  # Groups average their members per seed first: seed 2 lacks 'pope'.
  groups = {'a': {0: 1.0, 1: 2.0}, 'b': {0: 3.0, 1: 2.0},
            'c': {0: 0.0, 1: 1.0, 2: 9.0}}
  assert common.paired_by_seed(groups, ('a', 'b'), ('c',), 'ab - c',
                               unit='nats').startswith(
      'ab - c: +1.5000 nats over 2 seeds')
  assert 'fewer than two' in common.paired_by_seed(
      {'pope': {0: 0.1}, 'rope': {0: 0.0}}, ('pope',), ('rope',), 'x',
      unit='points')


class _TwoEncodings(skeleton.Study):
  """A stand-in study for the skeleton: encodings a and b at N seeds
  (nothing trains: the tests replace study.execute)."""
  scales = ('small', 'quick')
  default_scale = 'small'
  title = 'Two encodings'

  def __init__(self):
    self.scored, self.reported = [], []

  def filter_values(self):
    return {'position': ('a', 'b')}

  def runs(self, scale, seeds, context):
    # Its quick scale trains encoding a only.
    runs = [_run(f'position={p},seed={s}', s) for s in range(seeds)
            for p in (('a',) if scale == 'quick' else ('a', 'b'))]
    for r in runs:
      r.tags['position'] = r.name.split(',')[0].split('=')[1]
    return runs

  def score(self, run, path, context):
    self.scored.append(run.name)

  def report(self, workdir, runs, results, scale, context):
    self.reported.append((scale, len(runs), sorted(results)))
    return common.write_results(workdir, self.title, [('Table', 'x')])


@pytest.mark.parametrize('argv, message', [
    (['--positions=c'], '--positions: c unknown (valid: a, b)'),
    # An encoding selfattn has that this study does not train.
    (['--positions=c,shaw'], '--positions: c unknown (valid: a, b); '
     '--positions: shaw not in this study (valid: a, b)'),
    (['--tasks=x'], '--tasks: this study has no tasks to filter'),
    # Two bad filters: both named (only one used to be).
    (['--tasks=x', '--positions=c,d'],
     '--positions: c, d unknown (valid: a, b); '
     '--tasks: this study has no tasks to filter'),
    (['--seeds=0'], '--seeds=0: a study needs at least one seed'),
    (['--shard=abc'], "--shard='abc' must look like i/n"),
    # Empty, both meant the whole default study, silently (as an empty
    # --positions would, which was refused already).
    (['--shard='], '--shard is empty: give i/n'),
    (['--scale='], '--scale is empty: name one of small, quick (or leave the '
                   'flag out for small)'),
    (['--stop_between_runs_after=soon'], "--stop_between_runs_after: 'soon' "
     'is not a duration; write it like 90m, 2h30m or 45s'),
    (['--stop_between_runs_after=0m'], "--stop_between_runs_after: '0m': "
     'the duration must be longer than 0'),
    (['--stop_between_runs_after=1h', '--collect_only'],
     '--stop_between_runs_after: --collect_only trains nothing'),
    (['--scale=huge'], "--scale='huge' is not a scale of this study; valid: "
                       'small, quick'),
    # A helper's probe (2026-11-30): each of these ran the study.
    (['--positions='], '--positions is empty: name at least one'),
    (['--quick', '--scale=small'], '--quick is --scale=quick: give one'),
    (['--steps=7'], "--steps: this study's runs have their length set by its "
                    'scale'),
    # A helper's probe: --quick trained the other encodings, dropping b.
    (['--quick', '--positions=a,b'], "--positions: b not among this study's "
     'runs at --scale=quick (there: a)'),
])
def test_the_skeleton_refuses_bad_flags_in_one_line(tmp_path, monkeypatch,
                                                    capsys, argv, message):
  """Every study's flags are checked before anything runs: a typo in a
  filter used to select zero runs and exit 0 with an empty table."""
  spec = _TwoEncodings()
  monkeypatch.setattr(study, 'execute', lambda *a, **k: pytest.fail('ran'))
  with flagsaver.flagsaver():
    flags.FLAGS(['study', f'--workdir={tmp_path}'] + argv)
    with pytest.raises(SystemExit) as stop:
      skeleton.main(spec)([])
  assert stop.value.code == 2      # a usage error, as for a config
  err = capsys.readouterr().err.strip()
  assert err.startswith(f'error: {message}') and '\n' not in err
  assert not spec.reported


@pytest.mark.parametrize('make, flag, message', [
    (lambda d: d / 'missing', '--collect_only', 'does not exist, so there is '
     'nothing to collect'),
    (lambda d: (d / 'a_file').write_text('x') and d / 'a_file', None,
     'is a file, not a directory'),
    # Under a file: a NotADirectoryError traceback after the first run began.
    (lambda d: (d / 'a_file').write_text('x') and d / 'a_file' / 'study',
     None, 'a_file is a file, so no directory can be made under it'),
    (lambda d: (d / 'empty').mkdir() or d / 'empty', '--collect_only',
     'holds no finished run of this study at --scale=small'),
])
def test_the_skeleton_refuses_a_workdir_it_cannot_use(tmp_path, monkeypatch,
                                                     capsys, make, flag,
                                                     message):
  """--collect_only on a mistyped workdir wrote an empty report there; a
  workdir that is a file ended in a traceback."""
  spec = _TwoEncodings()
  monkeypatch.setattr(study, 'execute', lambda *a, **k: pytest.fail('ran'))
  workdir = make(tmp_path)
  with flagsaver.flagsaver():
    flags.FLAGS(['study', f'--workdir={workdir}'] + ([flag] if flag else []))
    with pytest.raises(SystemExit):
      skeleton.main(spec)([])
  assert message in capsys.readouterr().err
  assert not spec.reported
  assert not (tmp_path / 'missing').exists()


def test_a_one_function_study_refuses_the_flags_it_would_ignore(tmp_path,
                                                               capsys):
  """chapter and exercise 1 take --workdir, --seeds and --quick; a --shard
  or --positions given to them used to be accepted and ignored."""
  ran = []
  with flagsaver.flagsaver():
    flags.FLAGS(['study', f'--workdir={tmp_path}', '--shard=1/2',
                 '--positions=a', '--stop_between_runs_after=1h'])
    with pytest.raises(SystemExit):
      skeleton.main_of(lambda *args: ran.append(args), 'T')([])
  assert not ran
  assert ('--positions, --shard, --stop_between_runs_after: this study takes '
          'only --workdir, --seeds and --quick') in capsys.readouterr().err
  with flagsaver.flagsaver():
    flags.FLAGS(['study', f'--workdir={tmp_path}', '--seeds=0'])
    with pytest.raises(SystemExit):
      skeleton.main_of(lambda *args: ran.append(args), 'T')([])
  assert not ran and 'at least one seed' in capsys.readouterr().err


def test_a_finished_run_of_another_config_is_refused_not_reused(tmp_path,
                                                                tiny_config):
  """The same workdir given another --task: the finished run's name was
  the same and its numbers were reported as the new task's."""
  from selfattn.errors import ConfigError
  from selfattn.training import workdir as workdir_lib
  path = tmp_path / 'position=none,seed=0'
  workdir_lib.check_or_store_config(str(path), tiny_config, write=True)
  (path / 'summary.json').write_text(
      '{"step": %d}' % tiny_config.train.num_steps)
  run = study.Run(path.name, tiny_config, {'seed': 0})
  assert study.finished_summary(run, str(tmp_path)) is not None
  other = tiny_config.copy_and_resolve_references()
  other.task.name = 'sort'
  with pytest.raises(ConfigError, match="config.task.name: stored 'reverse', "
                     "now 'sort'"):
    study.finished_summary(study.Run(path.name, other, {'seed': 0}),
                           str(tmp_path))


def test_the_skeleton_runs_scores_and_reports_the_chosen_runs(tmp_path,
                                                              monkeypatch):
  """--positions and --shard select runs; each run trained is scored right
  after it; the report sees every run of the study."""
  spec = _TwoEncodings()
  executed = []

  def fake_execute(runs, workdir, after_each=None, deadline=None):
    # Counted from the study's start, before its data and earlier scores.
    assert 0 < deadline - time.monotonic() <= 2 * 3600 + 30 * 60
    for r in runs:
      executed.append(r.name)
      after_each(r, {})
    return {}

  monkeypatch.setattr(study, 'execute', fake_execute)
  with flagsaver.flagsaver():
    flags.FLAGS(['study', f'--workdir={tmp_path}', '--seeds=3',
                 '--positions=b', '--shard=1/2',
                 '--stop_between_runs_after=2h30m'])
    skeleton.main(spec)([])
  # b's runs at seeds 0, 1, 2; shard 1 of 2 keeps the second.
  assert executed == ['position=b,seed=1'] == spec.scored
  assert spec.reported == [('small', 6, [])]
  # Nothing trained here (execute is a stand-in): the report says that it
  # covers none of the six planned runs.
  assert ('0 of the 6 runs this study plans at this scale and seed count '
          'have finished here; the 6 others have not (the study\'s command '
          'without --positions, --tasks or --shard trains them)'
          ) in (tmp_path / 'results.md').read_text()


def test_a_study_stopped_between_runs_reports_then_exits_75(
    tmp_path, monkeypatch, capsys):
  """A study that --stop_between_runs_after left with chosen runs untrained
  writes its report, then exits with EX_TEMPFAIL (75), so that a job script
  can requeue it; one that finished its runs in time exits 0 (the test
  above)."""
  spec = _TwoEncodings()
  finished = {}

  clock = [1000.0]

  def fake_execute(runs, workdir, after_each=None, deadline=None):
    finished[runs[0].name] = {'step': 10}     # one run, then time is up
    clock[0] = deadline + 1
    return dict(finished)

  monkeypatch.setattr(skeleton.time, 'monotonic', lambda: clock[0])

  monkeypatch.setattr(study, 'execute', fake_execute)
  monkeypatch.setattr(study, 'collect', lambda runs, workdir: {
      r.name: finished[r.name] for r in runs if r.name in finished})
  with flagsaver.flagsaver():
    flags.FLAGS(['study', f'--workdir={tmp_path}', '--seeds=2',
                 '--positions=a', '--stop_between_runs_after=1s'])
    with pytest.raises(SystemExit) as stopped:
      skeleton.main(spec)([])
  assert stopped.value.code == skeleton.STOPPED_BETWEEN_RUNS == 75
  assert ('1 chosen run(s) left untrained; the report above covers the '
          'finished ones') in capsys.readouterr().err
  assert ('1 of the 4 runs this study plans at this scale and seed count has '
          'finished here') in (tmp_path / 'results.md').read_text()


def test_a_report_of_part_of_its_plan_says_so_and_a_whole_one_does_not(
    tmp_path):
  """An interrupted or sharded study's tables hold the finished runs
  only: its report says how many of the planned runs those are."""
  with common.planned_runs(4, 3):
    text = common.write_results(str(tmp_path), 'T', [('Table', 'x')])
  assert text.index('## Table') < text.index('## Runs')
  assert ('3 of the 4 runs this study plans at this scale and seed count '
          'have finished here; the other one has not') in text
  with common.planned_runs(4, 1):
    assert '1 of the 4 runs this study plans at this scale and seed count ' \
           'has finished here; the 3 others have not' in common.write_results(
               str(tmp_path), 'T', [('Table', 'x')])
  for plan in ((4, 4), None):
    with (common.planned_runs(*plan) if plan else contextlib.nullcontext()):
      assert '## Runs' not in common.write_results(str(tmp_path), 'T',
                                                   [('Table', 'x')])


def test_a_run_without_a_filter_tag_is_kept_and_checked_by_none(
    tmp_path, monkeypatch):
  """study.select keeps a run that lacks a filter's tag (a baseline, say);
  the check that a requested value is in the plan read every run's tag and
  raised KeyError before training, filter or not."""
  spec = _TwoEncodings()
  plan = spec.runs
  spec.runs = lambda *args: plan(*args) + [_run('baseline', 0)]
  executed = []
  monkeypatch.setattr(study, 'execute', lambda runs, workdir, after_each, **_:
                      executed.extend(r.name for r in runs))
  for argv in ([], ['--positions=b']):
    executed.clear()
    with flagsaver.flagsaver():
      flags.FLAGS(['study', f'--workdir={tmp_path}', '--seeds=1'] + argv)
      skeleton.main(spec)([])
    assert 'baseline' in executed and ('position=a,seed=0' in executed) == (
        not argv)


def test_a_run_is_scored_under_the_gpu_kernel_it_was_trained_with(tmp_path):
  """Scoring (beam search, the music metrics) traces the trained model
  again; it ran under 'auto' whatever config.model.gpu_kernel chose."""
  from configs import default
  from selfattn.nn import pallas_attention
  config = default.get_config()
  config.model.gpu_kernel = 'triton'
  run = study.Run('position=a,seed=0', config, {'position': 'a', 'seed': 0})
  seen = []

  def evaluate(run, path):
    seen.append(pallas_attention._default_gpu_kernel[-1])
    return {}

  # A finished run (its summary as finished_summary reads it).
  with unittest.mock.patch.object(study, 'finished_summary',
                                  lambda run, workdir: {'step': 1}):
    skeleton.scored_results([run], str(tmp_path), 'x.json', evaluate,
                            score_missing=True)
  assert seen == ['triton']
  assert pallas_attention._default_gpu_kernel == ['auto']


def test_an_unreadable_diverged_record_still_means_diverged(tmp_path,
                                                            monkeypatch):
  """A kill while an older version wrote diverged.json left it empty, and
  every later rerun of the study failed with a JSONDecodeError. The file's
  existence is the outcome: the run counts as diverged, is not retrained,
  and the record is written atomically now."""
  run = _run('position=a,seed=0', 0)
  (tmp_path / run.name).mkdir()
  (tmp_path / run.name / study.DIVERGED_FILE).write_text('')
  summary = study.finished_summary(run, str(tmp_path))
  assert study.diverged(summary) and 'unreadable' in summary['diverged']
  monkeypatch.setattr(study, 'train_and_evaluate',
                      lambda *a: pytest.fail('retrained'))
  assert study.execute([run], str(tmp_path), verbose=False) == {
      run.name: summary}


def test_a_truncated_summary_stops_a_study_in_one_line(tmp_path, capsys):
  """A finished run's summary.json cut short: the study says which file,
  in one line with exit status 2, instead of a traceback."""
  spec = _TwoEncodings()
  run_dir = tmp_path / 'position=b,seed=0'
  run_dir.mkdir()
  (run_dir / 'summary.json').write_text('{"step": 10, "ev')
  with flagsaver.flagsaver():
    flags.FLAGS(['study', f'--workdir={tmp_path}', '--seeds=1',
                 '--collect_only'])
    with pytest.raises(SystemExit) as stop:
      skeleton.main(spec)([])
  assert stop.value.code == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith(f'error: {run_dir}/summary.json (the summary of a '
                        'finished run) cannot be read') and '\n' not in err


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT])
def test_a_stop_outside_training_is_one_line_and_restores_handlers(
    capsys, signum):
  if threading.current_thread() is not threading.main_thread():
    pytest.skip('signal handlers can only be set in the main thread')
  before = signal.getsignal(signum)
  scored = []
  with pytest.raises(SystemExit) as stop:
    with study.stops_in_one_line():
      scored.append('first')
      os.kill(os.getpid(), signum)      # as during a run's beam search
      scored.append('never')
  assert stop.value.code == 128 + signum
  assert scored == ['first']
  lines = capsys.readouterr().err.splitlines()
  assert lines == [f'[study] stopped: {signal.Signals(signum).name} received '
                   'outside training (scoring or collecting); every finished '
                   'run and score is kept: rerun the same command to resume']
  assert signal.getsignal(signum) == before


def test_a_truncated_music_score_is_one_line_naming_the_file(tmp_path):
  from experiments import music
  from selfattn.errors import ConfigError
  (tmp_path / 'music.json').write_text('{"valid": {"nll": 0.4')
  run = study.Run('run', ml_collections.ConfigDict(), {})
  with pytest.raises(ConfigError, match=r"music\.json.*delete it to rescore") as e:
    music.evaluate_run(run, str(tmp_path), data={})
  assert '\n' not in str(e.value)


def test_scale_quick_marks_its_results_as_a_smoke_test(tmp_path):
  """--scale=quick runs what --quick runs; its results.md lacked the banner
  and its results.json the marker that say these numbers are not results."""
  import json
  with flagsaver.flagsaver():
    flags.FLAGS(['study', '--scale=quick'])
    text = common.write_results(str(tmp_path), 'T', [('h', 'b')], {'x': 1})
  assert common.QUICK_BANNER in text
  assert json.loads((tmp_path / 'results.json').read_text())[
      'quick_mode_smoke_test'] is True


@pytest.mark.parametrize('argv', [['--quick', '--steps=500'],
                                  ['--scale=quick', '--steps=500']])
def test_steps_is_refused_at_the_quick_scale_however_it_is_named(
    tmp_path, monkeypatch, capsys, argv):
  """Quick runs have their own length: --steps with --scale=quick was
  accepted and silently replaced by 200 once that scale was accepted."""
  from experiments import exercise2_learned
  monkeypatch.setattr(study, 'execute', lambda *a, **k: pytest.fail('ran'))
  with flagsaver.flagsaver():
    flags.FLAGS(['study', f'--workdir={tmp_path}'] + argv)
    with pytest.raises(SystemExit) as stop:
      skeleton.main(exercise2_learned.STUDY)([])
  assert stop.value.code == 2
  assert capsys.readouterr().err.strip() == (
      "error: --steps: this study's runs have their length set by its scale "
      '(here quick)')


@pytest.mark.parametrize('driver', ['compare_positions', 'exercise2_learned',
                                    'exercise3_relative'])
def test_scale_quick_is_a_scale_of_every_study(driver):
  """--quick is --scale=quick (the skeleton's own message says so), but the
  studies with one CPU scale refused --scale=quick as not theirs."""
  import importlib
  spec = importlib.import_module(f'experiments.{driver}').STUDY
  with flagsaver.flagsaver():
    flags.FLAGS(['study', '--scale=quick'])
    assert skeleton.chosen_scale(spec) == 'quick'
    flags.FLAGS(['study', '--scale=cpu'])
    assert skeleton.chosen_scale(spec) == 'cpu'


def test_another_studys_report_is_not_replaced(tmp_path):
  """Two studies given one --workdir: the second's report replaced the
  first's results.md (and results.json) without a word."""
  from selfattn.errors import ConfigError
  common.write_results(str(tmp_path), 'Indirect indexing', [('h', 'a')],
                       {'x': 1})
  before = {name: (tmp_path / name).read_text()
            for name in ('results.md', 'results.json')}
  with pytest.raises(ConfigError, match=r"results\.md is the report "
                     r"'Indirect indexing', not this study's \('Length "
                     r"generalization'\).*its own --workdir"):
    common.write_results(str(tmp_path), 'Length generalization',
                         [('h', 'b')], {'x': 2})
  assert {name: (tmp_path / name).read_text() for name in before} == before
  # A task whose name starts with another's is another task.
  common.write_results(str(tmp_path / 'b'), 'Every encoding on reverse', [])
  with pytest.raises(ConfigError, match='Every encoding on reverse_string'):
    common.write_results(str(tmp_path / 'b'),
                         'Every encoding on reverse_string', [])
  # The same study rewrites its own report, also as its title grows
  # under its stem, and back.
  for title in ('Indirect indexing', 'Indirect indexing, and more',
                'Indirect indexing'):
    text = common.write_results(str(tmp_path), title, [('h', title)],
                                stem='Indirect indexing')
    assert (tmp_path / 'results.md').read_text() == text


@pytest.mark.parametrize('argv', [[], ['--collect_only']])
def test_a_study_in_another_studys_workdir_is_refused_before_it_runs(
    tmp_path, monkeypatch, capsys, argv):
  """A helper's probe (2026-12-01): exercise 2 given compare_positions'
  workdir trained its five runs and overwrote the other report's figure
  before write_results refused its results.md. Now nothing trains, scores
  or draws: one line, exit 2, the other report as it was."""
  common.write_results(str(tmp_path), 'Indirect indexing', [('h', 'a')])
  (tmp_path / 'position=a,seed=0').mkdir()
  before = (tmp_path / 'results.md').read_text()
  spec = _TwoEncodings()
  monkeypatch.setattr(study, 'execute', lambda *a, **k: pytest.fail('ran'))
  monkeypatch.setattr(spec, 'prepare', lambda *a: pytest.fail('prepared'))
  with flagsaver.flagsaver():
    flags.FLAGS(['study', f'--workdir={tmp_path}'] + argv)
    with pytest.raises(SystemExit) as stop:
      skeleton.main(spec)([])
  assert stop.value.code == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith('error: ') and '\n' not in err
  assert "the report 'Indirect indexing', not this study's ('Two " in err
  assert not spec.scored and not spec.reported
  assert (tmp_path / 'results.md').read_text() == before
  # The one-function studies (chapter, exercise 1) likewise, before fn.
  ran = []
  with flagsaver.flagsaver():
    flags.FLAGS(['study', f'--workdir={tmp_path}'])
    with pytest.raises(SystemExit):
      skeleton.main_of(lambda *args: ran.append(args), 'Exercise 1')([])
  assert not ran and "not this study's ('Exercise 1')" in capsys.readouterr().err


@pytest.mark.parametrize('driver, folder', [
    ('chapter', 'chapter'), ('compare_positions', 'compare'),
    ('exercise1_depth', 'exercise1'), ('exercise2_learned', 'exercise2'),
    ('exercise3_relative', 'exercise3'),
    ('exercise1_learning_rate', 'exercise1_lr'),
    ('indirect_indexing', 'indirect_indexing'),
    ('indirect_indexing_convergence', 'indirect_indexing_convergence'),
    ('length_generalization', 'lengthgen'),
    ('length_generalization_convergence', 'lengthgen_convergence'),
    ('music', 'music'),
    ('music_convergence', 'music_convergence'),
    ('music_meter_convergence', 'music_meter_convergence'),
    ('translation', 'translation'),
    ('translation_convergence', 'translation_convergence')])
def test_each_study_owns_its_committed_workdir(driver, folder):
  """The early owner check reads each study's title: the committed reports'
  titles pass it (or rerunning a committed study would be refused), and
  another study's title does not."""
  import importlib
  from selfattn.errors import ConfigError
  module = importlib.import_module(f'experiments.{driver}')
  workdir = os.path.join(os.path.dirname(__file__), '..', '..', 'experiments',
                         'results', folder)
  if hasattr(module, 'STUDY'):
    with flagsaver.flagsaver():
      flags.FLAGS(['study'])              # compare_positions' --task default
      title, stem = module.STUDY.report_title()
  else:
    title, stem = module.TITLE, None
  common.check_report_owner(workdir, title, stem)
  with pytest.raises(ConfigError):
    common.check_report_owner(workdir, 'Two encodings')


def test_a_report_that_leaves_finished_runs_out_says_so(tmp_path, capsys):
  """Rerun with fewer --seeds, a study's report shrank without a word."""
  spec = _TwoEncodings()
  for name in ('position=a,seed=0', 'position=a,seed=1', 'position=b,seed=1'):
    (tmp_path / name).mkdir()
    (tmp_path / name / 'summary.json').write_text('{"step": 10}')
  (tmp_path / '.xla_cache' / 'x').mkdir(parents=True)
  (tmp_path / '.xla_cache' / 'x' / 'summary.json').write_text('{}')
  with flagsaver.flagsaver():
    flags.FLAGS(['study', f'--workdir={tmp_path}', '--seeds=1',
                 '--collect_only'])
    skeleton.main(spec)([])
  assert spec.reported == [('small', 2, ['position=a,seed=0'])]
  assert ('note: 2 finished run(s) in' in capsys.readouterr().err)


def test_positions_names_a_variant_with_a_comma_by_its_folder_name(capsys):
  """Exercise 2's variant names hold commas, which --positions splits: the
  flag takes each by its folder name; the error lists names as the flag
  can carry them."""
  from experiments import exercise2_learned as exercise2
  spec = exercise2.STUDY
  with flagsaver.flagsaver():
    flags.FLAGS(['study'])                # the plan reads --steps
    runs = spec.runs('cpu', 1, None)
  # The spelling the flag takes is the committed folder of each variant.
  for run in runs:
    variant = run.name.split('/')[1].split(',seed=')[0]
    assert skeleton.flag_spelling(run.tags['position']) == variant
  with flagsaver.flagsaver():
    flags.FLAGS(['study', '--positions=learned_dropout_0.1,sinusoidal',
                 '--tasks=sort'])
    chosen = skeleton.chosen_filters(spec)
  assert chosen['position'] == ['learned, dropout 0.1', 'sinusoidal']
  kept = study.select(runs, tasks=chosen['task'],
                      positions=chosen['position'])
  assert [r.name for r in kept] == ['sort/sinusoidal,seed=0',
                                    'sort/learned_dropout_0.1,seed=0']
  with flagsaver.flagsaver():
    flags.FLAGS(['study', '--positions=learned, dropout 0.1'])
    with pytest.raises(SystemExit):
      skeleton.chosen_filters(spec)
  err = capsys.readouterr().err
  # Split at the comma: 'learned' is a variant, 'dropout 0.1' is not.
  assert ('--positions: dropout 0.1 unknown (valid: sinusoidal, learned, '
          'learned_sinusoidal_init, sinusoidal_dropout_0.1, '
          'learned_dropout_0.1; a name with a comma goes by its folder name, '
          'commas and spaces as underscores)') in err


def test_a_spelling_shared_by_two_variants_is_refused_not_guessed(capsys):
  """'a b' and 'a,b' both spell a_b: the flag names neither of them."""
  class Spelled(_TwoEncodings):
    def filter_values(self):
      return {'position': ('a b', 'a,b', 'c')}
  assert skeleton.flag_spelling('x,y z ,w') == 'x_y_z_w'
  with flagsaver.flagsaver():
    flags.FLAGS(['study', '--positions=a_b,c'])
    with pytest.raises(SystemExit):
      skeleton.chosen_filters(Spelled())
  err = capsys.readouterr().err
  assert '--positions: a_b spells more than one name (a b; a,b)' in err
  assert 'unknown' not in err
