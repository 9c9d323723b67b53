"""Each experiment driver's --quick mode: the tables exist and their numbers
are real (baselines near chance, working encodings clearly above).

The trained quick runs of the studies are the extended tier (tiers.py): 40
to 70 s each, they train runs whose configs test_study_plans.py validates
in the commit tier, through the study runner that the length-generalization
test below (kept in the commit tier) trains, kills and resumes."""

import json
import subprocess
import sys

import pytest

from data import REQUIRES_JSB
from runs import ROOT
from runs import subprocess_env
from tiers import EXTENDED

pytestmark = pytest.mark.slow


def run_driver(name, workdir, *flags):
  result = subprocess.run(
      [sys.executable, '-m', f'experiments.{name}', f'--workdir={workdir}',
       '--quick', *flags], cwd=ROOT, capture_output=True, text=True, timeout=900,
      env=subprocess_env())
  assert result.returncode == 0, result.stderr[-3000:]
  text = (workdir / 'results.md').read_text()
  assert text.startswith('# ') and 'QUICK MODE: a smoke test' in text
  data = json.loads((workdir / 'results.json').read_text())
  if isinstance(data, dict):
    assert data.pop('quick_mode_smoke_test') is True
  return data


def token_acc(evals, length):
  return sum(e[str(length)]['token_accuracy'] for e in evals) / len(evals)


@EXTENDED
def test_compare_positions_quick(tmp_path):
  # Three of the quick mode's four encodings: the baseline at chance and two
  # that learn (rope's run goes through the same driver code as theirs).
  data = run_driver('compare_positions', tmp_path, '--task=precedes',
                    '--positions=none,sinusoidal,shaw')
  acc = {name.split('=')[1]: token_acc(e, 8) for name, e in data['accuracy'].items()}
  assert set(acc) == {'none', 'sinusoidal', 'shaw'}
  assert abs(acc['none'] - 0.5) < 0.1
  assert acc['sinusoidal'] > 0.9 and acc['shaw'] > 0.9
  table = (tmp_path / 'results.md').read_text()
  assert table.count('\n| ') == 4      # header + 3 encodings
  assert (tmp_path / 'accuracy_vs_length_precedes.png').stat().st_size > 0
  # One TensorBoard directory per run, named after what varies.
  assert (tmp_path / 'position=shaw,seed=0' / 'summary.json').exists()


def test_compare_positions_refuses_an_unknown_position_before_training(
    tmp_path):
  """--positions names encodings; a typo stops it in one line, with the
  valid names, before any run starts (the skeleton's check, as in every
  study)."""
  result = subprocess.run(
      [sys.executable, '-m', 'experiments.compare_positions',
       f'--workdir={tmp_path}', '--positions=rope,shaww'], cwd=ROOT,
      capture_output=True, text=True, timeout=300, env=subprocess_env())
  assert result.returncode != 0
  assert 'shaww unknown (valid: none, sinusoidal' in result.stderr
  assert not list(tmp_path.glob('position=*'))


@EXTENDED
def test_exercise3_quick(tmp_path):
  data = run_driver('exercise3_relative', tmp_path)
  shift = data['shift']
  assert set(shift) == {'shaw k=2', 'shaw k=2 keys only', 'sinusoidal'}
  # A relative encoding solves shift at twice the trained length.
  assert token_acc(shift['shaw k=2'], 16) > 0.9
  assert token_acc(shift['shaw k=2'], 16) > token_acc(shift['sinusoidal'], 16)


def test_an_exercise_refuses_an_unknown_task_before_training(tmp_path):
  """The exercises are skeleton studies: --tasks names their tasks, and a
  typo stops the study in one line naming the valid ones."""
  result = subprocess.run(
      [sys.executable, '-m', 'experiments.exercise3_relative',
       f'--workdir={tmp_path}', '--tasks=shift,revrse'], cwd=ROOT,
      capture_output=True, text=True, timeout=300, env=subprocess_env())
  assert result.returncode != 0
  assert result.stderr.strip() == ('error: --tasks: revrse unknown (valid: '
                                   'reverse, shift, window_sum)')
  assert not list(tmp_path.iterdir())


@pytest.mark.parametrize('flags,message', [
    (['--workdir=WORKDIR', 'stray'],
     'error: unexpected arguments stray: every setting is a --name=value '
     'flag, and a list has no spaces (8,16)'),
    ([], 'error: --workdir is required')])
def test_a_one_function_study_refuses_bad_arguments_in_one_line(
    tmp_path, flags, message):
  """The chapter's tables and exercise 1 are one function each, not a sweep
  (skeleton.main_of): a stray argument or a missing --workdir stops them
  before any work, with the sweeps' one-line error."""
  result = subprocess.run(
      [sys.executable, '-m', 'experiments.chapter',
       *[f.replace('WORKDIR', str(tmp_path)) for f in flags]], cwd=ROOT,
      capture_output=True, text=True, timeout=300, env=subprocess_env())
  assert result.returncode == 2      # a usage error, as for a config
  assert result.stderr.strip() == message
  assert not list(tmp_path.iterdir())


@EXTENDED
def test_exercise2_quick(tmp_path):
  data = run_driver('exercise2_learned', tmp_path)
  runs = data['reverse']
  assert set(runs) == {'sinusoidal', 'learned', 'learned, sinusoidal init',
                       'sinusoidal, dropout 0.1', 'learned, dropout 0.1'}
  for name, seeds in runs.items():
    assert token_acc([s['eval'] for s in seeds], 8) > 2 * (1 / 8), name
  assert (tmp_path / 'cosine_similarity_reverse.png').stat().st_size > 0


@EXTENDED
def test_exercise1_quick(tmp_path):
  data = run_driver('exercise1_depth', tmp_path)
  collapse = data['rank_collapse']                     # per seed, per layer
  assert collapse['attention only'][0][4] < 1e-4       # collapses to rank one
  assert collapse['attention + skip'][0][4] > 1e-2     # the skip prevents it
  cells = data['trainability']
  assert min(cells['trainability/norm=pre,depth=4,warmup=0']['accuracy']) > 0.9
  assert 'warmup_sweep/norm=post,depth=4,warmup=50,steps=150' in cells
  grads = data['grad_norms_step0']['post,4']            # [seed][layer]
  assert len(grads) == 1 and len(grads[0]) == 4
  assert all(0 < g < 1e3 for g in grads[0])            # post-LN: no blow-up
  probe = data['probe']                                # per seed
  assert probe['sinusoidal'][0]['init'][0] > 0.9       # P is linearly decodable
  assert probe['shaw'][0]['init'][0] < 0.2             # no absolute position
  text = (tmp_path / 'results.md').read_text()
  assert '## Warmup sweep' in text and 'per seed' in text


def test_chapter_quick(tmp_path):
  data = run_driver('chapter', tmp_path)
  assert data['rotation_error'] < 1e-4
  paths = {name: {n: [layers, seq] for n, layers, seq in values}
           for name, values in data['paths'].items()}
  assert paths['CNN (k=3)'][16] == [15, 15]
  assert paths['self-attention'][16] == [1, 1]
  assert paths['RNN'][16] == [1, 15]
  flops = {name: [f for _, _, f in v] for name, v in data['costs'].items()}
  # Attention's FLOPs grow faster than linearly in n, the others linearly.
  assert flops['self-attention'][2] / flops['self-attention'][0] > 20
  assert flops['RNN'][2] / flops['RNN'][0] == pytest.approx(16, rel=0.05)
  for png in ('P_columns_6_to_9.png', 'P_heatmap.png', 'cnn_rnn_attention_cost.png'):
    assert (tmp_path / png).stat().st_size > 0


def _scores(workdir):
  runs = json.loads((workdir / 'results.json').read_text())['runs']
  return {name: (r['score'], r['accuracy']) for name, r in runs.items()}


# Extended with the other trained study runs (tests/README.md): a killed
# run resumes in test_train.py::test_killed_run_resumes_to_the_same_parameters,
# and the study runner selects (--shard included), skips what is finished
# and reports in test_study.py (the skeleton's runs, execution stubbed; a
# diverged run not retrained); what only this test runs is a shard process
# training its share and a kill between two runs of a study.
@EXTENDED
def test_length_generalization_quick_survives_a_kill_and_shards(tmp_path):
  """The study runner: a shard trains only its share, and a collecting
  rerun trains nothing; killed mid-study and restarted, it finishes the
  study, and the run the kill interrupted ends with the numbers of the same
  run trained without interruption (the shard's)."""
  import signal
  import time
  flags = ['--tasks=parity_check', '--positions=rope']   # rope, rope random
  interrupted = 'task=parity_check,position=rope,random=1,seed=0'

  # A shard trains every n-th run only: here the second, the one the kill
  # below interrupts.
  shard = tmp_path / 'shard'
  run_driver('length_generalization', shard, *flags, '--shard=1/2')
  assert [p.parent.name for p in shard.glob('*/summary.json')] == [interrupted]
  before = sorted(p.name for p in shard.iterdir())
  run_driver('length_generalization', shard, *flags, '--collect_only')
  assert sorted(p.name for p in shard.iterdir()) == before

  killed = tmp_path / 'killed'
  cmd = [sys.executable, '-m', 'experiments.length_generalization',
         f'--workdir={killed}', '--quick', *flags]
  proc = subprocess.Popen(cmd, cwd=ROOT,
                          env=subprocess_env(xla_cache=tmp_path / 'xla'),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 600
  # Kill once the first run has finished and the second has a checkpoint.
  while time.time() < deadline and not (
      len(list(killed.glob('*/summary.json'))) >= 1
      and len(list(killed.glob('*/checkpoints/*'))) >= 2):
    time.sleep(0.2)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert not (killed / interrupted / 'summary.json').exists()
  data = run_driver('length_generalization', killed, *flags)
  assert _scores(killed)[interrupted] == _scores(shard)[interrupted]

  assert len(data['runs']) == 2
  text = (killed / 'results.md').read_text()
  assert 'QUICK MODE' in text and '2 of 6 runs finished' in text
  # one (task, encoding, seed) pair: scored, fitted in distribution, and its
  # max over the one seed
  assert len(data['paired_differences']) == 1
  assert len(data['in_distribution_differences']) == 1
  assert list(data['max_over_seeds_differences']) == ['parity_check/rope']
  assert '## In distribution' in text


@EXTENDED
def test_indirect_indexing_quick(tmp_path):
  """The PoPE paper's task through the study runner: PoPE and RoPE runs,
  accuracies per length (trained 20-40, beyond to 52), the paper's numbers
  beside them, and a rerun that trains nothing."""
  data = run_driver('indirect_indexing', tmp_path)
  assert set(data['runs']) == {'position=pope,seed=0', 'position=rope,seed=0'}
  for run in data['runs'].values():
    assert set(run['accuracy']) == {'20', '40', '52'}
    assert all(0 <= a <= 1 for a in run['accuracy'].values())
  text = (tmp_path / 'results.md').read_text()
  assert '11.16 ± 2.45' in text and '2 of 2 runs finished' in text
  assert (tmp_path / 'accuracy_vs_length.png').stat().st_size > 0
  before = (tmp_path / 'position=pope,seed=0' / 'summary.json').stat().st_mtime
  run_driver('indirect_indexing', tmp_path)
  assert (tmp_path / 'position=pope,seed=0' / 'summary.json').stat().st_mtime == before


@EXTENDED
def test_indirect_indexing_convergence_quick(tmp_path):
  """The convergence check of section 7 end to end: both runs stop early
  on the held-out loss, each chosen checkpoint is scored once on fresh
  strings, and a rerun neither retrains nor rescores."""
  data = run_driver('indirect_indexing_convergence', tmp_path)
  assert set(data) == {'position=pope,seed=0', 'position=rope,seed=0'}
  for name, run in data.items():
    assert run['stopped_at'] < 40                 # the quick cap: stopped early
    curve = {int(s): v for s, v in run['held_out_loss'].items()}
    assert run['selected_step'] == min(curve, key=lambda s: (curve[s], s))
    assert run['eval_seed'] == 1000 and set(run['accuracy']) == {'20', '40', '52'}
    assert (tmp_path / name / 'scored.json').exists()
  assert (tmp_path / 'loss_and_accuracy_by_step.png').stat().st_size > 0
  scored = tmp_path / 'position=pope,seed=0' / 'scored.json'
  before = scored.stat().st_mtime
  run_driver('indirect_indexing_convergence', tmp_path)
  assert scored.stat().st_mtime == before


@EXTENDED
def test_length_generalization_convergence_quick(tmp_path):
  """The convergence check of section 5 end to end: each run is read at
  its best accuracy at the longest trained length, from its own
  evaluations, and a rerun retrains nothing."""
  data = run_driver('length_generalization_convergence', tmp_path)
  assert set(data) == {
      f'task=reverse_string,position=rope,random={r},seed=0' for r in (0, 1)}
  for name, run in data.items():
    record = json.loads((tmp_path / name / 'early_stop.json').read_text())
    curve = {e['step']: e['value'] for e in record['evaluations']}
    assert run['chosen']['step'] == min(curve, key=lambda s: (-curve[s], s))
    assert 0 <= run['chosen']['score'] <= 1 and run['stopped_at'] <= 40
  assert (tmp_path / 'score_by_step.png').stat().st_size > 0
  summary = tmp_path / next(iter(data)) / 'summary.json'
  before = summary.stat().st_mtime
  run_driver('length_generalization_convergence', tmp_path)
  assert summary.stat().st_mtime == before


@EXTENDED
@REQUIRES_JSB
def test_music_quick(tmp_path):
  """JSB Chorales end to end in about a minute: training, whole-piece NLL
  on valid and test, NLL by position, samples as MIDI and piano rolls,
  the n-gram floors, and a rerun that neither retrains nor rescores."""
  data = run_driver('music', tmp_path)
  assert set(data['runs']) == {'position=sinusoidal,seed=0',
                               'position=shaw,seed=0'}
  for run in data['runs'].values():
    # 60 steps: better than the unigram floor, far from the n-gram one.
    assert data['floors']['ngram']['test'] < run['test_nll'] < \
        data['floors']['unigram']['test']
    assert len(run['test_nll_by_position']) == 4 * 64
  assert 0.85 < data['floors']['ngram']['valid'] < 0.95
  run_dir = tmp_path / 'position=shaw,seed=0'
  assert (run_dir / 'samples' / 'sample_0.png').stat().st_size > 0
  assert (run_dir / 'samples' / 'sample_0.mid').stat().st_size > 0
  assert (tmp_path / 'nll_by_position.png').stat().st_size > 0
  before = (run_dir / 'music.json').stat().st_mtime
  run_driver('music', tmp_path)
  assert (run_dir / 'music.json').stat().st_mtime == before
