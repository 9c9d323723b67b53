"""Every results.md's "Budget" section (experiments/budget.py), on made-up
run summaries whose answers are known."""

import json
import math

from experiments import budget
from experiments import common


def _summary(path, losses, *, num_steps=2000, every=500, patience=0,
             step=None, lengths=(1, 16), task='reverse', eval_split=None,
             schedule='cosine', metric='bleu'):
  """A finished run's summary.json: losses[i] maps an evaluated length to
  its loss at the i-th evaluation."""
  path.mkdir(parents=True)
  history = [{'step': every * (i + 1),
              'eval': {str(n): {'loss': x, 'token_accuracy': 0.5}
                       for n, x in by_length.items()}}
             for i, by_length in enumerate(losses)]
  (path / 'summary.json').write_text(json.dumps({
      'step': step or num_steps, 'train_lengths': list(lengths), 'task': task,
      'history': history,
      'config': {'train': {'num_steps': num_steps, 'schedule': schedule,
                           'early_stop_patience': patience,
                           'early_stop_metric': metric},
                 'eval': {'every': every},
                 # Runs from before the option have none: 'train'.
                 'task': {} if eval_split is None else {'eval_split': eval_split}}}))


def test_the_last_change_is_over_the_trained_lengths_only():
  summary = {'train_lengths': [1, 16], 'history': [
      {'eval': {'8': {'loss': 1.0}, '16': {'loss': 3.0}, '64': {'loss': 9.0}}},
      {'eval': {'8': {'loss': 0.5}, '16': {'loss': 2.5}, '64': {'loss': 20.0}}}]}
  # Mean over 8 and 16: 2.0, then 1.5; length 64 is beyond the range.
  assert budget.last_change(summary) == -0.5
  assert budget.last_change({'train_lengths': [1, 16],
                             'history': summary['history'][:1]}) is None
  # No evaluated length inside the range: all of them.
  assert budget.trained_range_loss({'64': {'loss': 4.0}, '128': {'loss': 6.0}},
                                   [1, 16]) == 5.0
  summary['history'][1]['eval']['8']['loss'] = math.nan
  assert math.isnan(budget.last_change(summary))


def test_the_section_counts_runs_still_improving_per_budget(tmp_path):
  # Three 2,000-step runs: the loss falls by 0.2, by 1e-5 (converged) and
  # rises by 0.1 over the last interval.
  for name, last in (('a', 0.8), ('b', 1.0 - 1e-5), ('c', 1.1)):
    _summary(tmp_path / f'sweep/{name}', [{'8': 2.0}, {'8': 1.0}, {'8': last}])
  # One 400-step run evaluated once, one that diverged.
  _summary(tmp_path / 'short', [{'8': 1.0}], num_steps=400, every=200)
  _summary(tmp_path / 'nan', [{'8': 1.0}, {'8': math.nan}], num_steps=400,
           every=200)
  heading, text = budget.budget_section(str(tmp_path))
  assert heading == 'Budget'
  lines = text.split('\n')
  assert lines[0] == (
      "- 2 runs of 400 steps (the learning-rate schedule's length), evaluated "
      'every 200 steps: 1 with one evaluation recorded, 1 with a loss that is not finite '
      '(diverged), so their summaries do not say whether they were still '
      'improving at the end.')
  assert lines[1].startswith('- 3 runs of 2,000 steps')
  assert ('fell by more than 0.001 nats in 1 of 3 (change: median -1e-05 '
          'nats, from -0.2 to +0.1)') in lines[1]
  assert 'one evaluation' not in lines[1]
  assert 'At least 1 of these runs was still improving' in text
  assert 'a lower bound: the schedule had brought' in text


def test_a_constant_learning_rate_is_named_and_no_decay_claimed(tmp_path):
  for name in 'ab':
    _summary(tmp_path / name, [{'8': 2.0}, {'8': 1.0}], schedule='constant')
  _, text = budget.budget_section(str(tmp_path))
  assert '- 2 runs of 2,000 steps (at a constant learning rate)' in text
  assert 'At least 2 of these runs were still improving' in text
  assert 'schedule had brought the learning rate down' not in text
  assert "schedule's length" not in text


def test_runs_evaluated_once_are_not_called_converged(tmp_path):
  _summary(tmp_path / 'a', [{'8': 1.0}], every=2000)
  _, text = budget.budget_section(str(tmp_path))
  assert ': evaluated once each, so their summaries do not say' in text
  assert text.endswith('The comparisons above hold at these budgets.')
  assert 'may still fall' not in text and 'At least' not in text


def test_a_converged_sweep_still_names_its_budget(tmp_path):
  for name in 'ab':
    _summary(tmp_path / name, [{'8': 1.0}, {'8': 1.0 - 1e-6}])
  _, text = budget.budget_section(str(tmp_path))
  assert 'in 0 of 2' in text
  assert 'may still fall with a longer schedule' in text


def test_early_stopped_runs_name_where_they_stopped(tmp_path):
  for name, step in (('a', 8000), ('b', 12000)):
    _summary(tmp_path / name, [{'8': 1.0}, {'8': 0.9}], num_steps=20000,
             every=1000, patience=2, step=step)
  _, text = budget.budget_section(str(tmp_path))
  assert text == ('- 2 runs with early stopping on bleu (patience 2 '
                  'evaluations, every 1,000 steps, cap 20,000): 2 stopped at '
                  'step 8,000-12,000, after their metric stopped improving.')
  # One that ran to the cap never stopped improving by its metric.
  _summary(tmp_path / 'c', [{'8': 1.0}, {'8': 0.9}], num_steps=20000,
           every=1000, patience=2, step=20000)
  _, text = budget.budget_section(str(tmp_path))
  # Reaching the cap says only that patience was not used up there: not
  # converged, and not (necessarily) still improving.
  assert ('2 stopped at step 8,000-12,000, after their metric stopped '
          'improving; 1 ran to the cap without stopping, so not shown '
          'converged.') in text
  assert 'still improving' not in text.split('\n\n')[-1]
  assert text.endswith('1 early-stopped run ran to the cap unstopped: at '
                       'that cap, not shown converged.')


def test_a_run_at_the_cap_says_how_far_its_last_new_best_moved(tmp_path):
  """The early-stopping metric read where early stopping reads it (the
  longest evaluated length in the trained range, 16 here, not 64): its
  last new best and the best before it, not the last interval's noise."""
  losses = [{'16': 1.0, '64': 5.0}, {'16': 0.90, '64': 4.0},
            {'16': 0.95, '64': 3.0}, {'16': 0.89, '64': 2.0},
            {'16': 0.93, '64': 1.0}]
  _summary(tmp_path / 'capped', losses, num_steps=2500, patience=3,
           metric='loss')
  _, text = budget.budget_section(str(tmp_path))
  assert ('1 ran to the cap without stopping, so not shown converged (last '
          "new best of loss: step 2,000, 0.01 lower than step 1,000's).") in text
  # A higher-is-better metric, and a run with one best only: nothing said.
  summary = json.loads((tmp_path / 'capped/summary.json').read_text())
  summary['config']['train']['early_stop_metric'] = 'token_accuracy'
  for entry, acc in zip(summary['history'], (0.5, 0.7, 0.6, 0.75, 0.7)):
    entry['eval']['16']['token_accuracy'] = acc
  assert budget.last_new_best(summary) == (2000, 1000, 0.75 - 0.7)
  for entry in summary['history']:
    entry['eval']['16']['token_accuracy'] = 0.5
  assert budget.last_new_best(summary) is None


def test_every_report_ends_with_its_budget(tmp_path):
  _summary(tmp_path / 'run', [{'8': 2.0}, {'8': 1.0}])
  text = common.write_results(str(tmp_path), 'A study', [('Results', 'x')])
  assert text.index('## Results') < text.index('## Budget')
  assert '- 1 run of 2,000 steps' in text
  assert (tmp_path / 'results.md').read_text() == text
  # A folder without finished runs (a report of computations) has none.
  empty = tmp_path / 'empty'
  assert '## Budget' not in common.write_results(str(empty), 'B', [('R', 'y')])


def test_music_says_its_loop_measures_the_fit(tmp_path):
  _summary(tmp_path / 'a', [{'256': 2.0}, {'256': 1.0}], task='jsb_chorales',
           lengths=(256, 256))
  _, text = budget.budget_section(str(tmp_path))
  assert 'in 1 of 1' in text
  assert 'crops of the training pieces, so this is the fit' in text
  _summary(tmp_path / 'b', [{'8': 2.0}, {'8': 1.0}])     # a synthetic task
  _, text = budget.budget_section(str(tmp_path))
  assert 'training pieces' not in text
  # Evaluated on the validation pieces (task.eval_split='valid'): held out.
  held_out = tmp_path / 'held_out'
  _summary(held_out / 'a', [{'256': 2.0}, {'256': 1.0}], task='jsb_chorales',
           lengths=(256, 256), eval_split='valid')
  _, text = budget.budget_section(str(held_out))
  assert 'in 1 of 1' in text and 'training pieces' not in text
