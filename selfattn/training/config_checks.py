"""Config validation: every error names the field and, where there is a list,
the valid choices. Runs before anything is compiled or written."""

from __future__ import annotations

import importlib.util
import math
import os

import jax
import jax.numpy as jnp
import ml_collections
from absl import logging

from selfattn.nn import positions
from selfattn import tasks
from selfattn.training import early_stopping
from selfattn.training.free_running import FREE_RUNNING_IMPLEMENTATIONS
# Re-exported: their home is beside build_model, which reads them.
from selfattn.training.build import position_options  # noqa: F401
from selfattn.training.build import task_from_config
from selfattn.errors import ConfigError
from selfattn.errors import DataError
from selfattn.training.steps import SCHEDULES

DTYPES = ('float32', 'bfloat16')


def _positive(config, *fields):
  for field in fields:
    section, name = field.split('.')
    value = config[section][name]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ConfigError(f'config.{field} must be a positive integer; '
                        f'got {value!r}')


def _finite(config, *fields):
  """Refuses a float field that is not a finite number (a string from a
  hand-written config, inf, nan), before its range check compares it."""
  for field in fields:
    section, name = field.split('.')
    value = config[section][name]
    if (not isinstance(value, (int, float)) or isinstance(value, bool)
        or not math.isfinite(value)):
      raise ConfigError(f'config.{field} must be a finite number; got '
                        f'{value!r}')


def _model_problem(model: ml_collections.ConfigDict, message: str) -> str:
  """A constructor's message as a config error: constructors start theirs
  with the argument's name (`norm='x'; valid: ...`), which is the field's
  name under config.model."""
  name = message.split('=', 1)[0]
  if '=' in message and name.isidentifier() and name in model:
    return f'config.model.{message}'
  return f'config.model: the model cannot be built: {message}'


def _data_parallel(config: ml_collections.ConfigDict, num_devices: int) -> int:
  """config.mesh.data as a device count (-1: all num_devices); ConfigError
  for one that no mesh of num_devices can have."""
  data = config.mesh.data
  if data == -1:
    data = num_devices
  if not isinstance(data, int) or data < 1 or data > num_devices:
    raise ConfigError(f'config.mesh.data={config.mesh.data} must be -1 (all) '
                      f'or between 1 and the {num_devices} devices')
  return data


def _check_translation(config: ml_collections.ConfigDict,
                       num_devices: int | None) -> None:
  """What the encoder_decoder layout cannot do, then what the translation
  task finds wrong with its corpus, batches and positions."""
  m = config.model
  for field, value, why in (
      ('model.randomize_positions', m.randomize_positions,
       'randomized positions are not implemented for translation'),
      ('task.per_batch_length', config.task.per_batch_length,
       'translation batches are length-bucketed already')):
    if value:
      raise ConfigError(f'config.{field}=True: {why}; unset it')
  if m.meter_period:
    raise ConfigError('config.model.meter_period is the music task\'s '
                      '(a step phase); set it to 0 for translation')
  from selfattn.tasks.translation import task as translation_task
  devices = (max(int(config.mesh.data), 1) if num_devices is None
             else _data_parallel(config, num_devices))
  # Unset: the task's own vocabulary size, as the trainer builds it.
  vocab_size = (tasks.TASKS[config.task.name].default_vocab
                if config.task.vocab_size is None else config.task.vocab_size)
  try:
    problem = translation_task.config_problem(
        config.task.name, vocab_size=vocab_size,
        max_source_len=config.task.max_len,
        batch_tokens=config.train.batch_tokens, model_max_len=m.max_len,
        devices=devices, eval_lengths=list(config.eval.lengths),
        eval_examples=config.eval.num_examples)
  except DataError as e:          # the corpus is missing or damaged
    raise ConfigError(str(e)) from None
  if problem:
    raise ConfigError(problem)


def validate_config(config: ml_collections.ConfigDict,
                    num_devices: int | None = None) -> tasks.Task:
  """Raises ConfigError for the first problem found in `config`, also for a
  field the config lacks (a hand-made config, or one from an older
  version: selfattn.training.default_config has every field). Returns the task it built
  (the trainer takes it, so the task is built once)."""
  try:
    return _validate(config, num_devices)
  except (AttributeError, KeyError) as e:
    # ml_collections' message: "'name'" then a did-you-mean line that
    # suggests an existing field; the missing name is what matters.
    missing = str(e.args[0] if e.args else e).split('\n')[0].strip('"\' ')
    raise ConfigError(f'the config lacks the field {missing!r} that the run '
                      f'needs; start from selfattn.training.default_config.'
                      f'get_config() (configs/default.py), which has '
                      f'every field') from None


def _validate(config: ml_collections.ConfigDict,
              num_devices: int | None = None) -> tasks.Task:
  _check_types(config)
  _check_seed(config)
  task = _check_task(config)
  _check_packages(config, task)
  _check_model(config)
  _check_gpu_kernel(config, task)
  _check_training(config)
  _check_lengths(config, task, num_devices)
  _check_built(config, task, num_devices)
  if num_devices is not None:
    _check_devices(config, num_devices)
  return task


# (module, what needs it, the extra that installs it): the optional packages
# a run imports only when it reaches them, checked here so that a missing
# one stops the run before it trains (matplotlib at the first evaluation,
# sacrebleu at the first translation score) rather than after.
_FIGURES_PACKAGE = ('matplotlib', 'config.eval.figures=True', 'train')
_TRANSLATION_PACKAGES = (
    ('sentencepiece', 'translation (its tokenizer)', 'translation'),
    ('sacrebleu', 'translation (its BLEU and chrF)', 'translation'))


def _check_packages(config: ml_collections.ConfigDict, task) -> None:
  needed = [_FIGURES_PACKAGE] if config.eval.figures is True else []
  if task.layout == 'encoder_decoder':
    needed += _TRANSLATION_PACKAGES
  missing = [(module, what, extra) for module, what, extra in needed
             if not _installed(module)]
  if missing:
    raise ConfigError('; '.join(
        f'{what} needs {module}, which is not installed: pip install '
        f'"selfattn[{extra}]"'
        + (' or set config.eval.figures = False (--config.eval.figures=False)'
           if module == _FIGURES_PACKAGE[0] else '')
        for module, what, extra in missing))


def _installed(module: str) -> bool:
  """Whether `module` can be imported (found, not imported: matplotlib's
  import alone takes a second)."""
  return importlib.util.find_spec(module) is not None


# Randomized positions draw a permutation of [0, max_random_len) per example
# and step: 2**20 of them for a batch of 64 is 256 MiB of int32.
MAX_RANDOM_LEN = 2 ** 20

_KINDS = {bool: 'True or False', int: 'an integer', float: 'a number',
          str: 'a string', list: 'a list'}


def _check_types(config: ml_collections.ConfigDict) -> None:
  """Every field of selfattn.training.default_config that `config` has holds
  a value of that field's type (None where the default is unset): a config
  file can set any value, and a wrong type used to surface as a traceback
  deep in a task or a module, or, for a fraction where an integer belongs,
  to be truncated without a word."""
  from selfattn.training import default_config
  _check_section_types(config, default_config.get_config(), 'config')


def _check_section_types(config, reference, where: str) -> None:
  for name in reference.keys():
    if name not in config:
      continue                  # validate_config names a missing field
    value, field = config[name], f'{where}.{name}'
    if isinstance(reference[name], ml_collections.ConfigDict):
      if not isinstance(value, ml_collections.ConfigDict):
        raise ConfigError(f'{field} must be a section of fields; got '
                          f'{value!r}')
      _check_section_types(value, reference[name], field)
      continue
    kind = reference.get_ref(name).get_type()
    if value is None:
      if reference[name] is None:
        continue                # unset: the default
      raise ConfigError(f'{field} must be {_KINDS.get(kind, kind.__name__)}; '
                        f'got None')
    if kind is bool:
      ok = isinstance(value, bool)
    elif kind is int:
      ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
      ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))
    elif kind in (list, tuple):
      ok = isinstance(value, (list, tuple))
    else:
      ok = isinstance(value, kind)
    if not ok:
      raise ConfigError(f'{field} must be '
                        f'{"a finite number" if kind is float else _KINDS.get(kind, kind.__name__)}'
                        f'; got {value!r}')


def _check_seed(config: ml_collections.ConfigDict) -> None:
  """An integer in [0, 2**31): the seed enters the compiled steps as an
  int32 (steps.batch_generator)."""
  seed = config.seed
  if not isinstance(seed, int) or isinstance(seed, bool) or not (
      0 <= seed < 2 ** 31):
    raise ConfigError(f'config.seed must be an integer in [0, 2**31); got '
                      f'{seed!r}')


def _check_task(config: ml_collections.ConfigDict) -> tasks.Task:
  """The task's name, layout and lengths, and its own options; then the
  task built (its data read where it has some)."""
  # The registry itself, not TASK_NAMES (fixed at import): a task a
  # researcher adds to tasks.TASKS at run time is valid too.
  if config.task.name not in tasks.TASKS:
    raise ConfigError(f'config.task.name={config.task.name!r} is unknown; '
                      f'valid: {", ".join(tasks.TASKS)}')
  if config.task.layout not in tasks.LAYOUTS:
    raise ConfigError(f'config.task.layout={config.task.layout!r} is unknown; '
                      f'valid: {", ".join(tasks.LAYOUTS)}')
  if config.task.vocab_size is not None:
    _positive(config, 'task.vocab_size')
  _positive(config, 'task.min_len', 'task.max_len')
  # Everything the spec can check comes before the task is built: building
  # reads a data set, whose absence would hide a wrong option behind it.
  spec = tasks.TASKS[config.task.name]
  problem = tasks.registry.layout_problem(config.task.name, config.task.layout)
  if problem:
    raise ConfigError(f'config.task.layout={config.task.layout!r}: {problem}')
  vocab_size = config.task.vocab_size
  if vocab_size is not None and spec.fixed_vocab is not None and (
      vocab_size != spec.fixed_vocab):
    raise ConfigError(f'config.task.vocab_size={vocab_size}: task '
                      f'{config.task.name!r} has a fixed alphabet of '
                      f'{spec.fixed_vocab} symbols; leave it unset')
  if vocab_size is not None and vocab_size < 2:
    raise ConfigError(f'config.task.vocab_size must be >= 2 (or unset: the '
                      f"task's own); got {vocab_size}")
  if config.task.min_len < spec.min_length:
    raise ConfigError(f'config.task.min_len must be >= {spec.min_length} for '
                      f'task {config.task.name!r}; got {config.task.min_len}')
  if config.task.max_len < config.task.min_len:
    raise ConfigError(f'config.task.max_len={config.task.max_len} is below '
                      f'config.task.min_len={config.task.min_len}')
  for name, default in tasks.DEFAULT_OPTIONS.items():
    value = config.task[name]
    if name not in spec.options and value != default:
      users = [n for n, s in tasks.TASKS.items() if name in s.options]
      raise ConfigError(
          f'config.task.{name}={value!r} is an option of {", ".join(users)}, '
          f'not of task {config.task.name!r}, which would ignore it (its '
          f'options: {", ".join(spec.options) or "none"}); leave it at '
          f'{default!r}')
  # Each task checks its own options (tasks/*: TaskSpec.options_problem).
  if spec.options_problem is not None:
    problem = spec.options_problem(
        {name: config.task[name] for name in tasks.DEFAULT_OPTIONS},
        config.task.max_len)
    if problem:
      raise ConfigError(problem)
  if not 1 <= config.task.crop_align <= 64:
    raise ConfigError(f'config.task.crop_align must be between 1 and 64 time '
                      f'steps (16: a 4/4 bar of sixteenths); got '
                      f'{config.task.crop_align}')
  try:
    task = task_from_config(config)
  except (ValueError, DataError) as e:    # a task's data may be missing
    raise ConfigError(str(e)) from None
  return task


def _check_model(config: ml_collections.ConfigDict) -> None:
  """The model section: the encoding and its options, sizes, dtype,
  dropout, meter."""
  m = config.model
  if m.position not in positions.POSITIONS:
    raise ConfigError(f'config.model.position={m.position!r} is unknown; '
                      f'valid: {", ".join(positions.POSITIONS)}')
  options = position_options(m)
  valid_options = positions.POSITIONS[m.position].options
  for name in options:
    if name not in valid_options:
      users = [n for n, k in positions.POSITIONS.items() if name in k.options]
      raise ConfigError(
          f'config.model.{name} is an option of {", ".join(users)}, not of '
          f'position={m.position!r} (its options: '
          f'{", ".join(valid_options) or "none"}); unset it')
  _positive(config, 'model.num_layers', 'model.num_hiddens', 'model.num_heads',
            'model.ffn_num_hiddens', 'model.max_len')
  # norm and attention_impl are checked once, by the constructors, when the
  # model is built abstractly (_check_built); divisibility is checked below.
  if m.dtype not in DTYPES:
    raise ConfigError(f'config.model.dtype={m.dtype!r} is unknown; valid: '
                      f'{", ".join(DTYPES)}')
  _finite(config, 'model.dropout')
  if not 0.0 <= m.dropout < 1.0:
    raise ConfigError(f'config.model.dropout must be in [0, 1); got {m.dropout}')
  if 'rope_base' in options:
    _finite(config, 'model.rope_base')
  if m.meter_period < 0 or m.meter_step_tokens < 1:
    raise ConfigError(f'config.model.meter_period must be >= 0 (0: no meter) '
                      f'and config.model.meter_step_tokens >= 1; got '
                      f'{m.meter_period} and {m.meter_step_tokens}')
  # Before the encoding is built: it reads num_hiddens // num_heads, and a
  # head width of 0 (more heads than dims) was reported as its own option.
  if m.num_hiddens % m.num_heads:
    raise ConfigError(f'config.model.num_hiddens={m.num_hiddens} is not '
                      f'divisible by num_heads={m.num_heads}')
  # The encoding's constructor checks its own options (messages start with
  # the option's name); building it abstractly allocates nothing.
  try:
    positions.build_abstract(m.position, options, num_hiddens=m.num_hiddens,
                             num_heads=m.num_heads, max_len=m.max_len)
  except (ValueError, TypeError) as e:
    raise ConfigError(f'config.model.{e}') from None



def _check_gpu_kernel(config: ml_collections.ConfigDict, task: tasks.Task
                      ) -> None:
  """config.model.gpu_kernel: a choice other than 'auto' insists on its
  kernels, so one that the config's attention would never reach, or that
  would refuse its calls when the first step is traced, fails here."""
  from selfattn.nn.gpu_kernels import GPU_KERNELS
  m = config.model
  if m.gpu_kernel not in GPU_KERNELS:
    raise ConfigError(f'config.model.gpu_kernel={m.gpu_kernel!r} is unknown; '
                      f'valid: {", ".join(GPU_KERNELS)}')
  if m.gpu_kernel == 'auto' or m.num_hiddens % m.num_heads:
    return            # a width the heads do not divide: _check_model refused it
  if m.attention_impl != 'pallas':
    raise ConfigError(
        f'config.model.gpu_kernel={m.gpu_kernel!r} chooses among the kernels '
        f"of attention_impl='pallas' on a CUDA GPU; config.model."
        f'attention_impl is {m.attention_impl!r} (set it to pallas, or '
        f'gpu_kernel to auto)')
  # What MultiHeadAttention sends to the plain path whatever the choice.
  for field, value, why in (
      ('model.randomize_positions', m.randomize_positions,
       'explicit positions'),
      ('model.dropout', m.dropout > 0,
       'dropout on the attention weights, in every training step')):
    if value:
      raise ConfigError(
          f'config.model.gpu_kernel={m.gpu_kernel!r} would never run: the '
          f'Pallas kernels compute no {why}, so config.{field} sends '
          f'attention to the plain path (set gpu_kernel to auto, or unset '
          f'{field})')
  from flax import nnx
  from selfattn.nn import pallas_attention   # Pallas loads only when asked
  head_dim = m.num_hiddens // m.num_heads
  relative = None               # none or an absolute encoding: no hooks
  if positions.POSITIONS[m.position].relative:
    relative = positions.build_encoding(
        m.position, position_options(m), num_hiddens=m.num_hiddens,
        num_heads=m.num_heads, max_len=m.max_len, rngs=nnx.Rngs(0))
  spec = task.spec
  causal = ((False, True) if spec.seq2seq else (True,)
            if spec.language_model else (bool(task.causal),))
  problem = pallas_attention.gpu_kernel_problem(
      m.gpu_kernel, relative, jnp.dtype(m.dtype), m.num_heads, head_dim,
      causal)
  if problem is not None:
    raise ConfigError(f'config.model.gpu_kernel={m.gpu_kernel!r} cannot run '
                      f'this model (position={m.position!r}, dtype='
                      f'{m.dtype!r}) here: {problem}')


def _check_training(config: ml_collections.ConfigDict) -> None:
  """The optimiser, schedule, batch and evaluation settings."""
  _positive(config, 'train.num_steps', 'train.batch_size', 'train.log_every',
            'train.checkpoint_every', 'train.keep_checkpoints', 'eval.every',
            'eval.num_examples')
  _finite(config, 'train.learning_rate', 'train.grad_clip',
          'train.final_lr_fraction', 'train.b2', 'train.weight_decay',
          'train.label_smoothing')
  if not config.train.learning_rate > 0:
    raise ConfigError(f'config.train.learning_rate must be > 0; got '
                      f'{config.train.learning_rate}')
  if config.eval.free_running not in FREE_RUNNING_IMPLEMENTATIONS:
    raise ConfigError(f'config.eval.free_running={config.eval.free_running!r} '
                      'is unknown; valid: '
                      f'{", ".join(FREE_RUNNING_IMPLEMENTATIONS)}')
  if config.train.schedule not in SCHEDULES:
    raise ConfigError(f'config.train.schedule={config.train.schedule!r} is '
                      f'unknown; valid: {", ".join(SCHEDULES)}')
  if not config.train.grad_clip > 0:
    raise ConfigError(f'config.train.grad_clip must be > 0 (the global-norm '
                      f'bound); got {config.train.grad_clip}')
  if not 0.0 <= config.train.final_lr_fraction <= 1.0:
    raise ConfigError(f'config.train.final_lr_fraction must be in [0, 1]; got '
                      f'{config.train.final_lr_fraction}')
  if not 0.0 < config.train.b2 < 1.0:
    raise ConfigError(f'config.train.b2 must be in (0, 1); got '
                      f'{config.train.b2}')
  if config.train.weight_decay < 0:
    raise ConfigError(f'config.train.weight_decay must be >= 0 (AdamW\'s '
                      f'decoupled decay); got {config.train.weight_decay}')
  batch_tokens = config.train.batch_tokens
  if not isinstance(batch_tokens, int) or isinstance(batch_tokens, bool) or (
      batch_tokens < 0):
    raise ConfigError(f'config.train.batch_tokens must be an integer >= 0 '
                      f'(0: batch_size x the longest bucket); got '
                      f'{batch_tokens!r}')
  if not 0.0 <= config.train.label_smoothing < 1.0:
    raise ConfigError(f'config.train.label_smoothing must be in [0, 1); got '
                      f'{config.train.label_smoothing}')
  for field in ('task.per_batch_length', 'model.residual', 'model.remat',
                'model.scan_layers', 'model.randomize_positions',
                'model.tie_embeddings', 'eval.figures'):
    section, name = field.split('.')
    if not isinstance(config[section][name], bool):
      raise ConfigError(f'config.{field} must be True or False; got '
                        f'{config[section][name]!r}')
  if not isinstance(config.train.init_from, str):
    raise ConfigError(f'config.train.init_from must be a workdir path or \'\'; '
                      f'got {config.train.init_from!r}')
  warmup = config.train.warmup_steps
  if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
    raise ConfigError(f'config.train.warmup_steps must be an integer >= 0; '
                      f'got {warmup!r}')
  if warmup >= config.train.num_steps:
    # The schedule clamps it (steps.learning_rate_schedule): say so.
    logging.warning('config.train.warmup_steps=%d is not below '
                    'config.train.num_steps=%d: the warmup is cut to %d '
                    'steps and the decay to one', warmup,
                    config.train.num_steps, config.train.num_steps - 1)
  early_stopping.check_config(config)


def _check_lengths(config: ml_collections.ConfigDict, task: tasks.Task,
                   num_devices: int | None) -> None:
  """Evaluation lengths against the task, the layout's own section, and
  the positions a model can be asked for (randomized or learned)."""
  m = config.model
  lengths = list(config.eval.lengths)
  if not lengths or any(not isinstance(n, int) or isinstance(n, bool)
                        or n < task.min_length for n in lengths):
    raise ConfigError(f'config.eval.lengths must be a non-empty list of '
                      f'integers >= {task.min_length}; got {lengths}')
  if any(a >= b for a, b in zip(lengths, lengths[1:])):
    # A repeat was evaluated twice, the second overwriting the first, and
    # translation scores the source lengths between consecutive entries.
    raise ConfigError(f'config.eval.lengths must increase, without repeats; '
                      f'got {lengths} (sorted: {sorted(set(lengths))})')
  if task.spec.max_length is not None:
    allowed = task.spec.max_length(task.vocab_size)
    if max(lengths + [config.task.max_len]) > allowed:
      raise ConfigError(
          f'task {task.name!r} with task.vocab_size={task.vocab_size} allows '
          f'lengths up to {allowed}; config.task.max_len='
          f'{config.task.max_len} and config.eval.lengths={lengths} go '
          f'beyond: shorten them or raise task.vocab_size')
  longest = task.seq_len(max(lengths + [config.task.max_len]))
  if task.layout == 'encoder_decoder':
    _check_translation(config, num_devices)
  elif m.tie_embeddings:
    raise ConfigError('config.model.tie_embeddings=True is for the '
                      'encoder_decoder layout (translation), which has a '
                      'token table to tie; unset it')
  elif config.train.batch_tokens:
    raise ConfigError(f'config.train.batch_tokens={config.train.batch_tokens} '
                      f'sizes the length-bucketed batches of the '
                      f'encoder_decoder layout (translation); task '
                      f'{task.name!r} batches config.train.batch_size '
                      f'examples: leave it at 0')
  if m.randomize_positions:
    random_len = m.max_random_len
    if m.position == 'none':
      raise ConfigError("config.model.randomize_positions=True has no effect "
                        "with config.model.position='none'; unset it")
    if not isinstance(random_len, int) or random_len < longest:
      raise ConfigError(
          f'config.model.max_random_len={random_len!r} must be an integer >= '
          f'{longest}, the longest sequence (task length '
          f'{max(lengths + [config.task.max_len])} under layout '
          f'{task.layout!r}): positions are a subset of [0, max_random_len)')
    if random_len > MAX_RANDOM_LEN:
      raise ConfigError(
          f'config.model.max_random_len={random_len} is above '
          f'{MAX_RANDOM_LEN:,}: every example draws a permutation of [0, '
          f'max_random_len) at every step (selfattn.tasks.random_positions), '
          f'so its memory and time grow with it')
    if m.position in ('learned', 'huang', 'xl') and m.max_len < random_len:
      raise ConfigError(
          f'config.model.max_len={m.max_len} is below config.model.'
          f'max_random_len={random_len}: the {m.position} table needs a row '
          f'for every position a randomized encoding can draw')
  elif m.position == 'learned' and longest > m.max_len:
    raise ConfigError(
        f'config.eval.lengths reach sequence length {longest}, above the '
        f'learned encoding\'s config.model.max_len={m.max_len}: raise '
        f'max_len or drop the longer lengths')
  if (m.position == 'xl' and task.layout == 'autoregressive'
      and config.eval.free_running == 'cache' and m.max_len < longest):
    raise ConfigError(
        f'config.model.max_len={m.max_len} is below the longest sequence, '
        f'{longest}: xl\'s cached decoding (config.eval.free_running='
        f'\'cache\') clips offsets to +-(max_len - 1), which training and '
        f'teacher forcing do not; raise max_len to {longest} or use '
        f'free_running=\'fixed_point\'')



def _check_built(config: ml_collections.ConfigDict, task: tasks.Task,
                 num_devices: int | None) -> None:
  """Last, the whole model built abstractly (nnx.eval_shape: no memory, no
  compilation): whatever its constructors check and the checks above do
  not name fails here, before any work, instead of at the first step; and
  a model or batch that cannot fit in one device's memory (_least_memory)."""
  from flax import nnx
  from selfattn.training.build import build_model

  def state_bytes(layers: int) -> int:
    """Bytes of the model's state with `layers` layers: parameters four
    times (with their gradients and AdamW's two moments), fixed tables
    (the sinusoidal P) once. A lower bound on what training holds, before
    any activation."""
    # Every layer is built alike, so one or two stand for any depth:
    # building all of them cost time and memory in proportion (a typo of
    # 10**12 layers took every byte of the host).
    shallow = config.copy_and_resolve_references()
    shallow.model.num_layers = layers
    model = nnx.eval_shape(lambda: build_model(shallow, task, nnx.Rngs(0)))
    size = lambda x: math.prod(x.shape) * x.dtype.itemsize
    params, rest = nnx.state(model, nnx.Param, ...)
    return (4 * sum(map(size, jax.tree.leaves(params)))
            + sum(size(x) for x in jax.tree.leaves(rest)
                  if hasattr(x, 'shape')))

  layers = config.model.num_layers
  try:
    two = state_bytes(min(layers, 2))
    need = two if layers <= 2 else two + (layers - 2) * (two - state_bytes(1))
  except (ValueError, TypeError) as e:
    raise ConfigError(_model_problem(config.model,
                                     " ".join(str(e).split()))) from None
  have = _memory_bytes()
  if not have:
    return
  gib = lambda n: f'{n / 2**30:,.1f} GiB'
  if need > have:
    raise ConfigError(
        f'config.model: the parameters, gradients and optimiser state alone '
        f'take {gib(need)} (num_layers={layers}, num_hiddens='
        f'{config.model.num_hiddens}, ffn_num_hiddens='
        f'{config.model.ffn_num_hiddens}, max_len={config.model.max_len}, '
        f'{task.input_symbols} input symbols), more than the '
        f'{gib(have)} of memory of one device here')
  for field, parts in _least_memory(config, task, num_devices).items():
    training = field.startswith('train.')
    if training:
      parts = {**parts, 'parameters, gradients and optimiser state': need}
    total = sum(parts.values())
    if total > have:
      section, name = field.split('.')
      raise ConfigError(
          f'config.{field}={config[section][name]}: one '
          f'{"training step" if training else "evaluation"} holds at least '
          f'{gib(total)} on a device ('
          + ', '.join(f'{what} {gib(n)}' for what, n in parts.items())
          + f'), more than the {gib(have)} of memory of one device here; '
          + ('lower it or config.task.max_len' if training else
             'drop the longest')
          + (", or use config.model.attention_impl='chunked' (O(L) memory)"
             if _fits_without_weights(parts, have) else ''))


def _fits_without_weights(parts: dict[str, int], have: int) -> bool:
  """Whether dropping plain attention's weights (the chunked path) would
  bring `parts` within `have` bytes."""
  weights = sum(n for what, n in parts.items() if 'attention weights' in what)
  return weights > 0 and sum(parts.values()) - weights <= have


def _least_memory(config: ml_collections.ConfigDict, task: tasks.Task,
                  num_devices: int | None) -> dict[str, dict[str, int]]:
  """Lower bounds on the activation bytes a device holds, by the field
  that sizes them: {'train.batch_size': {what: bytes}, 'eval.lengths':
  ...}. Only what no implementation avoids is counted, so a config that
  fits is never refused: a training step keeps every layer's input for
  the backward pass (remat and scanning too) and the logits;
  attention_impl='plain' makes a (B, H, L, L) weight array per layer,
  counted once (with remat, only the larger of it and the logits: the
  weights can be recomputed after the logits are freed); evaluation runs at
  least one example per device at its longest length. num_devices None:
  as many data-parallel devices as config.mesh.data names (all of this
  host's for -1). Translation: the training step of its largest bucket
  batch (a token budget split by length), both stacks' layers, under
  'train.batch_tokens' (or 'train.batch_size' where that sets the budget);
  its evaluation, whose sentences are short, is not bounded."""
  m = config.model
  data = (_data_parallel(config, num_devices) if num_devices is not None
          else jax.device_count() if config.mesh.data == -1
          else max(int(config.mesh.data), 1))
  if task.layout == 'encoder_decoder':
    return _translation_least_memory(config, task, data)
  batch = -(-config.train.batch_size // data)        # per device
  length = task.seq_len(config.task.max_len)
  out = {'train.batch_size': _training_activations(
      m, batch, length, task.num_classes, stacks=1)}
  if m.attention_impl == 'plain' and config.eval.lengths:
    longest = task.seq_len(max(config.eval.lengths))
    out['eval.lengths'] = {'attention weights at the longest length':
                           m.num_heads * longest * longest
                           * jnp.dtype(m.dtype).itemsize}
  return out


def _training_activations(m: ml_collections.ConfigDict, batch: int,
                          length: int, num_classes: int, stacks: int
                          ) -> dict[str, int]:
  """_least_memory's parts for one training step of `batch` sequences of
  `length` per device, through `stacks` stacks of m.num_layers layers."""
  itemsize = jnp.dtype(m.dtype).itemsize
  train = {'layer inputs': stacks * m.num_layers * batch * length
           * m.num_hiddens * itemsize,
           'logits': batch * length * num_classes * itemsize}
  if m.attention_impl == 'plain':
    train['attention weights'] = (batch * m.num_heads * length * length
                                  * itemsize)
    if m.remat:
      del train[min(('logits', 'attention weights'), key=train.get)]
  return train


def _translation_least_memory(config: ml_collections.ConfigDict,
                              task: tasks.Task, data: int
                              ) -> dict[str, dict[str, int]]:
  """_least_memory for translation: the bucket whose batch needs most."""
  from selfattn.tasks.translation import batches
  from selfattn.tasks.translation import data as translation_data
  from selfattn.tasks.translation import task as translation_task
  # The corpus _check_translation prepared (cached in this process).
  corpus = translation_data.prepare(
      task.vocab_size, config.task.max_len,
      *translation_task.LANGUAGES[task.name])
  bounds = tuple(b.bound for b in corpus.buckets)
  budget = batches.token_budget(config.train.batch_tokens,
                                config.train.batch_size, bounds[-1])
  steps = [_training_activations(config.model, size // data, bound,
                                 task.num_classes, stacks=2)
           for size, bound in zip(batches.batch_sizes(bounds, budget, data),
                                  bounds)]
  field = ('train.batch_tokens' if config.train.batch_tokens
           else 'train.batch_size')
  return {field: max(steps, key=lambda parts: sum(parts.values()))}


def _memory_bytes() -> int | None:
  """Memory of the first device: an accelerator's limit, or the host's
  physical memory for the CPU; None where unknown."""
  device = jax.devices()[0]
  try:
    stats = device.memory_stats() or {}
  except Exception:  # noqa: BLE001 - not every backend reports
    stats = {}
  if stats.get('bytes_limit'):
    return int(stats['bytes_limit'])
  if device.platform == 'cpu':
    try:
      return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
    except (ValueError, OSError, AttributeError):
      return None
  return None


def _check_devices(config: ml_collections.ConfigDict, num_devices: int
                   ) -> None:
  """The batch and the evaluation examples split evenly over the
  data-parallel devices."""
  data = _data_parallel(config, num_devices)
  for field in ('train.batch_size', 'eval.num_examples'):
    section, name = field.split('.')
    if config[section][name] % data:
      raise ConfigError(f'config.{field}={config[section][name]} is not '
                        f'divisible by the {data} data-parallel devices '
                        f'(config.mesh.data)')
