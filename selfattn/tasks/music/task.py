"""JSB Chorales as a training task: a language model on random crops.

`jsb_chorales` is a task like the synthetic ones (tasks/registry.py), so training,
checkpoints, resumption, TensorBoard and the study runner work unchanged:
its task length is the crop (window) in tokens, and an example is

    inputs  = seq[s : s + length]         seq = [START] + serialized piece
    targets = seq[s + 1 : s + length + 1]

with the piece drawn in proportion to its length (every training token about
equally likely, as the corpus NLL weighs them) and s a uniform multiple of 4,
so slot i of a crop always holds the same voice (the Music Transformer's
serialization, jsb.py). Option `crop_align` a > 1 makes s a multiple of 4a
(a time steps): with a = 16, crops start on a bar line of 4/4 sixteenths, so
target i of every crop has the same step phase, (i // 4) % 16, and a model
that sees only offsets meets the meter at a consistent phase. Pieces shorter than the window come whole, padded
(weight 0). Like every task, a batch is a pure function of (seed, step):
the crops are drawn in JAX from the training split held as one padded
array. Option `transpose` r > 0 shifts each crop by a uniform number of
semitones in -r..r (Huang et al.'s augmentation), among the shifts that keep
the crop on the keyboard.

The model attends causally (TaskSpec.language_model) and predicts the next
token at every position. The training loop's periodic evaluation draws
crops of the *training* pieces by default (a fit metric, as every committed
music run did), transposed like training's; option `eval_split='valid'`
draws them from the validation pieces instead, untransposed (held out: what
early stopping and a TensorBoard comparison of encodings want).
Validation and test NLL over whole pieces come from experiments/music.py.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from selfattn.tasks.music import jsb
from selfattn.tasks.spec import Example
from selfattn.tasks.spec import TaskSpec


EVAL_SPLITS = ('train', 'valid')


def training_corpus(data_dir: str | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(pieces (N, longest) int32 of [START] + tokens padded with PAD, lengths
  (N,) of each sequence): the training split, read once per process."""
  return corpus('train', data_dir)


@functools.lru_cache(maxsize=8)
def corpus(split: str, data_dir: str | None = None
           ) -> tuple[np.ndarray, np.ndarray]:
  """training_corpus's arrays for any split of jsb.SPLITS."""
  pieces = [np.concatenate([[jsb.START], jsb.serialize(g)]).astype(np.int32)
            for g in jsb.load(data_dir)[split]]
  longest = max(len(p) for p in pieces)
  table = np.full((len(pieces), longest), jsb.PAD, np.int32)
  for i, p in enumerate(pieces):
    table[i, :len(p)] = p
  return table, np.array([len(p) for p in pieces], np.int32)


def _make_sampler(V: int, options: dict, split: str = 'train',
                  transpose: bool = True):
  """Crops of `split`'s pieces, each piece drawn in proportion to its
  length; shifted by up to `transpose` semitones when `transpose`."""
  del V
  table, lengths = (training_corpus() if split == 'train' else corpus(split))
  table, lengths = jnp.asarray(table), jnp.asarray(lengths)
  log_weight = jnp.log(lengths.astype(jnp.float32))
  r = int(options.get('transpose', 0)) if transpose else 0
  stride = jsb.NUM_VOICES * int(options.get('crop_align', 1))  # tokens
  pitches = jsb.NUM_PITCHES

  def sample(key, length, max_length):
    key_piece, key_start, key_shift = jax.random.split(key, 3)
    piece = jax.random.categorical(key_piece, log_weight)
    n = lengths[piece]
    num_starts = jnp.maximum(n - 1 - length, 0) // stride + 1
    s = stride * jax.random.randint(key_start, (), 0, num_starts)
    seq = jax.lax.dynamic_slice_in_dim(
        jnp.pad(table[piece], (0, max_length + 1)), s, max_length + 1)
    t = jnp.arange(max_length)
    valid = (t < length) & (s + 1 + t < n)
    x, y = seq[:-1], seq[1:]
    if r:
      both = jnp.concatenate([x, y])
      counted = jnp.concatenate([valid, valid]) & (both < pitches)
      lo = jnp.maximum(-r, -jnp.min(jnp.where(counted, both, pitches)))
      hi = jnp.minimum(r, pitches - 1 - jnp.max(jnp.where(counted, both, -1)))
      k = jax.random.randint(key_shift, (), lo, hi + 1)
      x = jnp.where(x < pitches, x + k, x)
      y = jnp.where(y < pitches, y + k, y)
    count = jnp.sum(valid).astype(jnp.int32)
    x = jnp.where(valid, x, jsb.PAD)
    y = jnp.where(valid, y, 0)
    return Example(x, count, y, count, jnp.ones((max_length,), bool))
  return sample


def _make_eval_sampler(V: int, options: dict):
  """The loop's evaluation examples: training's crops (eval_split='train',
  the same sampler, as before the option existed) or untransposed crops of
  the validation pieces."""
  if options.get('eval_split', 'train') == 'train':
    return _make_sampler(V, options)
  return _make_sampler(V, options, split=options['eval_split'],
                       transpose=False)


def _options_problem(options: dict, max_len: int) -> str | None:
  del max_len
  if not 0 <= options['transpose'] <= 12:
    return (f'config.task.transpose must be between 0 and 12 semitones; got '
            f'{options["transpose"]}')
  if options['eval_split'] not in EVAL_SPLITS:
    return (f'config.task.eval_split={options["eval_split"]!r} is not a split '
            f'the loop can evaluate on; valid: {", ".join(EVAL_SPLITS)}')
  return None


JSB_TASKS: dict[str, TaskSpec] = {
    'jsb_chorales': TaskSpec(
        description='next token of JSB Chorales (SATB, 16th notes, the Music '
                    'Transformer serialization), random crops of the training '
                    'split',
        make_sampler=_make_sampler, make_eval_sampler=_make_eval_sampler,
        level='music', aligned=True,
        language_model=True, fixed_vocab=jsb.NUM_TARGETS,
        input_symbols=lambda V: V + 1,        # + START; PAD is input_symbols
        num_classes=lambda V: V, min_length=4,
        options_problem=_options_problem,
        options=('transpose', 'crop_align', 'eval_split')),
}
