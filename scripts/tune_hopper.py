"""Block sizes, stages and ping-pong of the Hopper kernels (issue 47 item 4),
timed against cuDNN in the same call.

  python scripts/tune_hopper.py --out DIR        # on an H100 / H200
  python scripts/tune_hopper.py --smoke          # the CPU dry run (interpreter)
  python scripts/tune_hopper.py --kind=shaw ...  # an encoding's kernels
  python scripts/tune_hopper.py --probe=P.json   # skip what kernel_probe.py
                                                 # found hanging or failing
  python scripts/tune_hopper.py --resume ...     # after a lost device (75)

--kind: the encoding the kernels compute, its position module at its
defaults (selfattn.nn.positions; Shaw per head, keys and values), randomly
initialised. hopper_attention.TUNED holds one shape per
(pass, causal) for every kind; a kind whose best differs is a reason to key
it by kind too.

For each causal setting and each (block_k, stages, ping_pong) of the grid:
the forward (hopper_attention.forward) and the backward alone
(hopper_backward.backward, given the forward's lse and delta; for none,
ALiBi and T5 both its forms, the dQ and dK/dV kernels and the one fused
kernel, HopperConfig.fused_dq), bf16,
B x H x L x D (default 2 x 16 x 8192 x 64), jitted and compiled ahead of
time, median of --repeats runs; cuDNN's forward and forward + backward
(jax.nn.dot_product_attention, implementation='cudnn') as the peer. A
configuration that fails to compile or run prints a row saying so. The last
lines are the fastest configuration per (pass, causal), in the form of
hopper_attention.TUNED's rows. Outputs under --out: tune_hopper.json and
tune_hopper.md (tune_hopper_KIND.* for another --kind), rewritten after
every row (a time limit keeps what ran).

TFLOP/s: 4 B H L^2 D per forward (halved when causal), 2.5 x that for the
backward (bench_gpu.py's convention). `x cuDNN`: a forward row over
cuDNN's forward; a backward row's forward + backward (with the same grid
point's forward) over cuDNN's forward + backward. `vs two kernels`: a
fused backward row's largest gradient difference from the two kernels' at
the same grid point, relative to that gradient's largest entry (bf16
rounding: about 1e-2 at most; a broken reduce-add: order 1).
"""

from __future__ import annotations

import itertools
import os
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from scripts import interpreter_pools  # noqa: E402
from scripts import probe_verdicts  # noqa: E402

# The dry run interprets the kernels: JAX must start with pools that hold
# every simulated warpgroup.
if __name__ == '__main__':
  interpreter_pools.for_smoke_run(sys.argv)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from scripts import kernel_timing as shared  # noqa: E402
from scripts.kernel_timing import encoding  # noqa: E402
from scripts.kernel_timing import median_ms  # noqa: E402
from selfattn.nn import hopper_attention as hopper  # noqa: E402
from selfattn.nn import hopper_backward  # noqa: E402


# TUNED's block_k first: a time limit keeps the rows of the shape the
# kernels run today, both backward forms among them.
GRID = dict(block_k=(128, 64), stages=(2, 3), ping_pong=(True, False))
SMOKE_GRID = dict(block_k=(64,), stages=(2,), ping_pong=(True, False))
# The backward's two forms (HopperConfig.fused_dq), each timed at every
# (block_k, stages).
FUSED = (False, True)

_PROBE = flags.DEFINE_string(
    'probe', None, "scripts/kernel_probe.py's verdicts (JSON): a mask whose "
    "Hopper row (pallas_hopper) it found hanging, faulting or failing is "
    "not tuned, and one whose one-kernel backward (pallas_hopper_fused) it "
    "did is tuned without that form; a row says why.")


def markdown(result: dict) -> str:
  lines = [f'# tune_hopper ({result["kind"]}) on {result["device"]}, '
           f'JAX {result["jax"]}, '
           f'B={result["batch"]} H={result["heads"]} L={result["length"]} '
           f'D={result["head_dim"]}, bf16', '',
           '| causal | pass | kernel | block_k | stages | ping_pong | '
           'fused dQ | ms | TFLOP/s | x cuDNN | vs two kernels | status |',
           '|---|---|---|---:|---:|---|---|---:|---:|---:|---:|---|']
  for r in result['rows']:
    cell = lambda key, spec='': ('' if r.get(key) is None
                                 else format(r[key], spec))
    lines.append(
        f'| {r["causal"]} | {r["pass"]} | {r["kernel"]} | {cell("block_k")} '
        f'| {cell("stages")} | {cell("ping_pong")} | {cell("fused_dq")} '
        f'| {cell("ms", ".3f")} | '
        f'{cell("tflops", ".0f")} | {cell("x_cudnn", ".2f")} | '
        f'{cell("vs_two_kernels", ".1e")} | '
        f'{r.get("status", "ok")} |')
  lines += ['', 'Fastest per pass (hopper_attention.TUNED rows):', '']
  lines += [f'    {line}' for line in result['best']]
  return '\n'.join(lines) + '\n'


def largest_difference(grads, reference) -> float:
  """The largest of |g - r| / max |r| over the gradients (dq, dk, dv and
  the table's) of two backward forms."""
  worst = 0.0
  for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(reference)):
    g, r = (jnp.asarray(x, jnp.float32) for x in (g, r))
    scale = float(jnp.max(jnp.abs(r)))
    worst = max(worst, float(jnp.max(jnp.abs(g - r))) / max(scale, 1e-30))
  return worst


def best_rows(rows: list[dict]) -> list[str]:
  out = []
  for causal, name in itertools.product((False, True),
                                        ('forward', 'backward')):
    ok = [r for r in rows if r['causal'] == causal and r['pass'] == name
          and r['kernel'] == 'hopper' and 'ms' in r]
    if ok:
      r = min(ok, key=lambda r: r['ms'])
      extra = (f", ping_pong={r['ping_pong']}" if name == 'forward'
               else f", fused_dq={bool(r.get('fused_dq'))}")
      out.append(f"({name!r}, {causal}): dict(block_k={r['block_k']}, "
                 f"stages={r['stages']}{extra}),  # {r['ms']:.3f} ms")
  return out


def main(argv):
  del argv
  smoke = shared.SMOKE.value
  b, h, length, d = ((1, 1, 256, 64) if smoke else
                     (shared.BATCH.value, shared.HEADS.value,
                      shared.LENGTH.value, shared.HEAD_DIM.value))
  repeats = 2 if smoke else shared.REPEATS.value
  grid = SMOKE_GRID if smoke else GRID
  q, k, v, g = shared.random_inputs(b, h, length, d)
  kind = shared.KIND.value
  fields, table = encoding(kind, h, d)
  result = shared.new_result(kind, b, h, length, d, smoke)
  if shared.RESUME.value:
    # cuDNN's rows and the probe's skips are made again.
    result['rows'] = [r for r in shared.earlier_rows(
        shared.OUT.value, 'tune_hopper', kind)
                      if r['kernel'] == 'hopper' and 'block_k' in r]
  done = {(r['causal'], r['block_k'], r['stages'], r['ping_pong'])
          for r in result['rows'] if r['pass'] == 'forward'}

  def save():
    result['best'] = best_rows(result['rows'])
    shared.write_outputs(shared.OUT.value, 'tune_hopper', kind, result,
                         markdown(result))

  def failed():
    save()
    shared.stop_if_device_lost()

  probe = probe_verdicts.load(_PROBE.value)
  for causal, flops, base, out_of_time in shared.causal_rounds(
      result, q, k, v, g, repeats, smoke):
    skipped = probe_verdicts.skip_reason(probe, kind, 'pallas_hopper', causal)
    if skipped:
      result['rows'].append({'causal': causal, 'kernel': 'hopper',
                             'pass': 'forward', 'status': skipped})
      print(result['rows'][-1], flush=True)
      save()
      continue
    forms = FUSED if kind in hopper_backward.FUSED_KINDS else (False,)
    fused_skipped = len(forms) > 1 and probe_verdicts.skip_reason(
        probe, kind, 'pallas_hopper_fused', causal)
    if fused_skipped:
      forms = (False,)
      result['rows'].append({'causal': causal, 'kernel': 'hopper',
                             'pass': 'backward', 'fused_dq': True,
                             'status': fused_skipped})
    for block_k, stages, ping_pong in itertools.product(*grid.values()):
      if out_of_time():
        break
      if (causal, block_k, stages, ping_pong) in done:
        continue
      cfg = hopper.HopperConfig(kind=kind, symmetric=False, causal=causal,
                                scale=d ** -0.5, block_k=block_k,
                                stages=stages, ping_pong=ping_pong,
                                interpret=smoke, **fields)
      forward = jax.jit(lambda q, k, v, table, cfg=cfg: hopper.forward(
          cfg, q, k, v, None, table))
      row = dict(causal=causal, kernel='hopper', block_k=block_k,
                 stages=stages, ping_pong=ping_pong)

      def add(cells):
        result['rows'].append({**row, **cells})
        print(result['rows'][-1], flush=True)

      try:
        out, lse = forward(q, k, v, table)
        ms = median_ms(forward, (q, k, v, table), repeats)
      except Exception as e:  # noqa: BLE001  (a row, not a stop)
        traceback.print_exc()
        add({'pass': 'forward', 'status': shared.short_error(e)})
        failed()
        continue
      add({'pass': 'forward', 'ms': ms, 'tflops': flops / ms / 1e9,
           'x_cudnn': ms / base['forward'] if base.get('forward') else None})
      if ping_pong:      # the backward has no ping-pong: time it once
        delta = jnp.sum(out.astype(jnp.float32) * g.astype(jnp.float32), -1)
        args = (q, k, v, table, g, lse, delta)
        # Both backwards: the dQ and dK/dV kernels, and the one kernel
        # adding dQ by TMA reduce-add where the kind has it; a failure is
        # that form's row. The fused row also says how far its gradients
        # are from the two kernels' (the reduce-add at full size).
        two_kernels = None
        for fused in forms:
          backward = jax.jit(
              lambda q, k, v, table, g, lse, delta,
              cfg=cfg._replace(fused_dq=fused):
              hopper_backward.backward(cfg, q, k, v, None, table, g, lse,
                                       delta))
          form = {'ping_pong': None, 'fused_dq': fused, 'pass': 'backward'}
          try:
            grads = backward(*args)
            ms_b = median_ms(backward, args, repeats)
          except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            add({**form, 'status': shared.short_error(e)})
            failed()
            continue
          if not fused:
            two_kernels = grads
          elif two_kernels is not None:
            form['vs_two_kernels'] = largest_difference(grads, two_kernels)
          both = base.get('forward+backward')
          add({**form, 'ms': ms_b, 'tflops': 2.5 * flops / ms_b / 1e9,
               'x_cudnn': (ms + ms_b) / both if both else None})
      save()
  save()
  print(markdown(result))


if __name__ == '__main__':
  app.run(main)
