"""Exercise 1: what goes wrong when self-attention layers with positional
encoding are stacked deep.

  python -m experiments.exercise1_depth --workdir=runs/exercise1 [--seeds=5] [--quick]

1. Rank collapse at initialisation (Dong, Cordonnier & Loukas 2021): the
   relative distance of each layer's tokens from rank one, ||X - 1 mean(X)^T||
   / ||X||, through 48 layers of pure attention, attention + skip,
   attention + FFN, and the full block (with and without post-LN).
2. Trainability (Xiong et al. 2020): post-LN, pre-LN and no LN at depths 2, 6,
   12, 24, with and without warmup, on `precedes`: final accuracy, divergence,
   and the gradient norm per layer at step 0; then post-LN at depths 12 and 24
   over 2000 steps with 0, 100, 400 and 1000 warmup steps.
3. Position information with depth: a linear probe predicting the absolute
   position from each layer's representations, at initialisation and after
   training, for sinusoidal, learned and Shaw relative encodings.
"""

import copy
import os
import statistics

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax
import scipy.stats
from absl import app
from flax import nnx

import selfattn
from experiments import common
from experiments import skeleton
from experiments import study
from selfattn import tasks as tasks_lib
from selfattn.errors import DataError
from selfattn.training.steps import Trainer
from selfattn.training.steps import metric_sums
from selfattn.training.cli_checks import parse_flags

# --------------------------------------------------------------------------
# 1. Rank collapse.
# --------------------------------------------------------------------------

VARIANTS = ('attention only', 'attention + skip', 'attention + FFN',
            'attention + skip + FFN', 'full block, post-LN')


def residual_ratio(X: jax.Array) -> float:
  """||X - 1 mean(X)^T|| / ||X|| per sequence, averaged. X: (B, L, d)."""
  res = X - X.mean(axis=1, keepdims=True)
  return float(jnp.mean(jnp.linalg.norm(res, axis=(1, 2))
                        / jnp.linalg.norm(X, axis=(1, 2))))


def make_layer(variant: str, width: int, heads: int, rngs: nnx.Rngs):
  if variant in ('attention only', 'attention + skip'):
    attn = selfattn.MultiHeadAttention(width, heads, rngs=rngs)
    if variant == 'attention only':
      return lambda X: attn(X, X, X)
    return lambda X: X + attn(X, X, X)
  norm = 'post' if variant == 'full block, post-LN' else 'none'
  return selfattn.TransformerEncoderBlock(
      width, 2 * width, heads, 0.0, norm=norm,
      residual=variant != 'attention + FFN', rngs=rngs)


def rank_collapse(depth: int, seeds: int, width=64, heads=4, length=32):
  """{variant: per seed, [ratio at input, after layer 1, ..., after layer depth]}."""
  out = {}
  for variant in VARIANTS:
    curves = []
    for seed in range(seeds):
      rngs = nnx.Rngs(seed)
      embed = jax.random.normal(jax.random.key(seed), (8, length, width))
      X = embed + selfattn.sinusoidal_table(length, width)[None]
      ratios = [residual_ratio(X)]
      for _ in range(depth):
        X = make_layer(variant, width, heads, rngs)(X)
        ratios.append(residual_ratio(X))
      curves.append(ratios)
    out[variant] = curves
  return out


def spread(values: list[float]) -> str:
  """'mean (min-max)' in two significant digits: the per-seed spread of
  quantities that span orders of magnitude."""
  return f'{statistics.mean(values):.2g} ({min(values):.1g}-{max(values):.1g})'


def plot_rank_collapse(curves, path):
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for variant, per_seed in curves.items():
    values = np.maximum(np.asarray(per_seed), 1e-12)
    line, = ax.plot(range(values.shape[1]), values.mean(0), label=variant)
    if len(values) > 1:
      ax.fill_between(range(values.shape[1]), values.min(0), values.max(0),
                      color=line.get_color(), alpha=0.15, lw=0)
  ax.set_yscale('log')
  ax.set_xlabel('layer (line: mean over seeds; band: min-max)')
  ax.set_ylabel('||X - 1 mean(X)|| / ||X||')
  ax.set_title('Distance from rank one at initialisation (sinusoidal input)')
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


# --------------------------------------------------------------------------
# 2. Trainability.
# --------------------------------------------------------------------------

def depth_config(norm: str, depth: int, warmup: int, steps: int,
                 learning_rate: float | None = None):
  """The trainability model on `precedes`; learning_rate replaces the base
  config's peak rate (3e-3) where given."""
  config = common.base_config(name='precedes', vocab_size=4, min_len=4, max_len=16)
  config.model.norm, config.model.num_layers = norm, depth
  config.model.num_hiddens, config.model.ffn_num_hiddens = 32, 64
  config.train.num_steps, config.train.batch_size = steps, 32
  config.train.warmup_steps = warmup
  if learning_rate is not None:
    config.train.learning_rate = learning_rate
  config.train.log_every = config.train.checkpoint_every = config.eval.every = steps
  config.eval.lengths, config.eval.num_examples = [16], 256
  return config


def layer_grad_norms(config, seeds: int) -> list[list[float]]:
  """Gradient norm of each block's parameters at initialisation (step 0),
  per seed: [seed][layer]. The seed sets both the initial parameters and the
  first batch; one compiled gradient serves every seed."""
  trainers = []
  for seed in range(seeds):
    seeded = config.copy_and_resolve_references()
    seeded.seed = seed
    trainers.append(Trainer(seeded))
  model_of = trainers[0].model    # the same architecture for every seed

  @jax.jit
  def block_norms(params, batch):
    def loss(params):
      sums = metric_sums(model_of(params)(batch.inputs, batch.valid_lens), batch)
      return sums['nll'] / jnp.maximum(sums['weight'], 1.0)
    blocks = jax.grad(loss)(params)['encoder']['blks']
    return jnp.stack([optax.global_norm(blocks[i])
                      for i in range(config.model.num_layers)])

  return [[float(x) for x in block_norms(t.init_state()['params'],
                                          t.train_batch(0))]
          for t in trainers]


def trainability_settings(norms, depths, warmups, steps, sweep):
  """(name, config) of every trainability cell: norms x depths x warmups at
  `steps`, then the warmup sweep's (norm, depth, warmup) cells at its own
  step count (`sweep` = (cells, steps))."""
  out = [(f'trainability/norm={n},depth={d},warmup={w}', depth_config(n, d, w, steps))
         for n in norms for d in depths for w in warmups]
  cells, sweep_steps = sweep
  out += [(f'warmup_sweep/norm={n},depth={d},warmup={w},steps={sweep_steps}',
           depth_config(n, d, w, sweep_steps)) for n, d, w in cells]
  return out


def training_plan(quick: bool):
  """(norms, depths, warmups, steps, sweep) of the trainability study
  (trainability_settings' arguments); quick: one depth, two norms."""
  if quick:
    return ('post', 'pre'), (4,), (0,), 150, ([('post', 4, 50)], 150)
  # Was it the short schedule that kept post-LN at chance? Longer runs with
  # warmups up to half of them, at the depths where it failed.
  sweep = ([('post', d, w) for d in (12, 24) for w in (0, 100, 400, 1000)], 2000)
  return ('post', 'pre', 'none'), (2, 6, 12, 24), (0, 100), 400, sweep


def trainability(workdir, seeds, settings):
  """Trains every setting for `seeds` seeds (resumably, through the study
  runner); a diverged run counts as chance (0.5) and is counted.
  Returns ({setting: row}, {setting: data})."""
  results = common.sweep(settings, workdir, seeds)
  rows, data = {}, {}
  for name, summaries in results.items():
    accs = [0.5 if study.diverged(s) else common.accuracy(s, 16)
            for s in summaries]
    diverged = sum(study.diverged(s) for s in summaries)
    failed = sum(a < 0.6 for a in accs)
    rows[name] = [common.mean_std(accs), ' '.join(f'{a:.2f}' for a in accs),
                  f'{diverged}/{seeds}', f'{failed}/{seeds}']
    data[name] = {'accuracy': accs, 'diverged': diverged}
  return rows, data


def grad_norms_at_init(norms, depths, seeds
                       ) -> dict[tuple[str, int], list[list[float]]]:
  """{(norm, depth): per-layer gradient norms at step 0, [seed][layer]}."""
  return {(n, d): layer_grad_norms(depth_config(n, d, 0, 1), seeds)
          for n in norms for d in depths}


def _first_last(per_seed: list[list[float]]) -> str:
  """Geometric mean over seeds of the first and the last block's norm (they
  span orders of magnitude), with the range over seeds."""
  def one(values):
    centre = float(scipy.stats.gmean(values))
    return (f'{centre:.3g}' if len(values) == 1 else
            f'{centre:.3g} ({min(values):.2g}-{max(values):.2g})')
  return (f'{one([g[0] for g in per_seed])} / '
          f'{one([g[-1] for g in per_seed])}')


def trainability_table(settings, rows, grad_norms) -> str:
  header = ['norm', 'depth', 'warmup steps', 'accuracy (len 16)', 'per seed',
            'diverged (NaN)', 'stuck near chance (< 0.6)',
            'grad norm at init, layer 1 / last']
  body = []
  for name, config in settings:
    if not name.startswith('trainability/'):
      continue
    norm, depth = config.model.norm, config.model.num_layers
    body.append([norm, depth, config.train.warmup_steps] + rows[name]
                + [_first_last(grad_norms[(norm, depth)])])
  return common.markdown_table(header, body)


def warmup_sweep_table(settings, rows) -> str:
  header = ['norm', 'depth', 'warmup steps', 'steps', 'accuracy (len 16)',
            'per seed', 'diverged (NaN)', 'stuck near chance (< 0.6)']
  body = [[c.model.norm, c.model.num_layers, c.train.warmup_steps,
           c.train.num_steps] + rows[name]
          for name, c in settings if name.startswith('warmup_sweep/')]
  return common.markdown_table(header, body)


def plot_grad_norms(grad_curves, depth, path):
  fig, ax = plt.subplots(figsize=(6, 4))
  for i, ((norm, d), per_seed) in enumerate(grad_curves.items()):
    if d == depth:
      values = np.asarray(per_seed)           # (seeds, layers)
      layers = range(1, d + 1)
      color = plt.get_cmap('tab10').colors[i % 10]
      ax.plot(layers, scipy.stats.gmean(values, axis=0), marker='.', color=color,
              label=(f'{norm}-LN' if norm != 'none' else 'no LN')
              + f' (n={len(values)})')
      ax.fill_between(layers, values.min(0), values.max(0), color=color,
                      alpha=0.15, lw=0)
  ax.set_yscale('log')
  ax.set_xlabel('layer')
  ax.set_ylabel('gradient norm at step 0')
  ax.set_title(f'Per-layer gradient norm at initialisation, depth {depth}\n'
               '(line: geometric mean; band: min-max over seeds)', fontsize=10)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


# --------------------------------------------------------------------------
# 3. Position probe.
# --------------------------------------------------------------------------

def probe_accuracy(hidden: np.ndarray, train_fraction=0.75, ridge=1e-2) -> float:
  """Ridge regression from a token's representation to its one-hot position,
  fitted on some sequences, scored (argmax) on the others. hidden: (B, L, d)."""
  b, length, d = hidden.shape
  split = int(b * train_fraction)
  X = np.concatenate([hidden, np.ones((b, length, 1))], -1)
  Y = np.broadcast_to(np.eye(length), (b, length, length))
  Xtr, Ytr = X[:split].reshape(-1, d + 1), Y[:split].reshape(-1, length)
  W = np.linalg.solve(Xtr.T @ Xtr + ridge * np.eye(d + 1), Xtr.T @ Ytr)
  pred = np.argmax(X[split:].reshape(-1, d + 1) @ W, axis=-1)
  return float(np.mean(pred == np.tile(np.arange(length), b - split)))


def layer_probes(model, task, length, seed) -> list[float]:
  batch = tasks_lib.make_eval_batch(task, seed, length, jnp.arange(256))
  _, hidden = model.encoder(batch.inputs, batch.valid_lens, return_hidden=True)
  return [probe_accuracy(np.asarray(h, np.float64)) for h in hidden]


def position_probe(workdir, encodings, steps, layers, seeds):
  """Probe accuracy per layer at initialisation and after training `reverse`,
  for every encoding and seed. Returns (table, {encoding: per-seed data})."""
  settings = []
  for position in encodings:
    config = common.base_config(name='reverse')
    config.model.position, config.model.num_layers = position, layers
    config.model.max_len = 64
    config.train.num_steps = steps
    config.train.checkpoint_every = config.eval.every = steps
    config.eval.lengths = [16]   # the probe's length; the task score is read there
    settings.append((f'probe/position={position}', config))
  results = common.sweep(settings, workdir, seeds)
  data = {}
  for (name, config), summaries in zip(settings, results.values()):
    per_seed = []
    for seed, summary in enumerate(summaries):
      config = copy.deepcopy(config)
      config.seed = seed
      init = Trainer(config)
      before = layer_probes(init.model(init.init_state()['params']), init.task,
                            16, seed)
      path = os.path.join(workdir, f'{name},seed={seed}')
      try:
        trained = common.trained_model(config, path)
      except FileNotFoundError as e:
        # A clean clone has the summaries, not the checkpoints (never
        # committed): one line saying so, not a traceback.
        raise DataError(
            f'{e}: the position probe reads the trained parameters of each '
            f'of its runs, and checkpoints are not committed; rerun where '
            f'they were trained, or delete '
            f'{os.path.join(workdir, "probe", "*", "summary.json")} to '
            f'retrain them') from None
      after = layer_probes(trained, init.task, 16, seed)
      per_seed.append({'init': before, 'trained': after,
                       'task_accuracy': common.accuracy(summary, 16)})
    data[config.model.position] = per_seed
  header = ['encoding', 'reverse acc'] + [
      f'{"emb" if i == 0 else f"layer {i}"} init / trained' for i in range(layers + 1)]
  rows = []
  for position, per_seed in data.items():
    row = [position, common.mean_std([r['task_accuracy'] for r in per_seed])]
    for i in range(layers + 1):
      before = [r['init'][i] for r in per_seed]
      after = [r['trained'][i] for r in per_seed]
      row.append(f'{statistics.mean(before):.2f} / {_mean_std2(after)}')
    rows.append(row)
  return common.markdown_table(header, rows), data


def _mean_std2(values: list[float]) -> str:
  if len(values) == 1:
    return f'{values[0]:.2f}'
  return f'{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}'


def plot_probe(data, path):
  fig, ax = plt.subplots(figsize=(6, 4))
  for position, per_seed in data.items():
    before = np.asarray([r['init'] for r in per_seed])
    after = np.asarray([r['trained'] for r in per_seed])
    layers = range(after.shape[1])
    line, = ax.plot(layers, after.mean(0), marker='o', label=f'{position}, trained')
    if len(after) > 1:
      ax.fill_between(layers, after.min(0), after.max(0), color=line.get_color(),
                      alpha=0.15, lw=0)
    ax.plot(layers, before.mean(0), ls='--', color=line.get_color(),
            label=f'{position}, init')
  ax.axhline(1 / 16, color='gray', ls=':', lw=1, label='chance (1/16)')
  ax.set_xlabel('layer (0 = embeddings + absolute encoding); band: min-max over seeds')
  ax.set_ylabel('linear probe accuracy of absolute position')
  ax.set_ylim(0, 1.02)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


# --------------------------------------------------------------------------

# The report's title, the owner's mark on its workdir (skeleton.main_of).
TITLE = 'Exercise 1: stacking self-attention layers deep'


def exercise1(workdir: str, seeds: int, quick: bool) -> str:
  os.makedirs(workdir, exist_ok=True)
  seeds = 1 if quick else seeds
  depth = 12 if quick else 48
  curves = rank_collapse(depth, seeds)
  plot_rank_collapse(curves, os.path.join(workdir, 'rank_collapse.png'))
  shown = [1, 2, 4, 8, 12] + ([24, 48] if not quick else [])
  collapse = common.markdown_table(
      ['variant'] + [f'after {n}' for n in shown],
      [[v] + [spread([c[n] for c in per_seed]) for n in shown]
       for v, per_seed in curves.items()])

  norms, depths, warmups, steps, sweep = training_plan(quick)
  settings = trainability_settings(norms, depths, warmups, steps, sweep)
  rows, train_data = trainability(workdir, seeds, settings)
  grad_curves = grad_norms_at_init(norms, depths, seeds)
  plot_grad_norms(grad_curves, depths[-1], os.path.join(workdir, 'grad_norms.png'))

  encodings = ('sinusoidal', 'shaw') if quick else ('sinusoidal', 'learned', 'shaw')
  probe_table, probe_data = position_probe(
      workdir, encodings, 100 if quick else 1000, 2 if quick else 4, seeds)
  plot_probe(probe_data, os.path.join(workdir, 'position_probe.png'))

  cells, sweep_steps = sweep
  text = common.write_results(
      workdir, TITLE,
      [('Rank collapse at initialisation',
        f'Width 64, 4 heads, 32 tokens (random embeddings + sinusoidal table), '
        f'{seeds} seed(s): mean (min-max over seeds) of the relative distance '
        f'from rank one after n layers:\n\n{collapse}\n\n'
        f'![rank collapse](rank_collapse.png)'),
       ('Trainability: layer norm placement and warmup',
        f'Task `precedes` (chance 0.5), width 32, lengths 4-16, {steps} steps '
        f'at peak learning rate 3e-3 (AdamW, cosine); accuracy at length 16, '
        f'mean ± std over {seeds} seed(s) (a diverged run counts as 0.5). '
        f'Gradient norms at step 0: geometric mean (range) over the same '
        f'{seeds} seed(s).\n\n'
        f'{trainability_table(settings, rows, grad_curves)}\n\n'
        f'![gradient norms](grad_norms.png)'),
       ('Warmup sweep',
        f'The same task and model, {sweep_steps} steps, warmup over the first '
        f'0-{max(w for _, _, w in cells)} of them, {seeds} seed(s).\n\n'
        f'{warmup_sweep_table(settings, rows)}'),
       ('Position information by layer',
        'Linear (ridge) probe of the absolute position (16 classes) from each '
        'layer\'s token representations of `reverse` inputs of length 16, '
        f'fitted on 192 sequences and scored on 64; init: mean over {seeds} '
        'seed(s), trained: mean ± std.\n\n'
        f'{probe_table}\n\n![position probe](position_probe.png)')],
      data={'rank_collapse': curves, 'trainability': train_data,
            'grad_norms_step0': {f'{n},{d}': g for (n, d), g in grad_curves.items()},
            'probe': probe_data})
  print(text)
  return text


if __name__ == '__main__':
  app.run(skeleton.main_of(exercise1, TITLE), flags_parser=parse_flags)
