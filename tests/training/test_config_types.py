"""A config file can set any value: every field of default_config holds its
type before anything is built, said in one line naming the field (a config
fuzzing probe found wrong types surfacing as tracebacks deep in a task or a
module, and fractions silently truncated where an integer belongs)."""

import math

import ml_collections
import pytest

from configs import tiny
from selfattn.training import cli_checks
from selfattn.training.config_checks import ConfigError
from selfattn.training.config_checks import validate_config


def _written_as_a_dict(section, name, value):
  """tiny's config as a config file may build it: from a dict, where no
  field has a type yet."""
  fields = tiny.get_config().to_dict()
  fields[section][name] = value
  return ml_collections.ConfigDict(fields)


@pytest.mark.parametrize('section, name, value, message', [
    ('model', 'meter_period', 'x', 'config.model.meter_period must be an integer'),
    ('task', 'shift', 1.5, 'config.task.shift must be an integer; got 1.5'),
    ('task', 'crop_align', None, 'config.task.crop_align must be an integer; got None'),
    ('task', 'max_shift', True, 'config.task.max_shift must be an integer; got True'),
    ('eval', 'lengths', 8, 'config.eval.lengths must be a list; got 8'),
    ('task', 'name', ['reverse'], 'config.task.name must be a string'),
    ('model', 'position', None, 'config.model.position must be a string; got None'),
    ('model', 'relative_values', 'no',
     "config.model.relative_values must be True or False; got 'no'"),
    ('train', 'learning_rate', math.nan,
     'config.train.learning_rate must be a finite number; got nan'),
    ('train', 'grad_clip', math.inf, 'config.train.grad_clip must be a finite number'),
])
def test_a_value_of_another_type_names_its_field(section, name, value, message):
  config = _written_as_a_dict(section, name, value)
  with pytest.raises(ConfigError, match='^' + message.replace('.', r'\.')
                     .replace('(', r'\(').replace('[', r'\[')):
    validate_config(config, num_devices=1)


def test_the_types_a_field_allows():
  config = tiny.get_config()
  config.train.learning_rate = 1                # an int where a float goes
  config.eval.lengths = (4, 8)                  # a tuple where a list goes
  config.model.rope_base = None                 # unset: the encoding's default
  config.task.vocab_size = 12
  assert validate_config(config, num_devices=1).vocab_size == 12
  config = _written_as_a_dict('task', 'vocab_size', 12.0)
  with pytest.raises(ConfigError, match='task.vocab_size must be an integer'):
    validate_config(config, num_devices=1)


@pytest.mark.parametrize('override, message', [
    ('--config.eval.lengths=abc', "'abc' is not a list such as [8,16,32]"),
    ('--config.eval.lengths=8,,16', "'8,,16' is not a list"),
    ('--config.task.vocab_size=abc',
     "config.task.vocab_size is an integer; got 'abc'"),
    ('--config.model.rope_base=abc', "config.model.rope_base is a number"),
    ('--config.model.alibi_symmetric=yes',
     "config.model.alibi_symmetric is True or False; got 'yes'"),
    ('--config.model.max_random_len=1.5',
     "config.model.max_random_len is an integer; got '1.5'"),
])
def test_the_command_line_checks_lists_and_unset_fields_too(override, message):
  """Unset fields (placeholders) and lists had no check before absl, whose
  parse error was a FATAL flags message and exit 1."""
  config, _, problem = cli_checks.config_from_argv(
      ['--config=configs/tiny.py', override])
  assert config is None and message in problem and '\n' not in problem
  config, _, problem = cli_checks.config_from_argv(
      ['--config=configs/tiny.py', '--config.eval.lengths=4,8',
       '--config.task.vocab_size=12', '--config.model.alibi_symmetric=false'])
  assert problem is None


def test_a_model_that_cannot_fit_in_memory_is_refused_before_it_is_built(
    monkeypatch):
  """Sizes whose parameters, gradients and AdamW moments alone exceed the
  device's memory failed with out-of-memory tracebacks at the first step
  (after the workdir was written), or took every byte of the host while
  validation built 10**12 layers. The estimate builds one or two layers
  abstractly and scales by depth."""
  from selfattn.training import config_checks
  monkeypatch.setattr(config_checks, '_memory_bytes', lambda: 2**30)  # 1 GiB
  config = tiny.get_config()
  assert validate_config(config, num_devices=1)
  config.model.num_layers = 10**12
  with pytest.raises(ConfigError, match=r'^config\.model: the parameters, '
                     r'gradients and optimiser state alone take [\d,.]+ GiB '
                     r'\(num_layers=1000000000000, .*more than the 1\.0 GiB'):
    validate_config(config, num_devices=1)
  # 16 bytes a parameter: the input embedding and the output layer hold
  # 2 x 2**23 x 16 of them, 4.0 GiB, and three small layers a little more.
  config.model.num_layers = 3
  config.task.vocab_size = 2**23
  with pytest.raises(ConfigError, match=r'take 4\.[01] GiB \(num_layers=3'):
    validate_config(config, num_devices=1)


def test_a_batch_or_length_that_cannot_fit_in_memory_is_refused(monkeypatch):
  """Activations were not estimated: a batch of 10**8 failed with an
  out-of-memory traceback at the first step (on a CPU host, the kernel's
  OOM killer). A lower bound, by the field that sizes it, is checked
  before any work: each layer's input, the float32 logits and, for
  attention_impl='plain', one layer's (B, H, L, L) weights; evaluation at
  least one example's weights at its longest length."""
  from selfattn.training import config_checks
  monkeypatch.setattr(config_checks, '_memory_bytes', lambda: 2**30)  # 1 GiB
  config = tiny.get_config()
  task = validate_config(config, num_devices=1)
  length, m = task.seq_len(config.task.max_len), config.model
  config.train.batch_size = batch = 2**20
  bound = config_checks._least_memory(config, task, 1)['train.batch_size']
  assert bound == {
      'layer inputs': m.num_layers * batch * length * m.num_hiddens * 4,
      'logits': batch * length * task.num_classes * 4,
      'attention weights': batch * m.num_heads * length**2 * 4}
  # With remat the weights may be recomputed once the logits are freed:
  # only the larger of the two is sure to be held.
  config.model.remat = True
  assert set(config_checks._least_memory(config, task, 1)[
      'train.batch_size']) == {'layer inputs', 'attention weights'}
  config.model.remat = False
  with pytest.raises(ConfigError, match=r'^config\.train\.batch_size=1048576: '
                     r'one training step holds at least [\d.]+ GiB on a '
                     r'device \(layer inputs .*more than the 1\.0 GiB'
                     ) as refused:
    validate_config(config, num_devices=1)
  # Without the (L, L) weights it would fit, so the message says how; at
  # twice the batch the rest alone exceeds it, and it does not.
  assert sum(bound.values()) - bound['attention weights'] < 2**30
  assert "attention_impl='chunked'" in str(refused.value)
  config.train.batch_size = 2 * batch
  with pytest.raises(ConfigError, match='batch_size=2097152') as refused:
    validate_config(config, num_devices=1)
  assert 'chunked' not in str(refused.value)
  config.train.batch_size = batch
  # Split over 8 data-parallel devices, each holds an eighth: it fits;
  # without num_devices, as many as config.mesh.data names (validating a
  # GPU study's config on a laptop is not refused for this host's count).
  assert validate_config(config, num_devices=8)
  config.mesh.data = 8
  assert validate_config(config)
  config.mesh.data = -1
  # Without (L, L) weights the bound is the layer inputs and logits only.
  config.model.attention_impl = 'chunked'
  assert 'attention weights' not in config_checks._least_memory(
      config, task, 1)['train.batch_size']
  config.train.batch_size = 8
  config.model.attention_impl = 'plain'
  config.model.max_len = 2**20
  config.eval.lengths = [4, 2**14]
  with pytest.raises(ConfigError, match=r"^config\.eval\.lengths=\[4, 16384\]"
                     r": one evaluation .*attention_impl='chunked'"):
    validate_config(config, num_devices=1)
  config.model.attention_impl = 'chunked'
  assert validate_config(config, num_devices=1)


@pytest.mark.parametrize('attention_impl, remat, dtype', [
    ('plain', False, 'float32'), ('chunked', False, 'float32'),
    ('plain', True, 'bfloat16')])
def test_the_activation_bound_is_below_what_the_compiled_step_holds(
    attention_impl, remat, dtype):
  """The bound refuses only what cannot fit: it stays below XLA's own
  account of the compiled training step (temporaries, arguments, outputs)."""
  import jax
  from selfattn.training import config_checks
  from selfattn.training.steps import Trainer, dropout_key_for
  config = tiny.get_config()
  config.model.num_layers, config.model.attention_impl = 2, attention_impl
  config.model.remat, config.model.dtype = remat, dtype
  config.train.batch_size, config.task.max_len = 64, 32
  task = validate_config(config, num_devices=1)
  bound = sum(config_checks._least_memory(
      config, task, 1)['train.batch_size'].values())
  trainer = Trainer(config, task=task)
  step = jax.jit(lambda state, batch: trainer.step_with_key(
      state, batch, dropout_key=dropout_key_for(config.seed)))
  held = step.lower(trainer.init_state(), trainer.train_batch(0)).compile(
      ).memory_analysis()
  assert bound < (held.temp_size_in_bytes + held.argument_size_in_bytes
                  + held.output_size_in_bytes)


def test_a_missing_optional_package_is_refused_before_the_run_trains(
    monkeypatch):
  """matplotlib (eval.figures), sentencepiece and sacrebleu (translation)
  are extras a run imports only when it reaches them: a `pip install
  selfattn` without them trained until its first evaluation and then died
  in a traceback. Validation names the package and the extra instead."""
  from configs import translation
  from selfattn.training import config_checks
  absent = set()
  monkeypatch.setattr(config_checks, '_installed',
                      lambda module: module not in absent)
  config = tiny.get_config()
  assert validate_config(config).name == config.task.name  # all present
  absent.update({'matplotlib', 'sentencepiece', 'sacrebleu'})
  with pytest.raises(ConfigError) as e:
    validate_config(config)
  assert str(e.value) == (
      'config.eval.figures=True needs matplotlib, which is not installed: '
      'pip install "selfattn[train]" or set config.eval.figures = False '
      '(--config.eval.figures=False)')
  config.eval.figures = False
  assert validate_config(config).name == config.task.name
  # Translation's extra, checked before its corpus is read (no data here):
  # each missing package named.
  config = translation.get_config('quick')
  config.eval.figures = False
  with pytest.raises(ConfigError) as e:
    validate_config(config)
  assert str(e.value) == (
      'translation (its tokenizer) needs sentencepiece, which is not '
      'installed: pip install "selfattn[translation]"; translation (its BLEU '
      'and chrF) needs sacrebleu, which is not installed: pip install '
      '"selfattn[translation]"')
  absent.discard('sentencepiece')
  with pytest.raises(ConfigError, match=r'^translation \(its BLEU and chrF\) '
                     r'needs sacrebleu'):
    validate_config(config)
