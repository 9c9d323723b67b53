"""The compiled pieces of training for translation (the encoder_decoder
layout): the Trainer interface (advance, train_step, train_batch,
evaluate, healthy) over length-bucketed Multi30k batches.

One training step is one compiled program that switches on the step's
bucket (`lax.switch`): every step runs only its bucket's shapes, and the
batch is still drawn from (seed, step) inside the program, so resuming
reproduces the run exactly.

Evaluation reads the validation split (its first eval.num_examples pairs):
teacher-forced loss and token accuracy, and sacreBLEU/chrF of greedy
translations, per source-length range of config.eval.lengths (a sentence
of n source tokens counts in the first range (previous, L] with n <= L), and
for the whole set (`latest`, logged as valid/bleu and valid/chrf). The test
sets are never read here.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from selfattn.tasks.translation import bleu
from selfattn.training import figures
from selfattn.tasks.translation import translate
from selfattn.tasks.translation import data as translation_data
from selfattn.tasks.translation import task as translation_task
from selfattn.training.steps import Trainer
from selfattn.training.steps import dropout_key_for
from selfattn.training.steps import global_indices
from selfattn.training.steps import state_is_healthy
from selfattn.tasks import Batch
from selfattn.tasks import Task
from selfattn.tasks.translation.data import BOS
from selfattn.tasks.translation.data import PAD
from selfattn.tasks.translation import batches as translation_batches
from selfattn.tasks.translation.batches import TrainingBatches
from selfattn.nn.encoder import captured_attention

NUM_SAMPLES = 4          # validation sentences shown as text per evaluation


def length_ranges(lengths) -> list[tuple[int, int]]:
  """config.eval.lengths [a, b, ...] -> [(0, a), (a, b), ...]: the source
  lengths n with lo < n <= hi."""
  bounds = sorted(int(n) for n in lengths)
  return list(zip([0] + bounds[:-1], bounds))


def teacher_forced_sums(model, batch: Batch) -> dict[str, jax.Array]:
  """Per-example sums (B,): nll, weight, correct, and whether every target
  token is the argmax (all_correct)."""
  logits = model(batch.inputs, batch.valid_lens,
                 decoder_inputs=batch.decoder_inputs, deterministic=True)
  logp = jax.nn.log_softmax(logits)
  nll = -jnp.take_along_axis(logp, batch.targets[..., None], axis=-1)[..., 0]
  w = batch.weights
  correct = (jnp.argmax(logits, -1) == batch.targets)
  return {'nll': jnp.sum(nll * w, 1), 'weight': jnp.sum(w, 1),
          'correct': jnp.sum(correct * w, 1),
          'all_correct': jnp.all(correct | (w == 0), axis=1)}


def eval_batch(sources: np.ndarray, source_lens: np.ndarray,
               targets: np.ndarray) -> Batch:
  """Host arrays of one evaluation chunk -> a Batch (targets end in EOS)."""
  return Batch(inputs=sources, targets=targets,
               weights=(targets != PAD).astype(np.float32),
               valid_lens=source_lens,
               decoder_inputs=translation_data.decoder_inputs(targets))


class TranslationTrainer(Trainer):
  """Trainer (steps.py) for the encoder_decoder layout.

  Extra attributes: corpus (translation_data.Corpus), batches
  (TrainingBatches), token_budget (padded tokens a training batch holds:
  train.batch_tokens, or train.batch_size sentences of the longest
  bucket), latest (after evaluate: whole-set valid BLEU/chrF, samples, and
  one sentence's cross-attention), translate_ids(params, source_ids,
  method=...), translate_texts(params, sentences, method=...).
  """

  def __init__(self, config: ml_collections.ConfigDict,
               mesh: jax.sharding.Mesh | None = None,
               task: Task | None = None):
    self._setup(config, mesh, task)
    self._init_data()
    self._init_training_steps()
    self._init_evaluation()

  def _init_data(self) -> None:
    """The corpus, the token budget of a batch and the length buckets."""
    config, task = self.config, self.task
    self.corpus = corpus = translation_data.prepare(
        task.vocab_size, config.task.max_len,
        *translation_task.LANGUAGES[task.name])
    # A fixed budget keeps the protocols' batches alike: +short's buckets end
    # lower, and batch_size x its longest bucket would hold fewer tokens.
    self.token_budget = translation_batches.token_budget(
        config.train.batch_tokens, config.train.batch_size,
        corpus.buckets[-1].bound)
    self.batches = TrainingBatches(corpus, self.token_budget, self.mesh.size)

  def _init_training_steps(self) -> None:
    """advance, train_step, train_batch and healthy (Trainer's contract):
    each step draws its bucket from (seed, step), then that bucket's batch;
    jax.lax.switch runs one compiled branch per bucket."""
    batches, by_example = self.batches, self.by_example
    seed_arg, replicated = self.seed_arg, self.replicated
    step_with_key, parts = self.step_with_key, self.parts
    indices = tuple(global_indices(0, n, by_example) for n in batches.sizes)
    num_buckets = len(batches.sizes)

    def batch_of(b, seed, step, indices):
      return jax.lax.with_sharding_constraint(
          batches.batch(b, seed, step, indices[b]), by_example)

    def per_bucket(fn, state, indices, seed):
      """fn(state, batch) on the batch of state's step, in its bucket."""
      def branch(b):
        return lambda state: fn(state, batch_of(b, seed, state['step'],
                                                indices))
      return jax.lax.switch(batches.bucket(seed, state['step']),
                            [branch(b) for b in range(num_buckets)], state)

    def advance(state, indices, seed):
      return per_bucket(lambda state, batch: step_with_key(
          state, batch, dropout_key=dropout_key_for(seed)), state, indices,
                        seed)

    compiled = functools.partial(jax.jit, donate_argnums=0,
                                 out_shardings=(replicated, replicated))
    advance = compiled(advance)
    self.advance = lambda state: advance(state, indices, seed_arg)
    self.train_step = compiled(functools.partial(
        step_with_key, dropout_key=dropout_key_for(self.config.seed)))

    bucket_of = jax.jit(batches.bucket)
    batch_jit = jax.jit(batch_of, static_argnums=0)

    def train_batch(step: int) -> Batch:
      b = int(bucket_of(seed_arg, np.int32(step)))
      return batch_jit(b, seed_arg, np.int32(step), indices)
    self.train_batch = train_batch

    # Checked on the next step's batch, as Trainer does.
    healthy = jax.jit(lambda state, indices, seed: per_bucket(
        lambda state, batch: state_is_healthy(state, batch, parts), state,
        indices, seed), out_shardings=replicated)
    self.healthy = lambda state: bool(healthy(state, indices, seed_arg))

  def _init_evaluation(self) -> None:
    """The compiled teacher-forced sums and decoding that evaluate uses."""
    self._teacher_forced = jax.jit(
        lambda params, batch: teacher_forced_sums(self.model(params), batch))

    @functools.partial(jax.jit, static_argnames=('num_steps', 'method',
                                                 'beam_size', 'alpha'))
    def run_translate(params, sources, lens, *, num_steps, method, beam_size,
                      alpha):
      return translate.translate(self.model(params), sources, lens, num_steps,
                                 method=method, beam_size=beam_size,
                                 alpha=alpha)
    self._run_translate = run_translate
    self.latest: dict[str, Any] = {}

  @property
  def decode_limit(self) -> int:
    """The most target tokens a translation may have: 4x the longest
    bucket, and fewer than the decoder's positions (max_len), since BOS
    takes position 0 (a learned table has no row past max_len - 1)."""
    return min(self.config.model.max_len - 1,
               4 * self.corpus.buckets[-1].bound)

  def translate_ids(self, params, source_ids, *, method: str = 'greedy',
                    beam_size: int = 4, alpha: float = 0.6
                    ) -> list[list[int]]:
    """Target ids (no EOS) of each source (lists of ids), in order."""
    run = lambda s, n, k: self._run_translate(
        params, s, n, num_steps=k, method=method, beam_size=beam_size,
        alpha=alpha)
    budget = self.token_budget // (beam_size if method == 'beam' else 1)
    return translate.translate_all(run, source_ids, token_budget=budget,
                                   limit=self.decode_limit)

  def translate_texts(self, params, sources: list[str], **kwargs) -> list[str]:
    """Detokenized translations of raw source sentences."""
    tok = self.corpus.tokenizer
    return [tok.decode(ids) for ids in
            self.translate_ids(params, tok.encode(sources), **kwargs)]

  def evaluate(self, params, lengths=None) -> dict[int, dict[str, float]]:
    """Per source-length range (config.eval.lengths or `lengths`): loss,
    token and sequence accuracy (teacher-forced), BLEU and chrF of greedy
    translations, and the number of sentences."""
    config = self.config
    val = self.corpus.eval_set('val')
    n = min(config.eval.num_examples, len(val))
    src, tgt = val.source_ids[:n], val.target_ids[:n]
    per_example = {k: np.zeros(n) for k in
                   ('nll', 'weight', 'correct', 'all_correct')}
    for idx, sources, lens, targets in translation_data.eval_chunks(
        src, tgt, self.token_budget):
      sums = jax.device_get(self._teacher_forced(
          params, eval_batch(sources, lens, targets)))
      kept = idx >= 0
      for k, v in sums.items():
        per_example[k][idx[kept]] = np.asarray(v)[kept]
    hyp_ids = self.translate_ids(params, src)
    hyps = [self.corpus.tokenizer.decode(ids) for ids in hyp_ids]
    refs = val.references[:n]
    src_lens = val.source_lens()[:n]
    results = {}
    for lo, hi in length_ranges(config.eval.lengths if lengths is None
                                else lengths):
      chosen = np.flatnonzero((src_lens > lo) & (src_lens <= hi))
      if not len(chosen):
        continue
      s = {k: float(v[chosen].sum()) for k, v in per_example.items()}
      scores = bleu.score([hyps[i] for i in chosen], [refs[i] for i in chosen])
      results[hi] = {'loss': s['nll'] / max(s['weight'], 1.0),
                     'token_accuracy': s['correct'] / max(s['weight'], 1.0),
                     'sequence_accuracy': s['all_correct'] / len(chosen),
                     'bleu': scores['bleu'], 'chrf': scores['chrf'],
                     'sentences': float(len(chosen))}
    whole = bleu.score(hyps, refs)
    self.latest = {
        'bleu': whole['bleu'], 'chrf': whole['chrf'],
        'bleu_signature': whole['bleu_signature'],
        'samples': [(val.sources[i], refs[i], hyps[i])
                    for i in range(min(NUM_SAMPLES, n))],
        'cross_attention': (self.cross_attention(params, src[0], hyp_ids[0])
                            if self.config.eval.figures else None),
    }
    return results

  def extra_summaries(self) -> list[tuple[str, str, Any]]:
    return translation_summaries(getattr(self, 'latest', None))

  def cross_attention(self, params, source: list[int], target: list[int]
                      ) -> dict[str, Any]:
    """The last decoder layer's cross-attention, averaged over heads, for
    one sentence pair: {'weights' (T, S) rows the target tokens (BOS +
    target) and columns the source tokens, 'rows', 'columns' the pieces}."""
    model = self.model(params)
    src = jnp.asarray([source], jnp.int32)
    dec = jnp.asarray([[BOS] + list(target)], jnp.int32)
    _, inter = _capture_cross(model, src, dec)
    weights = np.asarray(inter[-1][0]).mean(axis=0)       # (T, S)
    pieces = self.corpus.tokenizer.id_pieces
    return {'weights': weights, 'rows': ['<s>'] + pieces(target),
            'columns': pieces(source)}


def _capture_cross(model, sources: jax.Array, decoder_inputs: jax.Array):
  """(logits, [per decoder layer (B, H, T, S) cross-attention weights])."""
  from flax import nnx
  lens = jnp.asarray([sources.shape[1]], jnp.int32)
  out, inter = nnx.capture(model, nnx.Intermediate)(
      sources, lens, decoder_inputs=decoder_inputs, deterministic=True)
  return out, [weights for path, weights in captured_attention(inter)
               if 'cross_attention' in path]


def translation_summaries(latest: dict[str, Any] | None):
  """(kind, tag, value) for TensorBoard from TranslationTrainer.latest:
  scalars valid/bleu and valid/chrf, a text table of sample translations,
  and the cross-attention image (unless config.eval.figures is off).
  Nothing for other trainers."""
  if not latest:
    return []
  out = [('scalar', 'valid/bleu', latest['bleu']),
         ('scalar', 'valid/chrf', latest['chrf'])]
  lines = ['| source | reference | model |', '|---|---|---|']
  for source, reference, hypothesis in latest['samples']:
    cells = [c.replace('|', '\\|') for c in (source, reference, hypothesis)]
    lines.append('| ' + ' | '.join(cells) + ' |')
  out.append(('text', 'translations/validation', '\n'.join(lines)
              + f'\n\nvalidation BLEU {latest["bleu"]:.2f} '
              f'({latest["bleu_signature"]}), greedy decoding'))
  cross = latest['cross_attention']
  if cross is None:                   # config.eval.figures off
    return out
  out.append(('image', 'attention/cross_attention', figures.render(
      figures.alignment_figure(
          cross['weights'], cross['rows'], cross['columns'],
          'cross-attention of the last decoder layer, mean over heads: '
          'validation sentence 0, greedy translation'))))
  return out
