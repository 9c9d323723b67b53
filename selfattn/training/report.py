"""What a run reports: its results table, the generalization score, a note
on table reach, and the attention maps and position table drawn for
TensorBoard (AttentionProbe, through selfattn.attention_weights)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from selfattn.training import steps
from selfattn.training.build import position_options
from selfattn import tasks as tasks_lib
from selfattn.nn import positions
from selfattn.nn.encoder import attention_weights
from selfattn.training.steps import Trainer


def table_reach_note(config: ml_collections.ConfigDict,
                     task: tasks_lib.Task) -> str | None:
  """huang keeps one learned row per offset within +-(max_len - 1); longer
  evaluations reuse the edge rows (as shaw's clipping does by design). Say
  so, instead of silently (learned, which cannot, is rejected in validation).
  xl needs no note: without randomized positions its offsets are unbounded on
  every attention path but cached decoding, which clips them to
  +-(max_len - 1) and for which validation asks max_len to cover the longest
  sequence; with them validation asks max_len to cover every position
  drawn."""
  position = config.model.position
  longest = task.seq_len(max(list(config.eval.lengths) + [config.task.max_len]))
  if position == 'huang' and longest > config.model.max_len:
    return (f'{position}: evaluation reaches sequence length {longest} > '
            f'config.model.max_len={config.model.max_len}; offsets beyond '
            f'+-{config.model.max_len - 1} share the edge rows of the table')
  return None


def pallas_plain_reasons(config: ml_collections.ConfigDict) -> dict[str, str]:
  """Why attention_impl='pallas' would send this model's self-attention to
  the plain path (MultiHeadAttention's fall-backs that a config decides),
  by the field that decides it; {} where the kernels run it. Dropout's
  holds in training steps only: evaluation runs the kernels."""
  m = config.model
  reasons = {}
  if m.randomize_positions:
    reasons['model.randomize_positions'] = (
        'config.model.randomize_positions gives explicit positions, which '
        'the kernels do not take')
  if m.dropout > 0:
    reasons['model.dropout'] = (
        'config.model.dropout drops attention weights, which the kernels do '
        'not, so training steps take the plain path (evaluation runs the '
        'kernels)')
  if positions.POSITIONS[m.position].relative:
    from selfattn.nn import pallas_attention   # Pallas loads only when asked
    # kernel_kind reads only the encoding's type: an abstract one answers.
    relative = nnx.eval_shape(lambda: positions.build_encoding(
        m.position, position_options(m), num_hiddens=m.num_hiddens,
        num_heads=m.num_heads, max_len=m.max_len, rngs=nnx.Rngs(0)))
    if pallas_attention.kernel_kind(relative) is None:
      reasons['model.position'] = (
          f'config.model.position={m.position!r} is an encoding the kernels '
          f'do not compute (they compute none, the absolute and the '
          f'rotation-only encodings such as rope and pope, alibi, t5 and '
          f'shaw)'
          + ('; this is self-attention only: the decoder\'s cross-attention '
             'has no encoding and runs the kernels'
             if tasks_lib.TASKS[config.task.name].seq2seq else ''))
  return reasons


def execution_note(config: ml_collections.ConfigDict, platform: str
                   ) -> str | None:
  """What the attention settings do on this run's device platform ('cpu',
  'gpu', 'tpu') where that is not what their names suggest: attention_impl=
  'pallas' runs the plain path for what the kernels do not compute, the
  kernels run interpreted on a CPU (the same numbers, far slower: for
  checking, not training), and a gpu_kernel choice acts only on a CUDA GPU.
  None when there is nothing to say."""
  m = config.model
  notes = []
  plain = pallas_plain_reasons(config) if m.attention_impl == 'pallas' else {}
  if plain:
    notes.append("attention_impl='pallas' falls back to the plain path: "
                 + '; '.join(plain.values()))
  # Dropout's fall-back leaves evaluation to the kernels, and an encoding's
  # leaves them a translation decoder's cross-attention (it has none).
  seq2seq = tasks_lib.TASKS[config.task.name].seq2seq
  kernels_run = m.attention_impl == 'pallas' and not set(plain) - {
      'model.dropout', *(['model.position'] if seq2seq else [])}
  if kernels_run and platform == 'cpu':
    notes.append("attention_impl='pallas' on a CPU runs the kernels in "
                 "Pallas's interpreter: the same numbers as on a GPU, far "
                 "slower (train with attention_impl='plain' or 'chunked' "
                 "here)")
  if m.gpu_kernel != 'auto' and platform != 'gpu':
    notes.append(f'config.model.gpu_kernel={m.gpu_kernel!r} chooses among '
                 f'the kernels on a CUDA GPU; on this {platform} it changes '
                 f'nothing')
  return '; '.join(notes) or None


def generalization_score(results: dict[int, dict[str, float]],
                         max_train_len: int) -> float | None:
  """The reference's score: token accuracy averaged over every evaluated
  length above the training range (None if there is none)."""
  longer = [m['token_accuracy'] for n, m in results.items()
            if int(n) > max_train_len]
  return sum(longer) / len(longer) if longer else None


def results_table(summary: dict[str, Any]) -> str:
  """Markdown table of the evaluation per length; marks trained lengths."""
  lo, hi = summary['train_lengths']
  # The autoregressive layout's accuracies are teacher-forced; its
  # free-running ones (own outputs fed back) get their own columns.
  bleu_header = bleu_rule = ''
  if any('bleu' in m for m in summary['eval'].values()):
    bleu_header, bleu_rule = ' BLEU | chrF | sentences |', '---:|---:|---:|'
  free_header = free_rule = ''
  if any('free_running_token_accuracy' in m for m in summary['eval'].values()):
    free_header = ' free-running token acc | free-running sequence acc |'
    free_rule = '---:|---:|'
  lines = [f'{summary["position"]} on {summary["task"]} after step '
           f'{summary["step"]} (chance {summary["chance"]:.3f}, trained on '
           f'lengths {lo}-{hi})', '',
           '| length | in training range | token acc | sequence acc | loss |'
           + free_header + bleu_header,
           '|---:|:---:|---:|---:|---:|' + free_rule + bleu_rule]
  for length, m in summary['eval'].items():
    inside = 'yes' if lo <= int(length) <= hi else 'no'
    free = (f' {m["free_running_token_accuracy"]:.4f} | '
            f'{m["free_running_sequence_accuracy"]:.4f} |'
            if free_header else '')
    if bleu_header:
      free += (f' {m["bleu"]:.2f} | {m["chrf"]:.2f} | '
               f'{int(m["sentences"])} |')
    lines.append(f'| {length} | {inside} | {m["token_accuracy"]:.4f} | '
                 f'{m["sequence_accuracy"]:.4f} | {m["loss"]:.4f} |' + free)
  if summary.get('score') is not None:
    lines += ['', f'score (token accuracy averaged over the evaluated '
              f'lengths above {hi}): {summary["score"]:.4f}']
  return '\n'.join(lines)


def short(results: dict[int, dict[str, float]]) -> str:
  return ', '.join(f'len {n}: {m["token_accuracy"]:.3f}' for n, m in results.items())



class AttentionProbe:
  """Attention maps on one fixed evaluation example, and the position table,
  for TensorBoard images."""

  def __init__(self, trainer: Trainer):
    config = trainer.config
    self._trainer = trainer
    length = min(config.task.max_len, 32)
    # Host constants, identical on every process. A randomized run is drawn
    # at the positions it evaluates with, not at 0..T-1.
    seq2seq = trainer.task.layout == 'encoder_decoder'
    if seq2seq:
      # Translation: the encoder's self-attention on validation sentence 0
      # (the cross-attention is TranslationTrainer.cross_attention's).
      source = trainer.corpus.eval_set('val').source_ids[0]
      batch = tasks_lib.Batch(inputs=np.asarray([source], np.int32),
                              targets=None, weights=None,
                              valid_lens=np.asarray([len(source)], np.int32))
    else:
      batch = jax.device_get(tasks_lib.make_eval_batch(
          trainer.task, config.seed, length, jnp.arange(1),
          max_random_len=steps.max_random_len(config)))

    @jax.jit
    def attention(params):
      model = trainer.model(params)
      # attention_weights gives a scanned stack's weights per layer too.
      _, weights = attention_weights(model.stack if seq2seq else model,
                                     batch.inputs, batch.valid_lens,
                                     positions=batch.positions)
      return [w[0] for w in weights]

    self._attention = attention

  def attention(self, params) -> list[np.ndarray]:
    """Per layer, (H, T, T) weights for the fixed example."""
    return [np.asarray(w) for w in jax.device_get(self._attention(params))]

  def position_table(self, params) -> tuple[np.ndarray | None, bool]:
    """The encoding's own 2-D picture (absolute encodings', or layer 0's
    relative module's `picture()`), and whether it can change in training."""
    enc = self._trainer.model(params).stack
    if enc.scan_layers:
      # The stacked block's relative tables carry a layer axis: draw the
      # absolute table only.
      picture = enc.pos_encoding.picture()
      return (None if picture is None else np.asarray(picture),
              enc.pos_encoding.trainable)
    block = enc.blks[0]
    attention = getattr(block, 'attention', None) or block.self_attention
    rel = attention.relative
    encoding = rel if rel is not None else enc.pos_encoding
    picture = encoding.picture()
    return (None if picture is None else np.asarray(picture),
            encoding.trainable)
