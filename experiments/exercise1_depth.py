"""Exercise 1: what goes wrong when self-attention layers with positional
encoding are stacked deep.

  python -m experiments.exercise1_depth --workdir=runs/exercise1 [--seeds=2] [--quick]

1. Rank collapse at initialisation (Dong, Cordonnier & Loukas 2021): the
   relative distance of each layer's tokens from rank one, ||X - 1 mean(X)^T||
   / ||X||, through 48 layers of pure attention, attention + skip,
   attention + FFN, and the full block (with and without post-LN).
2. Trainability (Xiong et al. 2020): post-LN, pre-LN and no LN at depths 2, 6,
   12, 24, with and without warmup, on `precedes`: final accuracy, divergence,
   and the gradient norm per layer at step 0.
3. Position information with depth: a linear probe predicting the absolute
   position from each layer's representations, at initialisation and after
   training, for sinusoidal, learned and Shaw relative encodings.
"""

import os
import statistics

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from absl import app
from absl import flags
from flax import nnx

import selfattn
from experiments import common
from selfattn import tasks as tasks_lib
from selfattn.steps import Trainer
from selfattn.steps import metric_sums
from selfattn.train import NonFiniteError

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
  """{variant: [ratio at input, after layer 1, ..., after layer depth]}."""
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
    out[variant] = [statistics.mean(c[i] for c in curves) for i in range(depth + 1)]
  return out


def plot_rank_collapse(curves, path):
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for variant, ratios in curves.items():
    ax.plot(range(len(ratios)), np.maximum(ratios, 1e-12), label=variant)
  ax.set_yscale('log')
  ax.set_xlabel('layer')
  ax.set_ylabel('||X - 1 mean(X)|| / ||X||')
  ax.set_title('Distance from rank one at initialisation (sinusoidal input)')
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


# --------------------------------------------------------------------------
# 2. Trainability.
# --------------------------------------------------------------------------

def depth_config(norm: str, depth: int, warmup: int, steps: int):
  config = common.base_config(name='precedes', vocab_size=4, min_len=4, max_len=16)
  config.model.norm, config.model.num_layers = norm, depth
  config.model.num_hiddens, config.model.ffn_num_hiddens = 32, 64
  config.train.num_steps, config.train.batch_size = steps, 32
  config.train.warmup_steps = warmup
  config.train.log_every = config.train.checkpoint_every = config.eval.every = steps
  config.eval.lengths, config.eval.num_examples = [16], 256
  return config


def layer_grad_norms(config) -> list[float]:
  """Gradient norm of each block's parameters at initialisation (step 0)."""
  trainer = Trainer(config)
  params = trainer.init_state()['params']
  batch = trainer.train_batch(0)

  @jax.jit
  def grads(params):
    def loss(params):
      model = trainer.model(params)
      sums = metric_sums(model(batch.inputs, batch.valid_lens), batch)
      return sums['nll'] / jnp.maximum(sums['weight'], 1.0)
    return jax.grad(loss)(params)

  g = grads(params)
  blocks = g['encoder']['blks']
  return [float(jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in
                             jax.tree.leaves(blocks[i]))))
          for i in range(config.model.num_layers)]


def trainability(workdir, seeds, norms, depths, warmups, steps):
  rows, grad_curves, data = [], {}, []
  for norm in norms:
    for depth in depths:
      base = depth_config(norm, depth, 0, steps)
      norms_at_init = layer_grad_norms(base)
      grad_curves[(norm, depth)] = norms_at_init
      for warmup in warmups:
        config = depth_config(norm, depth, warmup, steps)
        accs, diverged = [], 0
        for seed in range(seeds):
          config.seed = seed
          name = f'trainability/norm={norm},depth={depth},warmup={warmup},seed={seed}'
          try:
            accs.append(common.accuracy(common.run(config, workdir, name), 16))
          except NonFiniteError:
            diverged += 1
            accs.append(0.5)
        failed = sum(a < 0.6 for a in accs)
        rows.append([norm, depth, warmup, common.mean_std(accs),
                     f'{diverged}/{seeds}', f'{failed}/{seeds}',
                     f'{norms_at_init[0]:.3g}', f'{norms_at_init[-1]:.3g}'])
        data.append({'norm': norm, 'depth': depth, 'warmup': warmup,
                     'accuracy': accs, 'diverged': diverged,
                     'grad_norms_step0': norms_at_init})
  table = common.markdown_table(
      ['norm', 'depth', 'warmup steps', 'accuracy (len 16)', 'diverged (NaN)',
       'stuck near chance (< 0.6)', 'grad norm, layer 1', 'grad norm, last layer'],
      rows)
  return table, grad_curves, data


def plot_grad_norms(grad_curves, depth, path):
  fig, ax = plt.subplots(figsize=(6, 4))
  for (norm, d), values in grad_curves.items():
    if d == depth:
      ax.plot(range(1, d + 1), values, marker='.', label=f'{norm}-LN' if norm != 'none' else 'no LN')
  ax.set_yscale('log')
  ax.set_xlabel('layer')
  ax.set_ylabel('gradient norm at step 0')
  ax.set_title(f'Per-layer gradient norm at initialisation, depth {depth}')
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


def position_probe(workdir, encodings, steps, layers):
  results, data = {}, {}
  for position in encodings:
    config = common.base_config(name='reverse')
    config.model.position, config.model.num_layers = position, layers
    config.model.max_len = 64
    config.train.num_steps = steps
    config.train.checkpoint_every = config.eval.every = steps
    name = f'probe/position={position}'
    init = Trainer(config)
    before = layer_probes(init.model(init.init_state()['params']), init.task, 16, 0)
    summary = common.run(config, workdir, name)
    after = layer_probes(common.trained_model(config, os.path.join(workdir, name)),
                         init.task, 16, 0)
    results[position] = (before, after, common.accuracy(summary, 16))
    data[position] = {'init': before, 'trained': after,
                      'task_accuracy': common.accuracy(summary, 16)}
  header = ['encoding', 'reverse acc'] + [
      f'{"emb" if i == 0 else f"layer {i}"} init / trained' for i in range(layers + 1)]
  rows = [[p, f'{acc:.3f}'] + [f'{b:.2f} / {a:.2f}' for b, a in zip(before, after)]
          for p, (before, after, acc) in results.items()]
  return common.markdown_table(header, rows), results, data


def plot_probe(results, path):
  fig, ax = plt.subplots(figsize=(6, 4))
  for position, (before, after, _) in results.items():
    line, = ax.plot(range(len(after)), after, marker='o', label=f'{position}, trained')
    ax.plot(range(len(before)), before, ls='--', color=line.get_color(),
            label=f'{position}, init')
  ax.axhline(1 / 16, color='gray', ls=':', lw=1, label='chance (1/16)')
  ax.set_xlabel('layer (0 = embeddings + absolute encoding)')
  ax.set_ylabel('linear probe accuracy of absolute position')
  ax.set_ylim(0, 1.02)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


# --------------------------------------------------------------------------

def exercise1(workdir: str, seeds: int, quick: bool) -> str:
  os.makedirs(workdir, exist_ok=True)
  depth = 12 if quick else 48
  curves = rank_collapse(depth, 1 if quick else 3)
  plot_rank_collapse(curves, os.path.join(workdir, 'rank_collapse.png'))
  shown = [1, 2, 4, 8, 12] + ([24, 48] if not quick else [])
  collapse = common.markdown_table(
      ['variant'] + [f'after {n}' for n in shown],
      [[v] + [f'{c[n]:.2e}' for n in shown] for v, c in curves.items()])

  norms, depths = ('post', 'pre', 'none'), (2, 6, 12, 24)
  warmups, steps = (0, 100), 400
  if quick:
    norms, depths, warmups, steps = ('post', 'pre'), (6,), (0,), 150
  table, grad_curves, train_data = trainability(
      workdir, 1 if quick else seeds, norms, depths, warmups, steps)
  plot_grad_norms(grad_curves, depths[-1], os.path.join(workdir, 'grad_norms.png'))

  encodings = ('sinusoidal', 'shaw') if quick else ('sinusoidal', 'learned', 'shaw')
  probe_table, probe_results, probe_data = position_probe(
      workdir, encodings, 100 if quick else 1000, 2 if quick else 4)
  plot_probe(probe_results, os.path.join(workdir, 'position_probe.png'))

  text = common.write_results(
      workdir, 'Exercise 1: stacking self-attention layers deep',
      [('Rank collapse at initialisation',
        f'Width 64, 4 heads, 32 tokens (random embeddings + sinusoidal table), '
        f'mean over {1 if quick else 3} seed(s). Relative distance from rank '
        f'one after n layers:\n\n{collapse}\n\n![rank collapse](rank_collapse.png)'),
       ('Trainability: layer norm placement and warmup',
        f'Task `precedes` (chance 0.5), width 32, lengths 4-16, {steps} steps '
        f'at peak learning rate 3e-3 (AdamW, cosine); accuracy at length 16.\n\n'
        f'{table}\n\n![gradient norms](grad_norms.png)'),
       ('Position information by layer',
        'Linear (ridge) probe of the absolute position (16 classes) from each '
        'layer\'s token representations of `reverse` inputs of length 16, '
        'fitted on 192 sequences and scored on 64.\n\n'
        f'{probe_table}\n\n![position probe](position_probe.png)')],
      data={'rank_collapse': curves, 'trainability': train_data,
            'probe': probe_data})
  print(text)
  return text


if __name__ == '__main__':
  # 24 trainability runs per seed: two seeds keep the default near 20 minutes.
  flags.FLAGS.set_default('seeds', 2)
  app.run(common.main_wrapper(exercise1))
