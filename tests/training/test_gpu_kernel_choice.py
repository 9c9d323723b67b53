"""config.model.gpu_kernel: a run's choice among attention_impl='pallas''s
GPU kernels. What the choice could not run is refused at validation, and a
run traces its attention under the choice (on this CPU no GPU kernel runs,
so the tests read which kernel the tracing asked for)."""

import pytest

from selfattn.errors import ConfigError
from selfattn.training import config_checks
from selfattn.training import train


def _pallas_config(config, **model):
  config.model.attention_impl = 'pallas'
  for name, value in model.items():
    config.model[name] = value
  return config


@pytest.mark.parametrize('model, message', [
    # Huang's skewed term is not one the kernels compute: the preference
    # would never be used (attention_impl='pallas' runs the plain path).
    (dict(gpu_kernel='triton', position='huang'),
     r"gpu_kernel='triton' cannot run this model \(position='huang', "
     r"dtype='float32'\) here: the Pallas kernels do not compute "
     'HuangRelative'),
    (dict(gpu_kernel='hopper', dtype='float32'),
     r"gpu_kernel='hopper' computes .* in bfloat16 .* got none, float32"),
    # Shaw's 2k + 1 rows of both tables overflow the shared memory.
    (dict(gpu_kernel='hopper', dtype='bfloat16', position='shaw',
          clip_distance=400),
     r'got shaw, bfloat16, heads 8 wide, clip 400'),
    # PoPE's rotation doubles q's and k's width, which cuDNN cannot pair
    # with v's.
    (dict(gpu_kernel='cudnn', dtype='bfloat16', position='pope'),
     r"gpu_kernel='cudnn' computes .* got PolarEncoding \(none\), bfloat16, "
     r'q/k heads 16 and v heads 8 wide'),
    (dict(gpu_kernel='cudnn', dtype='bfloat16', position='rope'),
     r"gpu_kernel='cudnn' needs a CUDA GPU in this process .* has cpu"),
    # Explicit positions and active dropout take the plain path.
    (dict(gpu_kernel='triton', position='rope', randomize_positions=True,
          max_random_len=64),
     r"gpu_kernel='triton' would never run: .* no explicit positions, so "
     r'config.model.randomize_positions'),
    (dict(gpu_kernel='triton', dropout=0.1),
     r"would never run: the Pallas kernels compute no dropout"),
])
def test_a_kernel_choice_that_cannot_run_the_model_is_refused(
    tiny_config, model, message):
  config = _pallas_config(tiny_config, **model)
  with pytest.raises(ConfigError, match=message):
    config_checks.validate_config(config)


@pytest.mark.parametrize('model', [
    dict(gpu_kernel='triton', position='shaw'),
    dict(gpu_kernel='hopper', dtype='bfloat16', position='pope'),
    dict(gpu_kernel='hopper', dtype='bfloat16', position='t5'),
])
def test_a_kernel_choice_that_runs_the_model_passes(tiny_config, model):
  """The refusals' controls: the same fields with a model the choice runs
  validate (no error) and give the config's task."""
  config = _pallas_config(tiny_config, **model)
  assert config_checks.validate_config(config).name == config.task.name


def test_a_run_traces_its_attention_under_the_chosen_kernel(
    tiny_config, tmp_path, monkeypatch):
  """The kernel choice is read when a step is traced, so the run wraps its
  tracing in it; the first pallas_attention call it traces stops the run
  here (nothing compiles), recording the choice in force."""
  from selfattn.nn import pallas_attention
  seen = []

  class Traced(Exception):
    pass

  def spy(*args, gpu_kernel=None, **kwargs):
    seen.append((gpu_kernel, pallas_attention._default_gpu_kernel[-1]))
    raise Traced

  monkeypatch.setattr(pallas_attention, 'pallas_attention', spy)
  config = _pallas_config(tiny_config, gpu_kernel='triton')
  with pytest.raises(Traced):
    train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert seen == [(None, 'triton')]
  assert pallas_attention._default_gpu_kernel == ['auto']   # restored


def test_translation_reaches_the_hopper_kernels_with_its_lengths(
    tiny_multi30k, monkeypatch):
  """The decoder's cross-attention took the source lengths as a mask, which
  the Hopper (and cuDNN) kernels refuse: a translation model that passed
  validation under gpu_kernel='hopper' failed when its step was traced.
  They now stay lengths; tracing the model's loss under the choice (no
  compile) finds no refusal, and the cross-attention calls reach the
  kernels with key lengths, not a mask. The made-up corpus stands in for
  Multi30k, which validation reads (a clone without data sets has none)."""
  import jax
  import jax.numpy as jnp
  from flax import nnx
  from tiny_corpus import tiny_translation_config
  from selfattn.nn import pallas_attention
  from selfattn.training.build import build_model
  config = _pallas_config(tiny_translation_config(),
                          gpu_kernel='hopper', dtype='bfloat16')
  config.model.num_hiddens, config.model.ffn_num_hiddens = 32, 32
  task = config_checks.validate_config(config)
  model = build_model(config, task, nnx.Rngs(0))
  src = jnp.ones((2, 6), jnp.int32)
  tgt = jnp.ones((2, 5), jnp.int32)
  lengths = jnp.array([6, 3])
  calls = []
  real = pallas_attention.pallas_attention

  def spy(q, k, v, **kwargs):
    calls.append((q.shape[2], k.shape[2], kwargs.get('key_valid') is None,
                  kwargs.get('key_lengths') is not None,
                  pallas_attention._default_gpu_kernel[-1]))
    return real(q, k, v, **kwargs)

  monkeypatch.setattr(pallas_attention, 'pallas_attention', spy)
  with pallas_attention.default_gpu_kernel('hopper'):
    out = jax.eval_shape(lambda: model(src, lengths, decoder_inputs=tgt))
  assert out.shape[:2] == (2, 5)
  # Target queries (5) over source keys (6): the decoder's cross-attention,
  # one call per decoder layer, with lengths under the Hopper choice.
  cross = [c for c in calls if c[:2] == (5, 6)]
  assert len(cross) == config.model.num_layers
  assert all(c[2:] == (True, True, 'hopper') for c in cross)
