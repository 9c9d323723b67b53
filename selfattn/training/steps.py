"""The compiled pieces of training: model and optimiser state, the jitted
train step, batch generation and evaluation, for one config on one mesh.

`Trainer` is what train.py's loop drives and what benchmarks and experiments
call directly: the step is one pure jax.jit function over the model's split
state (nnx.split once; nnx.merge only inside traced code), so a step costs no
Python graph traversal.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from selfattn.nn import bounded
from selfattn import tasks as tasks_lib
from selfattn.training.free_running import cached_free_running_logits
from selfattn.training.free_running import free_running_logits
from selfattn.nn.models import SequenceModel
from selfattn.training.build import build_model
from selfattn.training.build import task_from_config


# --------------------------------------------------------------------------
# Loss and metrics.
# --------------------------------------------------------------------------

def metric_sums(logits: jax.Array, batch: tasks_lib.Batch) -> dict[str, jax.Array]:
  """Sums over a batch, so chunks and devices can be added up exactly."""
  logp = jax.nn.log_softmax(logits)
  nll = -jnp.take_along_axis(logp, batch.targets[..., None], axis=-1)[..., 0]
  w = batch.weights
  correct = (jnp.argmax(logits, -1) == batch.targets)
  counted = jnp.sum(w, axis=1) > 0
  whole = jnp.all(correct | (w == 0), axis=1) & counted
  return {'nll': jnp.sum(nll * w), 'weight': jnp.sum(w),
          'correct': jnp.sum(correct * w), 'seq_correct': jnp.sum(whole),
          'seq_count': jnp.sum(counted)}


def metrics_from_sums(s: dict[str, Any]) -> dict[str, float]:
  """token_accuracy: correct over counted positions, pooled over examples.
  This is the reference suite's accuracy (it pools per sub-batch of 64 and
  averages the sub-batches, which differs only when examples count different
  numbers of positions: the masked binary and stack tasks). With free-running
  sums (the autoregressive layout's evaluation), also the accuracies of the
  model's own greedy outputs: free_running_token/sequence_accuracy."""
  weight, count = max(float(s['weight']), 1.0), max(float(s['seq_count']), 1.0)
  metrics = {'loss': float(s['nll']) / weight,
             'token_accuracy': float(s['correct']) / weight,
             'sequence_accuracy': float(s['seq_correct']) / count}
  if 'free_correct' in s:
    metrics['free_running_token_accuracy'] = float(s['free_correct']) / weight
    metrics['free_running_sequence_accuracy'] = (float(s['free_seq_correct'])
                                                 / count)
  return metrics


# --------------------------------------------------------------------------
# Optimiser.
# --------------------------------------------------------------------------

SCHEDULES = ('cosine', 'constant')


def learning_rate_schedule(train: ml_collections.ConfigDict) -> optax.Schedule:
  """Linear warmup, then cosine decay to final_lr_fraction of the peak (0
  by default) at num_steps ('cosine', the default) or the peak rate to the
  end ('constant', the reference suite's)."""
  warmup = min(train.warmup_steps, train.num_steps - 1)
  if train.schedule == 'constant':
    if not warmup:
      return optax.constant_schedule(train.learning_rate)
    return optax.linear_schedule(0.0, train.learning_rate, warmup)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0 if warmup else train.learning_rate,
      peak_value=train.learning_rate, warmup_steps=warmup,
      decay_steps=train.num_steps,
      end_value=train.learning_rate * train.final_lr_fraction)


def decay_mask(params, *, scan_layers: bool = False):
  """True for the parameters weight decay applies to: matrices and tables
  (more than one axis per layer), not biases or norm scales. With
  scan_layers, parameters under a stack's `blks` carry a leading layer axis
  that is not one of their own, so a stacked (layers, D) norm scale is still
  a vector: the mask is the loop stack's, layer by layer."""
  def decayed(path, p):
    stacked = scan_layers and any(getattr(k, 'key', None) == 'blks'
                                  for k in path)
    return p.ndim - stacked > 1
  return jax.tree_util.tree_map_with_path(decayed, params)


def make_optimizer(train: ml_collections.ConfigDict, *,
                   scan_layers: bool = False) -> optax.GradientTransformation:
  """Global-norm clipping, then AdamW (decay on matrices only, decay_mask)."""
  return optax.chain(
      optax.clip_by_global_norm(train.grad_clip),
      optax.adamw(learning_rate_schedule(train), b2=train.b2,
                  weight_decay=train.weight_decay,
                  mask=functools.partial(decay_mask, scan_layers=scan_layers)))


# --------------------------------------------------------------------------
# Mesh.
# --------------------------------------------------------------------------

def make_mesh(config: ml_collections.ConfigDict) -> jax.sharding.Mesh:
  """1-D mesh with axis `data` over config.mesh.data devices (-1 = all)."""
  return data_mesh(config.mesh.data if config.mesh.data != -1
                   else jax.device_count())


def data_mesh(devices: int) -> jax.sharding.Mesh:
  """1-D mesh with axis `data` over the first `devices` devices."""
  # Auto axes: XLA propagates the batch sharding through the model (GSPMD);
  # explicit axes would make every gather in the model name its sharding.
  return jax.make_mesh((devices,), ('data',), devices=jax.devices()[:devices],
                       axis_types=(jax.sharding.AxisType.Auto,))


def global_indices(start: int, count: int, sharding: NamedSharding) -> jax.Array:
  """Example indices start..start+count-1 as one global array, each process
  holding only its devices' slices (works with one process or many)."""
  values = np.arange(start, start + count, dtype=np.int32)
  return jax.make_array_from_callback((count,), sharding, lambda idx: values[idx])


def make_train_batches(config: ml_collections.ConfigDict, task: tasks_lib.Task,
                       mesh: jax.sharding.Mesh):
  """step -> Batch of config.train.batch_size examples sharded along `data`.

  Jitted: each device generates only its own examples, so each process
  generates only its shard of every batch. (Training itself generates the
  batch inside the step, Trainer.advance; this is for inspection and
  benchmarks.)
  """
  by_example = NamedSharding(mesh, P('data'))
  indices = global_indices(0, config.train.batch_size, by_example)
  generate = jax.jit(batch_generator(config, task), out_shardings=by_example)
  seed = np.int32(config.seed)
  return lambda step: generate(seed, np.int32(step), indices)


def max_random_len(config: ml_collections.ConfigDict) -> int | None:
  """The range of randomized positions, or None when positions are 0..T-1."""
  m = config.model
  return m.max_random_len if m.randomize_positions else None


def batch_generator(config: ml_collections.ConfigDict, task: tasks_lib.Task):
  """(seed, step, example indices) -> the training Batch of that step.

  The seed is an argument, not a constant of the compiled program, so the
  runs of a study that differ only by seed compile identical programs and
  share them through JAX's persistent compilation cache.
  """
  lo, hi = config.task.min_len, config.task.max_len
  per_batch = bool(config.task.per_batch_length)
  random_len = max_random_len(config)
  return lambda seed, step, indices: tasks_lib.make_batch(
      task, seed, step, indices, lo, hi, per_batch_length=per_batch,
      max_random_len=random_len)


def eval_padded_length(length: int) -> int:
  """The task length an evaluation at `length` is padded to: lengths share a
  compiled program in buckets (q = 2^floor(log2 n) / 4, at least 8), so
  evaluating every length from 41 to 500 compiles 15 programs, not 460.
  Right padding never changes the valid outputs (masked keys get weight 0)."""
  q = max(8, (1 << (max(length, 1).bit_length() - 1)) // 4)
  return -(-length // q) * q


# --------------------------------------------------------------------------
# The step: pure functions of (state, batch) and the model's static parts.
# --------------------------------------------------------------------------

def forward(graphdef: nnx.GraphDef, rest: nnx.State, params, batch: tasks_lib.Batch,
            *, dropout_key: jax.Array | None = None,
            step: jax.Array | None = None) -> jax.Array:
  """Logits (B, T, num_classes) of the model with these parameters.

  dropout_key None: deterministic (evaluation). Otherwise dropout is on, with
  masks drawn from fold_in(dropout_key, step): a function of the step alone,
  so a resumed run redraws exactly the masks it drew the first time.
  """
  model = nnx.merge(graphdef, params, rest, copy=True)
  if dropout_key is not None:
    # match_shape: scanned layers (model.scan_layers) hold one dropout key
    # per layer, which it splits from the step's key; a model's scalar keys
    # take that key as it is, as they always did.
    nnx.reseed(model, policy='match_shape',
               dropout=jax.random.fold_in(dropout_key, step))
  # A translation batch also holds the decoder's inputs (tasks.Batch).
  extra = ({} if batch.decoder_inputs is None
           else {'decoder_inputs': batch.decoder_inputs})
  return model(batch.inputs, batch.valid_lens, positions=batch.positions,
               deterministic=dropout_key is None, **extra)


def smoothed_nll_sum(logits: jax.Array, batch: tasks_lib.Batch,
                     smoothing: float) -> jax.Array:
  """The summed cross-entropy against targets smoothed uniformly over the
  classes: (1 - smoothing) on the target plus smoothing / V on each class
  (Szegedy et al. 2016), weighted by batch.weights."""
  labels = optax.smooth_labels(
      jax.nn.one_hot(batch.targets, logits.shape[-1]), smoothing)
  return jnp.sum(optax.softmax_cross_entropy(logits, labels) * batch.weights)


def loss_and_sums(params, batch: tasks_lib.Batch, *, graphdef: nnx.GraphDef,
                  rest: nnx.State, dropout_key: jax.Array | None,
                  step: jax.Array | None, label_smoothing: float = 0.0
                  ) -> tuple[jax.Array, dict]:
  """Mean cross-entropy over the counted positions (against smoothed
  labels with label_smoothing > 0), and the metric sums (whose `nll` is
  always the plain cross-entropy)."""
  logits = forward(graphdef, rest, params, batch, dropout_key=dropout_key,
                   step=step)
  sums = metric_sums(logits, batch)
  nll = (smoothed_nll_sum(logits, batch, label_smoothing) if label_smoothing
         else sums['nll'])
  return nll / jnp.maximum(sums['weight'], 1.0), sums


def train_step(state: dict[str, Any], batch: tasks_lib.Batch, *,
               graphdef: nnx.GraphDef, rest: nnx.State,
               tx: optax.GradientTransformation, schedule: optax.Schedule,
               dropout_key: jax.Array, label_smoothing: float = 0.0
               ) -> tuple[dict[str, Any], dict]:
  """One optimiser step: {'step', 'params', 'opt_state'} -> the next state
  and this step's metrics (loss, accuracies, grad_norm, learning_rate).
  The loss reported is the one minimised (smoothed, with
  label_smoothing)."""
  (loss, sums), grads = jax.value_and_grad(loss_and_sums, has_aux=True)(
      state['params'], batch, graphdef=graphdef, rest=rest,
      dropout_key=dropout_key, step=state['step'],
      label_smoothing=label_smoothing)
  updates, opt_state = tx.update(grads, state['opt_state'], state['params'])
  new_state = {'step': state['step'] + 1,
               # Bounded parameters (PoPE's phase bias) go back into range.
               'params': bounded.project_bounded_params(
                   optax.apply_updates(state['params'], updates)),
               'opt_state': opt_state}
  metrics = {'loss': loss,
             'token_accuracy': sums['correct'] / jnp.maximum(sums['weight'], 1),
             'sequence_accuracy': (sums['seq_correct']
                                   / jnp.maximum(sums['seq_count'], 1)),
             'grad_norm': optax.tree.norm(grads),
             'learning_rate': schedule(state['step'])}
  return new_state, metrics


def state_is_healthy(state: dict[str, Any], batch: tasks_lib.Batch,
                     parts: dict[str, Any]) -> jax.Array:
  """() bool: finite parameters whose loss on `batch` is finite too (a huge
  but finite update, lr 1e9, passes the first test, not this)."""
  loss, _ = loss_and_sums(state['params'], batch, dropout_key=None,
                          step=None, **parts)
  leaves = [jnp.all(jnp.isfinite(p)) for p in jax.tree.leaves(state['params'])]
  return jnp.all(jnp.stack(leaves)) & jnp.isfinite(loss)


def dropout_key_for(seed: int) -> jax.Array:
  """The root of every dropout mask of a run (independent of the data and
  parameter streams)."""
  return jax.random.fold_in(jax.random.key(seed), 0xD0)


# --------------------------------------------------------------------------
# Trainer.
# --------------------------------------------------------------------------

class Trainer:
  """Everything compiled for one config on one mesh.

  Attributes: task, mesh, graphdef/rest (the model minus its parameters),
  advance(state) -> (state, metrics): one training step that generates its
    own batch from state['step'] (one dispatch per step, what the loop runs);
  train_step(state, batch) -> (state, metrics): the same step on a given batch
    (steps.train_step, jitted);
  train_batch(step) -> Batch: the batch advance would generate at `step`;
  evaluate(params) -> {length: metrics};
  extra_summaries() -> [(kind, tag, value)]: what the latest evaluation
    adds to TensorBoard beyond its metrics (kind: scalar, text or image);
  healthy(state) -> bool: whether the state is fit to checkpoint.
  """

  def __init__(self, config: ml_collections.ConfigDict,
               mesh: jax.sharding.Mesh | None = None,
               task: tasks_lib.Task | None = None):
    self._setup(config, mesh, task)
    task, mesh, replicated = self.task, self.mesh, self.replicated
    seed, seed_arg, parts = config.seed, self.seed_arg, self.parts
    step_with_key = self.step_with_key
    self.train_batch = make_train_batches(config, task, mesh)
    step = functools.partial(step_with_key, dropout_key=dropout_key_for(seed))

    random_len = max_random_len(config)

    # The length is traced and only the padded size is static, so every
    # length of a padding bucket shares one compiled program.
    @functools.partial(jax.jit, static_argnums=1, out_shardings=replicated)
    def eval_chunk_for_seed(length, padded, params, indices, seed):
      batch = tasks_lib.make_eval_batch(task, seed, length, indices,
                                        padded_length=padded,
                                        max_random_len=random_len)
      logits_of = lambda b: forward(params=params, batch=b, **parts)
      logits = logits_of(batch)
      sums = metric_sums(logits, batch)
      if task.layout == 'autoregressive':      # also free-running
        first = task.first_output_token
        if config.eval.free_running == 'cache':
          free_logits = cached_free_running_logits(
              self.model(params), batch, first_output_token=first)
        else:
          free_logits = free_running_logits(
              logits_of, batch, first_output_token=first,
              max_rounds=task.spec.output_length(padded) - 1,
              teacher_forced_logits=logits)
        free = metric_sums(free_logits, batch)
        sums['free_correct'] = free['correct']
        sums['free_seq_correct'] = free['seq_correct']
      return sums

    generate = batch_generator(config, task)
    by_example = self.by_example

    def advance(state, indices, seed):
      batch = generate(seed, state['step'], indices)
      batch = jax.lax.with_sharding_constraint(batch, by_example)
      return step_with_key(state, batch, dropout_key=dropout_key_for(seed))

    compiled = functools.partial(jax.jit, donate_argnums=0,
                                 out_shardings=(replicated, replicated))
    self.train_step = compiled(step)
    train_indices = global_indices(0, config.train.batch_size, by_example)
    advance = compiled(advance)
    self.advance = lambda state: advance(state, train_indices, seed_arg)
    self._eval_chunk = lambda length, padded, params, indices: (
        eval_chunk_for_seed(length, padded, params, indices, seed_arg))

    # Indices are an argument, not a closure: in a multi-process run they span
    # other processes' devices.
    @functools.partial(jax.jit, out_shardings=replicated)
    def healthy(state, indices, seed):
      # Checked on the next step's batch.
      batch = jax.lax.with_sharding_constraint(
          generate(seed, state['step'], indices), by_example)
      return state_is_healthy(state, batch, parts)

    self.healthy = lambda state: bool(healthy(state, train_indices, seed_arg))

  def _setup(self, config: ml_collections.ConfigDict,
             mesh: jax.sharding.Mesh | None,
             task: tasks_lib.Task | None = None) -> None:
    """What every trainer shares: the task (validate_config's, or built
    here), the mesh and shardings, the model split into
    graphdef/params/rest, the optimiser, the step with its dropout key
    still open (step_with_key), and the seed as a replicated argument."""
    self.config = config
    self.task = task = task_from_config(config) if task is None else task
    self.mesh = mesh = make_mesh(config) if mesh is None else mesh
    self.replicated = replicated = NamedSharding(mesh, P())
    self.by_example = NamedSharding(mesh, P('data'))
    seed = config.seed
    model = build_model(config, task, nnx.Rngs(params=seed, dropout=seed + 1))
    self.graphdef, self._params, self.rest = nnx.split(model, nnx.Param, ...)
    self.tx = tx = make_optimizer(config.train,
                                  scan_layers=config.model.scan_layers)
    self.parts = parts = dict(graphdef=self.graphdef, rest=self.rest)
    self.step_with_key = functools.partial(
        train_step, tx=tx, schedule=learning_rate_schedule(config.train),
        label_smoothing=float(config.train.label_smoothing), **parts)
    # The seed enters the compiled programs as an argument (see
    # batch_generator): one compilation serves every seed of a study.
    self.seed_arg = jax.make_array_from_callback(
        (), replicated, lambda _: np.asarray(seed, np.int32))

  def model(self, params) -> SequenceModel:
    """A model with these parameters (works inside traced code)."""
    return nnx.merge(self.graphdef, params, self.rest, copy=True)

  def params_layout(self) -> Any:
    """The parameters as ShapeDtypeStructs, replicated over the mesh: what
    checkpoints.read_params restores a run's parameters into, without
    building an optimiser state."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                       sharding=self.replicated), self._params)

  def init_state(self) -> dict[str, Any]:
    """Step 0: {'step', 'params', 'opt_state'}, replicated over the mesh."""
    state = {'step': jnp.zeros((), jnp.int32), 'params': self._params,
             'opt_state': self.tx.init(self._params)}
    return jax.device_put(state, self.replicated)

  def eval_chunk_size(self, padded: int) -> int:
    """Examples per evaluation chunk at padded task length `padded`: at most
    about as many tokens as a training batch (so long lengths do not spike
    memory), a multiple of the data-parallel devices, and where possible a
    divisor of eval.num_examples."""
    config, task = self.config, self.task
    budget = config.train.batch_size * task.seq_len(config.task.max_len)
    devices = self.mesh.size
    chunk = max(devices, budget // task.seq_len(padded) // devices * devices)
    chunk = min(chunk, config.eval.num_examples)
    # A chunk that divides the examples: no ragged last chunk, so one
    # compiled program per padded length (compilation dominates evaluation).
    while config.eval.num_examples % chunk and chunk > devices:
      chunk -= devices
    return chunk

  def eval_padding(self, length: int) -> int:
    """The task length an evaluation at `length` runs at: eval_padded_length,
    but no longer than the model's positions reach (a learned table's
    max_len rows, or the randomized range max_random_len), which
    validate_config checks `length` itself against: padding past them
    would ask for rows the table does not have."""
    padded = eval_padded_length(length)
    m = self.config.model
    reach = (m.max_random_len if m.randomize_positions
             else m.max_len if m.position == 'learned' else None)
    while reach is not None and padded > length and (
        self.task.seq_len(padded) > reach):
      padded -= 1
    return padded

  def extra_summaries(self) -> list[tuple[str, str, Any]]:
    """(kind, tag, value) the latest evaluation adds beyond its metrics:
    none for the sequence tasks."""
    return []

  def evaluate(self, params, lengths=None) -> dict[int, dict[str, float]]:
    """Metrics at every length of config.eval.lengths (or `lengths`)."""
    config = self.config
    results = {}
    for length in (config.eval.lengths if lengths is None else lengths):
      padded = self.eval_padding(length)
      chunk = self.eval_chunk_size(padded)
      total = None
      for start in range(0, config.eval.num_examples, chunk):
        count = min(chunk, config.eval.num_examples - start)
        indices = global_indices(start, count, self.by_example)
        sums = jax.device_get(self._eval_chunk(np.int32(length), padded,
                                               params, indices))
        total = sums if total is None else jax.tree.map(np.add, total, sums)
      results[length] = metrics_from_sums(total)
    return results
