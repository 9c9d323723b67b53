"""Translation in the training system: length buckets, batches as a pure
function of (seed, step), the encoder-decoder model (padding, causality,
cached decoding, tied embeddings), label smoothing against NumPy, the
trainer's evaluation against the decoding it reports, and the config
checks. A small made-up parallel corpus stands in for Multi30k."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from selfattn.tasks.translation import bleu
from selfattn.training import steps
from selfattn.training import train
from selfattn import tasks
from selfattn.tasks.translation import translate
from selfattn.tasks.translation import data as translation_data
from selfattn.tasks.translation import batches as translation_batches
from selfattn.training.config_checks import validate_config
from selfattn.nn.decoder import TransformerDecoder
from selfattn.nn.encoder import TransformerEncoder
from selfattn.errors import ConfigError
from selfattn.nn.models import Seq2SeqModel
from selfattn.tasks.translation.data import BOS, EOS, PAD
from selfattn.training.translation_steps import translation_summaries
from tiny_corpus import tiny_translation_config
from tiers import EXTENDED

# --------------------------------------------------------------------------
# Buckets and batches (no tokenizer).
# --------------------------------------------------------------------------

def _pairs(n=200, seed=0):
  rng = np.random.default_rng(seed)
  src = [list(rng.integers(4, 50, rng.integers(1, 40))) for _ in range(n)]
  tgt = [list(rng.integers(4, 50, rng.integers(1, 40))) for _ in range(n)]
  return src, tgt


def test_every_pair_lands_in_one_bucket_padded_to_its_bound():
  src, tgt = _pairs()
  buckets = translation_data.make_buckets(src, tgt)
  bounds = [b.bound for b in buckets]
  assert bounds == sorted(set(bounds)) and all(b % 8 == 0 for b in bounds)
  assert sum(len(b) for b in buckets) == len(src)
  seen = set()
  lower = 0
  for b in buckets:
    for row in range(len(b)):
      n, m = b.source_lens[row], b.target_lens[row]
      assert lower < max(n, m) <= b.bound          # m counts EOS
      source = tuple(b.sources[row, :n])
      target = tuple(b.targets[row, :m - 1])
      assert b.targets[row, m - 1] == EOS
      assert np.all(b.sources[row, n:] == PAD) and np.all(b.targets[row, m:] == PAD)
      seen.add((source, target))
    lower = b.bound
  assert seen == {(tuple(s), tuple(t)) for s, t in zip(src, tgt)}


def test_decoder_inputs_are_bos_then_the_target():
  targets = np.array([[7, 8, EOS, PAD], [9, EOS, PAD, PAD]], np.int32)
  np.testing.assert_array_equal(translation_data.decoder_inputs(targets),
                                [[BOS, 7, 8, PAD], [BOS, 9, PAD, PAD]])


class _Corpus:
  def __init__(self, buckets):
    self.buckets = buckets


def test_an_evaluation_batch_counts_each_target_token_and_its_eos_only():
  """Validation loss and accuracy count a sentence's tokens and its EOS,
  never its padding (by hand; a mutation counting PAD passed every test)."""
  from selfattn.training import translation_steps
  targets = np.array([[5, 6, EOS, PAD, PAD], [7, EOS, PAD, PAD, PAD]],
                     np.int32)
  batch = translation_steps.eval_batch(np.full((2, 4), 9, np.int32),
                                       np.array([4, 2]), targets)
  np.testing.assert_array_equal(batch.weights, [[1, 1, 1, 0, 0],
                                                [1, 1, 0, 0, 0]])


def test_a_batch_is_a_pure_function_of_seed_and_step_and_holds_real_pairs():
  src, tgt = _pairs()
  buckets = translation_data.make_buckets(src, tgt)
  batches = translation_batches.TrainingBatches(_Corpus(buckets), 256)
  # Each bucket's batch holds about the budget: sizes * bound <= 256.
  for size, bound in zip(batches.sizes, batches.bounds):
    assert size == max(1, 256 // bound)
  # Bucket probability proportional to pairs over batch size.
  ratio = np.array([len(b) for b in buckets]) / np.array(batches.sizes)
  np.testing.assert_allclose(batches.probabilities, ratio / ratio.sum())
  draws = [int(batches.bucket(jnp.int32(3), jnp.int32(s))) for s in range(400)]
  empirical = np.bincount(draws, minlength=len(buckets)) / 400
  assert np.abs(empirical - batches.probabilities).max() < 0.1
  b = draws[7]
  indices = jnp.arange(batches.sizes[b])
  one = batches.batch(b, jnp.int32(3), jnp.int32(7), indices)
  two = batches.batch(b, jnp.int32(3), jnp.int32(7), indices)
  other = batches.batch(b, jnp.int32(3), jnp.int32(8), indices)
  for x, y in zip(jax.tree.leaves(one), jax.tree.leaves(two)):
    np.testing.assert_array_equal(x, y)
  assert not np.array_equal(one.inputs, other.inputs)
  bucket = buckets[b]
  rows = {(tuple(bucket.sources[i]), tuple(bucket.targets[i]))
          for i in range(len(bucket))}
  for i in range(len(indices)):
    assert (tuple(np.asarray(one.inputs[i])),
            tuple(np.asarray(one.targets[i]))) in rows
    n_target = int(np.sum(np.asarray(one.targets[i]) != PAD))
    np.testing.assert_array_equal(one.weights[i],
                                  np.arange(bucket.bound) < n_target)
    assert int(one.valid_lens[i]) == int(np.sum(np.asarray(one.inputs[i]) != PAD))
  np.testing.assert_array_equal(
      one.decoder_inputs, translation_data.decoder_inputs(np.asarray(one.targets)))


# --------------------------------------------------------------------------
# The model.
# --------------------------------------------------------------------------

def _model(position='sinusoidal', tie=False, vocab=23, scan_layers=False):
  rngs = nnx.Rngs(0)
  stack = dict(position=position, max_len=64, rngs=rngs,
               scan_layers=scan_layers)
  enc = TransformerEncoder(vocab, 16, 32, 4, 2, **stack)
  dec = TransformerDecoder(vocab, 16, 32, 4, 2, cross_attention=True,
                           tie_output=tie, **stack)
  return Seq2SeqModel(enc, dec, tie_embeddings=tie)


# Sinusoidal (the default) in the commit tier. Extended: shaw and rope, the
# same Seq2SeqModel masks (padding keys, causal decoder); each encoding's
# padding and causality are tests/nn's
# (test_encoder.py::test_padded_tokens_never_change_valid_outputs,
# test_decoder.py::test_cached_decoding_equals_the_full_causal_pass)
# (tests/README.md).
@pytest.mark.parametrize('position', [
    'sinusoidal', pytest.param('shaw', marks=EXTENDED),
    pytest.param('rope', marks=EXTENDED)])
def test_source_padding_and_future_targets_change_nothing(position):
  model = _model(position)
  src = jnp.array([[5, 6, 7, 8, PAD, PAD]], jnp.int32)
  other_padding = src.at[0, 4:].set(9)
  lens = jnp.array([4])
  dec = jnp.array([[BOS, 10, 11, 12, 13]], jnp.int32)
  # One compiled pass, run on each input (all of one shape).
  run = nnx.jit(lambda m, s, n, d: m(s, n, decoder_inputs=d))
  a = run(model, src, lens, dec)
  np.testing.assert_allclose(run(model, other_padding, lens, dec), a,
                             atol=1e-5)
  later = dec.at[0, 3:].set(20)
  np.testing.assert_allclose(run(model, src, lens, later)[:, :3],
                             a[:, :3], atol=1e-5)


def test_cached_greedy_translation_equals_greedy_over_full_passes():
  model = _model('t5')
  src = jnp.array([[5, 6, 7, 8, 9], [10, 11, PAD, PAD, PAD]], jnp.int32)
  lens = jnp.array([5, 2])
  out = np.asarray(nnx.jit(translate.translate, static_argnums=3)(
      model, src, lens, 4))
  # The naive loop: a full decoder pass per step over everything so far.
  dec = np.full((2, 1), BOS, np.int32)
  full_pass = nnx.jit(lambda m, d: m(src, lens, decoder_inputs=d))
  for _ in range(4):
    logits = full_pass(model, jnp.asarray(dec))
    dec = np.concatenate([dec, np.argmax(logits[:, -1], -1)[:, None]], 1)
  expected = dec[:, 1:].copy()
  for row in expected:                    # after EOS, PAD
    if EOS in row.tolist():
      row[row.tolist().index(EOS) + 1:] = PAD
  np.testing.assert_array_equal(out, expected)


def test_tied_embeddings_are_one_table_read_out_by_its_transpose():
  model = _model(tie=True)
  assert model.decoder.embedding is model.encoder.embedding
  assert model.decoder.dense is None
  params = nnx.state(model, nnx.Param)
  untied = nnx.state(_model(tie=False), nnx.Param)
  count = lambda p: sum(x.size for x in jax.tree.leaves(p))
  table = model.encoder.embedding.embedding[...]
  # One table fewer, and no output matrix or bias.
  assert count(untied) - count(params) == table.size + table.size + 23
  # The logits read the table: moving the row of a token that is not in
  # the input moves that token's logit and no other (an output matrix of
  # its own would move nothing).
  src, lens = jnp.array([[5, 6, 7]], jnp.int32), jnp.array([3])
  dec = jnp.array([[BOS, 8]], jnp.int32)
  # One compiled pass; the table is its input, so it reads the moved row.
  run = nnx.jit(lambda m, s, n, d: m(s, n, decoder_inputs=d))
  before = np.asarray(run(model, src, lens, dec))
  # (Not a constant shift: the final LayerNorm's states sum to zero.)
  model.encoder.embedding.embedding[...] = table.at[20].add(
      jnp.linspace(-1.0, 1.0, table.shape[1]))
  after = np.asarray(run(model, src, lens, dec))
  assert np.abs(after[..., 20] - before[..., 20]).min() > 1e-3
  np.testing.assert_allclose(np.delete(after, 20, -1),
                             np.delete(before, 20, -1), atol=1e-6)


def test_label_smoothing_matches_numpy():
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(size=(2, 3, 5)), jnp.float32)
  targets = jnp.array([[1, 2, 0], [4, 4, 3]])
  weights = jnp.array([[1, 1, 0], [1, 0, 1]], jnp.float32)
  batch = tasks.Batch(None, targets, weights, None)
  got = float(steps.smoothed_nll_sum(logits, batch, 0.1))
  logp = np.asarray(jax.nn.log_softmax(logits))
  expected = 0.0
  for b in range(2):
    for t in range(3):
      q = np.full(5, 0.1 / 5)
      q[int(targets[b, t])] += 0.9
      expected += float(weights[b, t]) * -(q * logp[b, t]).sum()
  assert math.isclose(got, expected, rel_tol=1e-5)
  plain = steps.metric_sums(logits, batch)['nll']
  np.testing.assert_allclose(steps.smoothed_nll_sum(logits, batch, 0.0), plain,
                             rtol=1e-6)


def test_the_loss_minimised_is_the_smoothed_one(monkeypatch):
  """loss_and_sums (what train_step differentiates) divides the smoothed
  sum by the counted positions, while its metric sums keep the plain
  cross-entropy: the NumPy sum above, through the step's own wiring (a
  mutation audit's loss that never smoothed passed every test)."""
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(size=(2, 3, 5)), jnp.float32)
  batch = tasks.Batch(None, jnp.array([[1, 2, 0], [4, 4, 3]]),
                      jnp.array([[1, 1, 0], [1, 0, 1]], jnp.float32), None)
  monkeypatch.setattr(steps, 'forward', lambda *args, **kwargs: logits)
  step = lambda smoothing: steps.loss_and_sums(
      None, batch, graphdef=None, rest=None, dropout_key=None, step=None,
      label_smoothing=smoothing)
  loss, sums = step(0.1)
  np.testing.assert_allclose(
      loss, steps.smoothed_nll_sum(logits, batch, 0.1) / 4, rtol=1e-6)
  np.testing.assert_allclose(sums['nll'],
                             steps.metric_sums(logits, batch)['nll'])
  plain, _ = step(0.0)
  np.testing.assert_allclose(plain, sums['nll'] / 4, rtol=1e-6)
  assert abs(float(loss) - float(plain)) > 1e-3   # the case tells them apart


# --------------------------------------------------------------------------
# The trainer on the made-up corpus.
# --------------------------------------------------------------------------

@pytest.mark.slow
def test_the_trainer_steps_on_the_batch_it_shows_and_evaluates_what_it_decodes(
    tiny_multi30k):
  """The translation trainer's step, evaluation and TensorBoard summaries;
  and the activation bound config validation applies to translation
  refuses only what cannot fit: it is below XLA's account of the compiled
  step (all buckets in one program), the program the step runs here."""
  from selfattn.training import config_checks
  from selfattn.training.translation_steps import TranslationTrainer
  config = tiny_translation_config(**{'train.batch_tokens': 2048})
  task = validate_config(config, num_devices=1)
  from selfattn.training.trainers import make_trainer
  trainer = make_trainer(config, task=task)
  assert isinstance(trainer, TranslationTrainer)
  state = trainer.init_state()
  advance = jax.jit(trainer.advance).lower(state).compile()
  held = advance.memory_analysis()
  bound = sum(config_checks._least_memory(
      config, task, 1)['train.batch_tokens'].values())
  assert 0 < bound < (held.temp_size_in_bytes + held.argument_size_in_bytes
                      + held.output_size_in_bytes)
  # advance draws its batch inside the step: the same as train_step on the
  # batch train_batch shows for that step.
  inside, m1 = advance(jax.tree.map(jnp.copy, state))
  outside, m2 = trainer.train_step(state, trainer.train_batch(0))
  for x, y in zip(jax.tree.leaves(inside), jax.tree.leaves(outside)):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
  assert math.isclose(float(m1['loss']), float(m2['loss']), rel_tol=1e-5)
  assert trainer.healthy(inside)
  results = trainer.evaluate(inside['params'])
  val = trainer.corpus.eval_set('val')
  lens = val.source_lens()
  # Ranges (0, 8] and (8, 256]: every sentence counted once.
  assert len(val) == 7 and lens.max() <= 256
  assert sum(m['sentences'] for m in results.values()) == 7
  assert results.get(8, {}).get('sentences', 0) == int(np.sum(lens <= 8))
  hyps = trainer.translate_texts(inside['params'], val.sources)
  assert math.isclose(trainer.latest['bleu'],
                      bleu.score(hyps, val.references)['bleu'])
  cross = trainer.latest['cross_attention']
  assert cross['weights'].shape == (len(cross['rows']), len(cross['columns']))
  np.testing.assert_allclose(cross['weights'].sum(axis=1), 1.0, rtol=1e-5)
  # What TensorBoard gets: the whole-set scores, the samples, the picture.
  written = {tag: (kind, value) for kind, tag, value in
             translation_summaries(trainer.latest)}
  assert written['valid/bleu'] == ('scalar', trainer.latest['bleu'])
  assert val.references[0] in written['translations/validation'][1]
  kind, image = written['attention/cross_attention']
  assert kind == 'image' and image.dtype == np.uint8 and image.shape[2] == 3
  # After one step the model's outputs are empty, which any scoring rates
  # 0 (a mutation scoring subword pieces, not decoded text, passed the
  # BLEU check above). With the references as the translations, both are 100.
  tok = trainer.corpus.tokenizer
  trainer.translate_ids = lambda params, source_ids, **kwargs: tok.encode(
      list(val.references[:len(source_ids)]))
  trainer.evaluate(inside['params'])
  assert trainer.latest['bleu'] == pytest.approx(100)
  assert trainer.latest['chrf'] == pytest.approx(100)


def test_english_to_german_trains_and_evaluates_the_other_way(tiny_multi30k):
  """task.name=multi30k_en_de: English sources, German targets, in the
  training buckets and in every evaluation split; the default stays German
  to English."""
  from tiny_corpus import ENGLISH, GERMAN
  from selfattn.training.trainers import make_trainer
  config = tiny_translation_config(**{'task.name': 'multi30k_en_de'})
  validate_config(config)
  trainer = make_trainer(config)
  corpus = trainer.corpus
  assert 'English to German' in trainer.task.spec.description
  val = corpus.eval_set('val')
  assert val.sources == ENGLISH and val.references == GERMAN
  tok = corpus.tokenizer
  assert val.source_ids == tok.encode(ENGLISH)
  # A training bucket's first pair: an English source, its German target.
  bucket = corpus.buckets[0]
  source = tok.decode([int(t) for t in bucket.sources[0][:bucket.source_lens[0]]])
  target = tok.decode([int(t) for t in bucket.targets[0][:bucket.target_lens[0] - 1]])
  assert source in ENGLISH and target == GERMAN[ENGLISH.index(source)]
  assert translation_data.prepare(300, 64).eval_set('val').sources == GERMAN


def test_a_scanned_decoders_cross_attention_comes_per_layer(tiny_multi30k):
  """Translation refused scan_layers: its cross-attention picture read the
  captures as one per layer, where a scanned decoder sows one array stacked
  on a layer axis. They now come per layer, the loop's for the same
  parameters, and the config is valid."""
  from reference import stack_loop_into_scan
  from selfattn.training.translation_steps import _capture_cross
  loop, scanned = _model(), _model(scan_layers=True)
  for name in ('encoder', 'decoder'):
    stack_loop_into_scan(getattr(loop, name), getattr(scanned, name))
  src = jnp.asarray([[5, 6, 7, 8, 9]], jnp.int32)
  dec = jnp.asarray([[BOS, 6, 7]], jnp.int32)
  _, want = _capture_cross(loop, src, dec)
  _, got = _capture_cross(scanned, src, dec)
  assert len(got) == len(want) == 2 and got[0].shape == (1, 4, 3, 5)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, atol=1e-6)
  validate_config(tiny_translation_config(**{'model.scan_layers': True}))


def test_an_unset_vocabulary_is_the_task_s_own_in_validation(tiny_multi30k,
                                                            monkeypatch):
  """task.vocab_size unset (as configs/tiny.py leaves it) reached the
  tokenizer as None and raised a TypeError traceback: validation now reads
  the task's default, as the trainer does (here shrunk to fit the made-up
  corpus)."""
  import dataclasses
  spec = tasks.TASKS['multi30k']
  monkeypatch.setitem(tasks.TASKS, 'multi30k',
                      dataclasses.replace(spec, default_vocab=300))
  config = tiny_translation_config(**{'task.vocab_size': None})
  assert validate_config(config, num_devices=1).vocab_size == 300


def test_evaluation_lengths_that_hold_no_sentence_are_refused(tiny_multi30k):
  """eval.lengths=[1]: no validation source is that short, so every
  evaluation measured nothing (no score), and early stopping failed on its
  empty record with a traceback."""
  config = tiny_translation_config(**{'eval.lengths': [1]})
  with pytest.raises(ConfigError, match=r'config.eval.lengths=\[1\]: none of '
                     r'the 7 validation sentences evaluated has a source of at '
                     r'most 1 tokens \(the shortest has \d+\)'):
    validate_config(config, num_devices=1)
  config = tiny_translation_config(**{'eval.lengths': [1, 256]})
  assert validate_config(config, num_devices=1)     # one range holds them


def test_translation_configs_refuse_what_they_cannot_do(tiny_multi30k):
  for dotted, value, needle in (
      ('model.randomize_positions', True, 'config.model.randomize_positions'),
      ('train.label_smoothing', 1.0, 'config.train.label_smoothing'),
      ('model.meter_period', 16, 'config.model.meter_period'),
      ('task.vocab_size', 270, 'vocab_size=270'),
      ('train.batch_tokens', -1, 'config.train.batch_tokens')):
    with pytest.raises(ConfigError, match=needle.replace('.', r'\.')):
      validate_config(tiny_translation_config(**{dotted: value}))
  from configs import default
  config = default.get_config()
  config.model.tie_embeddings = True
  with pytest.raises(ConfigError, match='tie_embeddings=True is for the '
                     'encoder_decoder layout'):
    validate_config(config)


def test_translation_values_that_cannot_train_are_refused_before_the_workdir(
    tiny_multi30k, tmp_path):
  """Issue 50: each of these used to start training (or fail only after the
  workdir held .lock and config.json)."""
  from selfattn.tasks.translation import data as translation_data
  longest = translation_data.prepare(300, 64).buckets[-1].bound
  for dotted, value, needle in (
      ('train.batch_tokens', longest - 1,
       f'config.train.batch_tokens={longest - 1} is smaller than one '
       f'sentence of the longest bucket ({longest} padded tokens)'),
      ('model.max_len', longest - 1,
       f'config.model.max_len={longest - 1} is below the longest training '
       f'pair ({longest} padded tokens'),
      ('model.max_len', 1, 'config.model.max_len=1 is below'),
      ('task.max_len', 1, 'config.task.max_len=1: no training source is '
       'that short')):
    workdir = tmp_path / f'{dotted}={value}'
    with pytest.raises(ConfigError, match=re.escape(needle)):
      train.train_and_evaluate(tiny_translation_config(**{dotted: value}),
                               str(workdir))
    assert not workdir.exists()
  validate_config(tiny_translation_config(**{'train.batch_tokens': longest,
                                             'model.max_len': longest}))


def test_a_token_budget_that_cannot_fit_in_memory_is_refused(
    tiny_multi30k, monkeypatch):
  """Translation's activations were not bounded: a token budget of 10**9
  failed only at the first step. The bound is its largest bucket's batch,
  each bucket's size as TrainingBatches makes it, through both stacks."""
  from selfattn.training import config_checks
  monkeypatch.setattr(config_checks, '_memory_bytes', lambda: 2**30)  # 1 GiB
  config = tiny_translation_config()
  task = validate_config(config, num_devices=1)
  bounds = tuple(b.bound for b in translation_data.prepare(300, 64).buckets)
  m = config.model
  config.train.batch_tokens = budget = 2**24
  parts = config_checks._least_memory(config, task, 1)['train.batch_tokens']
  # By hand: the longest bucket holds the most (L^2 weights), budget // L
  # sentences of it.
  longest = bounds[-1]
  batch = budget // longest
  assert parts == {
      'layer inputs': 2 * m.num_layers * batch * longest * m.num_hiddens * 4,
      'logits': batch * longest * task.num_classes * 4,
      'attention weights': batch * m.num_heads * longest**2 * 4}
  with pytest.raises(ConfigError, match=r'^config\.train\.batch_tokens='
                     r'16777216: one training step holds at least'):
    validate_config(config, num_devices=1)
  # Over 64 data-parallel devices, each holds a 64th: it fits.
  config.train.batch_size = config.eval.num_examples = 64
  assert sum(config_checks._least_memory(
      config, task, 64)['train.batch_tokens'].values()) < 2**30
  assert validate_config(config, num_devices=64)
  # Without batch_tokens, batch_size sentences of the longest bucket set
  # the budget, and the refusal names batch_size.
  config.train.batch_tokens, config.train.batch_size = 0, batch
  assert config_checks._least_memory(config, task, 1) == {
      'train.batch_size': parts}
  config.eval.num_examples = 8
  with pytest.raises(ConfigError, match=rf'^config\.train\.batch_size={batch}'
                     r': one training step holds at least .* lower it or '
                     r'config\.task\.max_len'):
    validate_config(config, num_devices=1)


# Extended: the loop that resumes is the one every task trains in, checked
# through a kill by test_train.py::test_killed_run_resumes_to_the_same_parameters;
# translation's batches are a function of (seed, step) in
# test_a_batch_is_a_pure_function_of_seed_and_step_and_holds_real_pairs
# (tests/README.md).
@EXTENDED
@pytest.mark.slow
def test_a_resumed_translation_run_ends_with_the_same_parameters(
    tiny_multi30k, tmp_path):
  """Dropout on and buckets switching: resumed from its step-2 checkpoint,
  as after a crash, the run redraws the buckets, pairs and masks it drew
  the first time."""
  from runs import crashed_copy
  from runs import saved_params
  from selfattn.training import train
  config = tiny_translation_config(**{
      'train.num_steps': 6, 'train.checkpoint_every': 2,
      'train.keep_checkpoints': 3, 'eval.every': 6, 'model.dropout': 0.2})
  straight = tmp_path / 'straight'
  train.train_and_evaluate(config, str(straight))
  resumed = crashed_copy(straight, tmp_path / 'resumed', 2)
  assert train.train_and_evaluate(config, str(resumed))['step'] == 6
  for a, b in zip(saved_params(straight), saved_params(resumed), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
  assert not np.allclose(saved_params(straight, 2)[0], saved_params(straight)[0])


def test_a_damaged_validation_file_is_refused_before_the_workdir(
    tiny_multi30k, tmp_path, monkeypatch):
  """Issue 50's neighbour: a flipped byte in val.de.gz was one line, but
  only after the workdir held .lock, config.json and an events file."""
  from selfattn.errors import DataError
  from selfattn.tasks.translation import multi30k
  real = multi30k.sentences
  def damaged(split, language, data_dir=None):
    if split == 'val':
      raise DataError(f'{split}.{language}.gz: checksum mismatch')
    return real(split, language, data_dir)
  monkeypatch.setattr(multi30k, 'sentences', damaged)
  translation_data._eval_set.cache_clear()
  workdir = tmp_path / 'run'
  with pytest.raises(ConfigError, match=r'val\.de\.gz: checksum mismatch'):
    train.train_and_evaluate(tiny_translation_config(), str(workdir))
  assert not workdir.exists()
  translation_data._eval_set.cache_clear()


@EXTENDED
def test_load_model_gives_a_translation_run_back_with_its_tokenizer(
    tiny_multi30k, tmp_path):
  """load_model on an encoder_decoder run: the Seq2SeqModel with the last
  checkpoint's parameters, which score the validation set as the run's own
  final evaluation did (its summary), and decode text through the returned
  trainer's tokenizer."""
  import json
  from selfattn.training import load_model
  config = tiny_translation_config(**{'train.num_steps': 4,
                                      'eval.every': 4,
                                      'train.checkpoint_every': 4,
                                      'eval.figures': False})
  workdir = tmp_path / 'run'
  train.train_and_evaluate(config, str(workdir))
  run = load_model(str(workdir))
  assert isinstance(run.model, Seq2SeqModel) and run.step == 4
  params = nnx.state(run.model, nnx.Param)
  written = json.loads((workdir / 'summary.json').read_text())['eval']
  results = run.trainer.evaluate(params)
  assert results and set(map(str, results)) == set(written)
  for bound, metrics in results.items():
    assert math.isclose(metrics['loss'], written[str(bound)]['loss'],
                        rel_tol=1e-5), bound
  val = run.trainer.corpus.eval_set('val')
  hyps = run.trainer.translate_texts(params, val.sources)
  assert math.isclose(run.trainer.latest['bleu'],
                      bleu.score(hyps, val.references)['bleu'])
