"""Free-running evaluation: the fixed-point rounds against the key/value cache.

  python scripts/bench_free_running.py [--quick]

The autoregressive layout's free-running accuracy feeds the model's own
greedy outputs back (selfattn/training/free_running.py). Two ways compute the same
logits: `fixed_point` repeats full causal passes until the fed-back tokens
stop changing (1 to M - 1 passes for M output slots, after the
teacher-forced pass evaluation makes anyway), `cache` steps through all T
positions one token at a time through the key/value caches. Measured here,
in alternation in one run, on reverse_string in the autoregressive layout
(2 layers of width 64, 4 heads: the small Chomsky scale) at an evaluation
length, for an untrained model and for the same model after some training
steps: the rounds depend on how often the model's fed-back predictions
change (measured: one round untrained, 33 after 1000 steps, BENCHMARKS.md).
Prints the rounds taken, each method's time for a batch and the ratio.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from configs import chomsky  # noqa: E402
from measure import compare_times  # noqa: E402
from selfattn.training import steps  # noqa: E402
from selfattn import tasks as tasks_lib  # noqa: E402
from selfattn.training.free_running import cached_free_running_logits  # noqa: E402
from selfattn.training.free_running import free_running_logits  # noqa: E402


def _config(quick: bool):
  config = chomsky.get_config('quick' if quick else 'small')
  config.task.layout = 'autoregressive'
  config.task.per_batch_length = False
  return config


def _methods(trainer, task, padded):
  graphdef, rest = trainer.graphdef, trainer.rest
  first = task.first_output_token
  max_rounds = task.spec.output_length(padded) - 1

  @jax.jit
  def teacher_forced(params, batch):
    return steps.forward(graphdef, rest, params, batch)

  @jax.jit
  def fixed_point(params, batch):
    logits_of = lambda b: steps.forward(graphdef, rest, params, b)
    tf = logits_of(batch)     # evaluation has it already; timed apart
    return free_running_logits(logits_of, batch, first_output_token=first,
                               max_rounds=max_rounds, teacher_forced_logits=tf,
                               return_rounds=True)

  @jax.jit
  def cached(params, batch):
    return cached_free_running_logits(trainer.model(params), batch,
                                      first_output_token=first)

  return teacher_forced, fixed_point, cached


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true')
  parser.add_argument('--length', type=int, default=None,
                      help='evaluation length (default: the largest of the '
                      'scale, 48 for small)')
  parser.add_argument('--train_steps', type=int, default=None)
  args = parser.parse_args()
  config = _config(args.quick)
  length = args.length or max(config.eval.lengths)
  train_steps = args.train_steps or (30 if args.quick else 1000)
  repeats = 2 if args.quick else 5
  trainer = steps.Trainer(config)
  task = trainer.task
  padded = length
  batch = tasks_lib.make_eval_batch(
      task, 0, length, jnp.arange(config.eval.num_examples),
      padded_length=padded)
  teacher_forced, fixed_point, cached = _methods(trainer, task, padded)
  print(f'reverse_string, autoregressive layout, evaluation length {length} '
        f'(T = {batch.inputs.shape[1]} positions, '
        f'{task.spec.output_length(length)} outputs), batch '
        f'{batch.inputs.shape[0]}, {config.model.num_layers} layers of width '
        f'{config.model.num_hiddens}; backend {jax.default_backend()}')
  print('| model | rounds | teacher-forced pass ms | fixed point ms | cache ms '
        '| cache / fixed point | max abs logit difference |')
  print('|:---|---:|---:|---:|---:|---:|---:|')
  state = trainer.init_state()
  for name, steps_to_train in (('untrained', 0),
                               (f'after {train_steps} steps', train_steps)):
    for _ in range(steps_to_train):
      state, _ = trainer.advance(state)
    params = state['params']
    (fixed_logits, rounds), cached_logits = (fixed_point(params, batch),
                                             cached(params, batch))
    valid = (jnp.arange(batch.inputs.shape[1])[None]
             < batch.valid_lens[:, None])[..., None]
    diff = float(jnp.max(jnp.where(valid, jnp.abs(fixed_logits
                                                  - cached_logits), 0)))
    times = compare_times(
        {'tf': teacher_forced, 'fixed': fixed_point, 'cache': cached},
        {k: (params, batch) for k in ('tf', 'fixed', 'cache')}, repeats)
    fixed_ms = 1e3 * (times['fixed'] - times['tf'])  # beyond the teacher pass
    print(f'| {name} | {int(rounds)} | {1e3 * times["tf"]:.1f} | '
          f'{fixed_ms:.1f} | {1e3 * times["cache"]:.1f} | '
          f'{1e3 * times["cache"] / max(fixed_ms, 1e-3):.2f} | {diff:.1e} |')
  print('fixed point ms: the rounds beyond the teacher-forced pass (that pass '
        'is evaluation\'s own); cache ms: all T one-token steps.')


if __name__ == '__main__':
  main()
