"""The task interface and registry: every task, laid out for the model,
generated deterministically.

Every example is a pure function of (seed, step, example index, length): batch
generation is a jitted JAX function, so a resumed run sees exactly the batches
it would have seen, and a batch is the same whether one device or many, one
process or many, generate it (each device computes only its own examples).

Five families (see docs/training.md's task table):
  * the 15 tasks of the length-generalization suite of Deletang et al. (2023)
    and Ruoss et al. (2023), defined by their reference code (synthetic/chomsky.py);
  * selfattn's own order tasks (synthetic/order.py): reverse, sort, shift,
    window_sum, precedes;
  * indirect_indexing, the PoPE paper's task (synthetic/indirect_indexing.py);
  * jsb_chorales, next-token prediction on real music (music/task.py);
  * multi30k and multi30k_en_de, translation (translation/task.py).

A laid-out example holds `inputs` (T,) int32, `targets` (T,) int32 and
`weights` (T,) float32 (the positions that count); see spec.py for the
layouts and token ids. `chance` is the accuracy of always guessing the most
likely class (1/V for uniform symbols, 0.5 for balanced binary labels). A model
without positions can beat it on token tasks whose target is one of the inputs
(reverse, sort): it can guess the commonest symbol of the bag of inputs (about
0.35 on reverse with V=8, L=8). `precedes` leaves it exactly at chance.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from selfattn.nn import registration
from selfattn.tasks.synthetic.chomsky import CHOMSKY_TASKS
from selfattn.tasks.synthetic.indirect_indexing import INDIRECT_TASKS
from selfattn.tasks.music.task import JSB_TASKS
from selfattn.tasks.synthetic.order import ORDER_TASKS
from selfattn.tasks.spec import Example
from selfattn.tasks.spec import TaskSpec
from selfattn.tasks.translation.task import TRANSLATION_TASKS

TRAIN_STREAM, _EVAL_STREAM = 0, 1   # training and evaluation never share a key
_POSITIONS_STREAM = 2                # randomized positions, per example

LAYOUTS = ('in_place', 'placeholders', 'autoregressive', 'encoder_decoder')
TASKS: dict[str, TaskSpec] = {**CHOMSKY_TASKS, **ORDER_TASKS, **INDIRECT_TASKS,
                              **JSB_TASKS, **TRANSLATION_TASKS}
_BUILT_IN: frozenset[str] = frozenset(TASKS)   # never replaced
TASK_NAMES: tuple[str, ...] = tuple(TASKS)
SUITE_NAMES: tuple[str, ...] = tuple(CHOMSKY_TASKS)
# Options of selfattn's own tasks, with defaults: shift = k of `shift`
# (output i = input i-k), window = w of `window_sum` (sum over i-w..i+w),
# max_shift = the largest |shift| of `indirect_indexing`, transpose = r of
# `jsb_chorales` (crops shifted by -r..r semitones; 0: off), crop_align = a
# of `jsb_chorales` (crops start on a multiple of a time steps: 1 any step,
# 16 a 4/4 bar of sixteenths), eval_split = which split of `jsb_chorales` the
# training loop evaluates on (train: crops of the training pieces, a fit
# measure, as every committed music run did; valid: of the validation
# pieces, untransposed, a held-out one).
# selfattn.training.default_config and config validation read this, the one list.
DEFAULT_OPTIONS = {'shift': 1, 'window': 1, 'max_shift': 15, 'transpose': 0,
                   'crop_align': 1, 'eval_split': 'train'}


# The options each task registered from outside the package added, so that
# registering it again replaces them too.
_ADDED_OPTIONS: dict[str, dict[str, int]] = {}
# get_task's own arguments, beside which the options are passed.
RESERVED_OPTION_NAMES = frozenset({'name', 'vocab_size', 'layout'})


def layout_problem(name: str, layout: str) -> str | None:
  """Why task `name` cannot use `layout` (one of LAYOUTS), with the layouts
  it can use; None when it can."""
  spec = TASKS[name]
  if layout in spec.layouts:
    return None
  if spec.language_model:
    why = 'a language model predicts the next token in place'
  elif spec.seq2seq:
    why = 'translation needs an encoder and a decoder'
  elif layout == 'encoder_decoder':
    why = 'only translation has a source and a target sequence'
  else:
    why = 'its output is not aligned with its input'
  return (f'task {name!r} cannot use layout {layout!r} ({why}); valid: '
          f'{", ".join(spec.layouts)}')


def register_task(name: str, spec: TaskSpec,
                  options: dict[str, Any] | None = None) -> TaskSpec:
  """Adds a task to TASKS from outside this package, so configs
  (`--config.task.name=<name>`), their validation, training and the
  evaluation at other lengths take it by name. `options`: the new options
  it reads (name -> default, an int: what the command line and validation
  take for a registered option), added to
  DEFAULT_OPTIONS, so each is a `config.task.<option>` field. Call it before
  a config is built, e.g. at the top of your own config file (selfattn.
  training.default_config refuses an option named like one of its fields).

  Registering a name again replaces your earlier entry and its options (a
  config file loaded twice). Raises ValueError for one of selfattn's own
  names, a name or option that is not a Python identifier, an option in
  RESERVED_OPTION_NAMES, an option another task declares with another
  default, or a name in spec.options that is not an option.
  """
  options = dict(options or {})
  registration.check_entry('task', name, options, _BUILT_IN,
                           RESERVED_OPTION_NAMES)
  # The options as they would be without this name's earlier entry.
  others = {n: d for n, d in DEFAULT_OPTIONS.items()
            if n not in _ADDED_OPTIONS.get(name, {})
            or any(n in o for t, o in _ADDED_OPTIONS.items() if t != name)}
  for option, default in options.items():
    if not isinstance(default, int) or isinstance(default, bool):
      raise ValueError(f'option {option!r} of task {name!r}: its default '
                       f'must be an int (registered options are); got '
                       f'{default!r}')
    if others.get(option, default) != default:
      raise ValueError(f'option {option!r} of task {name!r} is already an '
                       f'option with default {others[option]}; use that '
                       f'default or another name')
  unknown = sorted(set(spec.options) - set(others) - set(options))
  if unknown:
    raise ValueError(f'task {name!r} reads option(s) {", ".join(unknown)}, '
                     f'which are neither options already nor given in '
                     f'`options`')
  DEFAULT_OPTIONS.clear()
  DEFAULT_OPTIONS.update({**others, **options})
  _ADDED_OPTIONS[name] = options
  TASKS[name] = spec
  return spec


class Batch(NamedTuple):
  """A padded batch: inputs, targets (B, T) int32; weights (B, T) float32;
  valid_lens (B,) int32 (positions >= valid_len are padding); positions
  (B, T) int32 of randomized positional encodings, or None (0..T-1).

  The encoder_decoder layout (translation): inputs (B, S) are the sources
  and valid_lens their lengths; decoder_inputs (B, T) are BOS + target,
  targets (B, T) target + EOS, weights (B, T) 1 on those. Other layouts
  leave decoder_inputs None."""
  inputs: jax.Array
  targets: jax.Array
  weights: jax.Array
  valid_lens: jax.Array
  positions: jax.Array | None = None
  decoder_inputs: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class Task:
  """A task with its alphabet, options and layout chosen.

  sample(key, length, max_length) -> (inputs, targets, weights, valid_len) for
  one example of task length `length` (a traced int), padded to the static
  sequence length seq_len(max_length); eval_sample the same for the
  training loop's evaluation, where the task draws those from elsewhere (a
  held-out split; None: `sample`'s).
  """
  name: str
  description: str
  level: str
  layout: str
  vocab_size: int               # V: data symbols
  input_symbols: int            # S: every input symbol the task uses
  num_classes: int
  classification: bool
  order_sensitive: bool
  chance: float
  sample: Callable
  min_length: int
  spec: TaskSpec
  eval_sample: Callable | None = None

  @property
  def evaluation_sample(self) -> Callable:
    """What the training loop's evaluation draws its examples from."""
    return self.sample if self.eval_sample is None else self.eval_sample

  @property
  def pad(self) -> int:
    if self.layout == 'encoder_decoder':
      return 0                      # the tokenizer's pad id
    return self.input_symbols

  @property
  def query_token(self) -> int:
    """The CLS token (in_place), placeholder token (placeholders) or
    separator (autoregressive)."""
    return self.input_symbols + 1

  @property
  def first_output_token(self) -> int:
    """The input id of output class 0 in the autoregressive layout (class o
    is fed back as first_output_token + o)."""
    return self.input_symbols + 2

  @property
  def causal(self) -> bool:
    """Whether the model must attend causally (the autoregressive layout,
    or a language model's in-place next-token targets)."""
    return self.layout == 'autoregressive' or self.spec.language_model

  @property
  def input_vocab_size(self) -> int:
    if self.layout == 'encoder_decoder':    # the tokenizer's ids, specials included
      return self.input_symbols
    if self.layout == 'autoregressive':     # pad, separator, output symbols
      return self.input_symbols + 2 + self.num_classes
    # In-place aligned tasks need no CLS or placeholder token.
    extra = not (self.layout == 'in_place' and not self.classification)
    return self.input_symbols + 1 + int(extra)

  def seq_len(self, length):
    """Model sequence length T of an example of task length `length`."""
    n, m = self.spec.input_length(length), self.spec.output_length(length)
    if self.layout == 'encoder_decoder':      # the encoder's (source) length
      return n
    if self.layout in ('placeholders', 'autoregressive'):
      return n + m
    return n + 1 if self.classification else n


def _sized(ex: Example, task_spec: TaskSpec, max_length: int) -> Example:
  """Cuts a sampler's arrays to the task's static input and output sizes."""
  return ex._replace(inputs=ex.inputs[:task_spec.input_length(max_length)],
                     outputs=ex.outputs[:task_spec.output_length(max_length)],
                     output_mask=ex.output_mask[
                         :task_spec.output_length(max_length)])


def _lay_out_in_place(task_spec: TaskSpec, raw, S: int):
  pad, cls = S, S + 1

  def sample(key, length, max_length):
    ex = _sized(raw(key, length, max_length), task_spec, max_length)
    n_max = ex.inputs.shape[0]
    t = jnp.arange(n_max)
    x = jnp.where(t < ex.num_inputs, ex.inputs, pad)
    if task_spec.classification:
      inputs = jnp.concatenate([jnp.array([cls], jnp.int32), x])
      targets = jnp.zeros((n_max + 1,), jnp.int32).at[0].set(ex.outputs[0])
      weights = jnp.zeros((n_max + 1,), jnp.float32).at[0].set(
          ex.output_mask[0].astype(jnp.float32))
      return inputs, targets, weights, ex.num_inputs + 1
    counted = (t < ex.num_outputs) & ex.output_mask
    return (x, jnp.where(counted, ex.outputs, 0), counted.astype(jnp.float32),
            ex.num_inputs)
  return sample


def _lay_out_after_input(task_spec: TaskSpec, raw, S: int, output_token):
  """The input, then one token per output symbol, outputs read there.
  output_token(ex, first, j) is the token at output position j (first: j == 0):
  a placeholder, or (autoregressive) the separator then the previous output."""
  pad = S

  def sample(key, length, max_length):
    ex = _sized(raw(key, length, max_length), task_spec, max_length)
    n_max, m_max = ex.inputs.shape[0], ex.outputs.shape[0]
    t = jnp.arange(n_max + m_max)
    n, m = ex.num_inputs, ex.num_outputs
    is_input, is_output = t < n, (t >= n) & (t < n + m)
    j = jnp.clip(t - n, 0, m_max - 1)          # output index at position t
    inputs = jnp.where(is_input, ex.inputs[jnp.clip(t, 0, n_max - 1)],
                       jnp.where(is_output, output_token(ex, t == n, j), pad))
    counted = is_output & ex.output_mask[j]
    targets = jnp.where(counted, ex.outputs[j], 0)
    return inputs, targets, counted.astype(jnp.float32), n + m
  return sample


def _lay_out_placeholders(task_spec: TaskSpec, raw, S: int):
  placeholder = S + 1
  return _lay_out_after_input(task_spec, raw, S,
                              lambda ex, first, j: placeholder)


def _lay_out_autoregressive(task_spec: TaskSpec, raw, S: int):
  separator, first_output = S + 1, S + 2

  def token(ex, first, j):
    previous = ex.outputs[jnp.clip(j - 1, 0, ex.outputs.shape[0] - 1)]
    return jnp.where(first, separator, first_output + previous)
  return _lay_out_after_input(task_spec, raw, S, token)


def _lay_out_encoder_decoder(task_spec: TaskSpec, raw, S: int):
  del task_spec, S
  return raw        # translation's batches come whole (_no_examples)


def _no_examples(name: str):
  """The `sample` of a task whose data is a corpus batched by length: a
  call says where its batches come from."""
  def sample(key, length, max_length):
    raise TypeError(f'task {name!r} draws no examples one at a time: its '
                    f'batches are pairs of a corpus, bucketed by length '
                    f'(selfattn.tasks.translation.batches.TrainingBatches, '
                    f'which selfattn.training.translation_steps uses)')
  return sample


_LAYOUT_BUILDERS = {'in_place': _lay_out_in_place,
                    'placeholders': _lay_out_placeholders,
                    'autoregressive': _lay_out_autoregressive,
                    'encoder_decoder': _lay_out_encoder_decoder}


def get_task(name: str, vocab_size: int | None = None, *,
             layout: str = 'in_place', **options: Any) -> Task:
  """Builds a task by name. Raises ValueError naming the valid choices.

  vocab_size: data symbols of selfattn's own tasks (default: the spec's
    default_vocab, 8 for most); reference tasks have a fixed alphabet
    (None, or that size).
  layout: 'in_place', 'placeholders', 'autoregressive' or
    'encoder_decoder' (spec.py).
  options: task options (DEFAULT_OPTIONS: shift, window, max_shift,
    transpose, crop_align, eval_split); others are ignored.
  """
  if name not in TASKS:
    raise ValueError(f'unknown task {name!r}; valid: {", ".join(TASKS)}')
  spec = TASKS[name]
  if layout not in LAYOUTS:
    raise ValueError(f'unknown layout {layout!r}; valid: {", ".join(LAYOUTS)}')
  problem = layout_problem(name, layout)
  if problem:
    raise ValueError(problem)
  if spec.fixed_vocab is not None:
    if vocab_size not in (None, spec.fixed_vocab):
      raise ValueError(f'task {name!r} has a fixed alphabet of '
                       f'{spec.fixed_vocab} symbols: leave task.vocab_size '
                       f'unset; got {vocab_size}')
    vocab_size = spec.fixed_vocab
  vocab_size = spec.default_vocab if vocab_size is None else vocab_size
  if vocab_size < 2:
    raise ValueError(f'task.vocab_size must be >= 2, got {vocab_size}')
  opts = {**DEFAULT_OPTIONS, **options}
  raw = (_no_examples(name) if spec.make_sampler is None
         else spec.make_sampler(vocab_size, opts))
  S = spec.input_symbols(vocab_size)
  lay_out = _LAYOUT_BUILDERS[layout]
  eval_raw = (None if spec.make_eval_sampler is None
              else spec.make_eval_sampler(vocab_size, opts))
  num_classes = spec.num_classes(vocab_size)
  chance = (spec.chance(vocab_size) if spec.chance is not None
            else 1.0 / num_classes)
  return Task(name=name, description=spec.description, level=spec.level,
              layout=layout, vocab_size=vocab_size, input_symbols=S,
              num_classes=num_classes, classification=spec.classification,
              order_sensitive=spec.order_sensitive, chance=chance,
              sample=lay_out(spec, raw, S), min_length=spec.min_length,
              spec=spec,
              eval_sample=None if eval_raw is None else lay_out(spec, eval_raw, S))


# --------------------------------------------------------------------------
# Randomized positions (Ruoss et al. 2023).
# --------------------------------------------------------------------------

def random_positions(key: jax.Array, num_valid: jax.Array, T: int,
                     max_random_len: int) -> jax.Array:
  """A sorted uniform random subset of [0, max_random_len) of size num_valid,
  padded to (T,) with zeros (padding is masked out of attention).

  The first T entries of a random permutation are a uniform random T-subset;
  keeping the first num_valid of them gives a uniform num_valid-subset, which
  is then sorted. (Sorting a T-subset and keeping its num_valid smallest would
  bias the positions towards 0.)
  """
  chosen = jax.random.permutation(key, max_random_len)[:T].astype(jnp.int32)
  valid = jnp.arange(T) < num_valid
  return jnp.where(valid, jnp.sort(jnp.where(valid, chosen, max_random_len)), 0)


# --------------------------------------------------------------------------
# Batches.
# --------------------------------------------------------------------------

def example_keys(seed: int, stream: int, position: jax.Array,
                 indices: jax.Array) -> jax.Array:
  """One key per example: key(seed) folded with stream, step (or eval length)
  and the global example index."""
  base = jax.random.fold_in(jax.random.key(seed), stream)
  base = jax.random.fold_in(base, position)
  return jax.vmap(lambda i: jax.random.fold_in(base, i))(indices)


def _with_positions(batch: Batch, keys: jax.Array, max_random_len: int | None
                    ) -> Batch:
  if not max_random_len:
    return batch
  T = batch.inputs.shape[1]
  keys = jax.vmap(lambda k: jax.random.fold_in(k, _POSITIONS_STREAM))(keys)
  positions = jax.vmap(
      lambda k, n: random_positions(k, n, T, max_random_len))(
          keys, batch.valid_lens)
  return batch._replace(positions=positions)


# The batch builders are compiled whole, once per task and static size:
# called outside a jit (a report's figure batch, a study's probe, a test),
# each of their few dozen vmapped operations would otherwise compile on
# its own (about 20 ms each on a CPU) for every new shape. Inside a jit they
# inline. The seed, step, length and indices stay traced, so runs that
# differ only in them share a program.
@functools.partial(jax.jit, static_argnames=(
    'task', 'min_len', 'max_len', 'per_batch_length', 'max_random_len'))
def make_batch(task: Task, seed: int, step: jax.Array, indices: jax.Array,
               min_len: int, max_len: int, *, per_batch_length: bool = False,
               max_random_len: int | None = None) -> Batch:
  """Training batch for `step`: task lengths uniform in [min_len, max_len],
  one per example (or one for the whole batch, as the reference does, with
  per_batch_length), padded to task.seq_len(max_len). `indices` (B,) are global
  example indices. With max_random_len, also randomized positions.
  Compiled per (task, min_len, max_len, per_batch_length, max_random_len)."""
  keys = example_keys(seed, TRAIN_STREAM, step, indices)
  batch_length = None
  if per_batch_length:
    # Depends on (seed, step) only, so every device and process draws it alike.
    batch_length = jax.random.randint(
        jax.random.fold_in(jax.random.key(seed), step), (), min_len, max_len + 1)

  def one(key):
    key_len, key_ex = jax.random.split(key)
    length = (batch_length if per_batch_length else
              jax.random.randint(key_len, (), min_len, max_len + 1))
    return task.sample(key_ex, length, max_len)

  return _with_positions(Batch(*jax.vmap(one)(keys)), keys, max_random_len)


def make_eval_batch(task: Task, seed: int, length: int, indices: jax.Array, *,
                    padded_length: int | None = None,
                    max_random_len: int | None = None) -> Batch:
  """Evaluation batch: every example has task length `length`, padded to
  task.seq_len(padded_length) (default: no padding). The same examples at
  every evaluation of a run. `length` may be traced when padded_length is
  given; without it, it is the batch's static size and must be an int.
  Compiled per (task, padded size, max_random_len)."""
  if padded_length is None:
    try:
      padded_length = operator.index(length)
    except TypeError:
      raise TypeError(
          'make_eval_batch: without padded_length, length is the static '
          f'sequence size and must be an int, not {type(length).__name__}'
      ) from None
  return _eval_batch(task, seed, length, indices, padded_length,
                     max_random_len)


@functools.partial(jax.jit, static_argnums=(0, 4, 5))
def _eval_batch(task: Task, seed: int, length: jax.Array, indices: jax.Array,
                padded_length: int, max_random_len: int | None) -> Batch:
  keys = example_keys(seed, _EVAL_STREAM, length, indices)
  batch = Batch(*jax.vmap(lambda k: task.evaluation_sample(k, length, padded_length))(
      keys))
  return _with_positions(batch, keys, max_random_len)
