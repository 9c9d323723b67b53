"""Block sizes and per-kernel warps and stages of the Triton kernels (issue 47:
"all three kernels share 128x128 blocks, 4 warps and 2 stages, untuned per
kernel"), timed against cuDNN in the same call.

  python scripts/tune_triton.py --out DIR        # on a CUDA GPU
  python scripts/tune_triton.py --smoke          # the CPU dry run (lowering)
  python scripts/tune_triton.py --kind=shaw ...  # an encoding's kernels
  python scripts/tune_triton.py --resume ...     # after a lost device (75)

--kind: the encoding the kernels compute, its position module at its
defaults (Shaw per head, keys and values), randomly initialised.

For each causal setting and each (block_q, block_k) of --blocks, one
coordinate sweep over (num_warps, num_stages) in LAUNCHES: the forward
alone (the other two kernels at the default launch), then the dQ kernel
(timed in forward + backward, the forward at its best), then the dK/dV
kernel (forward and dQ at their best). bf16, B x H x L x D (default 2 x 16
x 8192 x 64), gpu_kernel='triton', jitted and compiled ahead of time,
median of --repeats runs; cuDNN's forward and forward + backward as the
peer (it has no relative term: for the other kinds it is the anchor, not a
competitor). A configuration that fails to compile or run is a row saying
so. The last lines are the fastest (blocks, TritonTuning) per causal
setting, in the form pallas_attention takes. Outputs under --out:
tune_triton.json and tune_triton.md (tune_triton_KIND.* for another
--kind), rewritten after every row (a time limit keeps what ran).

--smoke lowers every row of a small grid for 'cuda' inside an abstract H100
(selfattn.nn.lowering) and checks that each kernel carries the launch the
row asked for: no timing, no GPU.

TFLOP/s: 4 B H L^2 D per forward (halved when causal), 3.5 x that for
forward + backward (bench_gpu.py's convention).
"""

from __future__ import annotations

import itertools
import os
import re
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from flax import nnx  # noqa: E402

from scripts import kernel_timing as shared  # noqa: E402
from scripts.kernel_timing import median_ms  # noqa: E402
from scripts.kernel_timing import position_module  # noqa: E402
from selfattn.nn import pallas_attention as pa  # noqa: E402
from selfattn.nn import pallas_kernels  # noqa: E402
from selfattn.nn.lowering import lowered_text  # noqa: E402

_BLOCKS = flags.DEFINE_list('blocks', '128x128,128x64,64x128,64x64',
                            'block_q x block_k pairs to sweep.')

# (num_warps, num_stages) tried per kernel.
LAUNCHES = tuple(itertools.product((4, 8), (1, 2, 3)))
SMOKE_LAUNCHES = ((4, 2), (8, 3))
PASSES = pallas_kernels.TRITON_PASSES      # ('forward', 'dq', 'dkdv')


def parse_blocks(values: list[str]) -> list[tuple[int, int]]:
  """--blocks as (block_q, block_k) pairs: powers of two >= 16, what the
  Triton layout runs (pallas_kernels.layout would round another size)."""
  blocks = []
  for value in values:
    match = re.fullmatch(r'\s*(\d+)x(\d+)\s*', value)
    sizes = (int(match[1]), int(match[2])) if match else ()
    if not sizes or any(n < 16 or n & (n - 1) for n in sizes):
      raise app.UsageError(f'--blocks: {value!r} is not block_qxblock_k with '
                           f'powers of two >= 16 (e.g. 128x64)')
    blocks.append(sizes)
  return blocks


def tuning(launches: dict[str, tuple[int, int]]) -> pa.TritonTuning:
  """{pass: (num_warps, num_stages)} as pallas_attention's argument."""
  return pa.TritonTuning(**{name: pa.TritonLaunch(*launches[name])
                            for name in PASSES})


class Timer:
  """Times (or, in smoke mode, lowers and checks) one configuration's
  forward or forward + backward."""

  def __init__(self, q, k, v, g, relative, causal: bool, smoke: bool,
               repeats: int):
    self.q, self.k, self.v, self.g = q, k, v, g
    self.graphdef, self.tables = (nnx.split(relative) if relative is not None
                                  else (None, None))
    self.causal, self.smoke, self.repeats = causal, smoke, repeats

  def _attend(self, tables, q, k, v, blocks, launch):
    rel = None if self.graphdef is None else nnx.merge(self.graphdef, tables)
    return pa.pallas_attention(q, k, v, relative=rel, causal=self.causal,
                               block_q=blocks[0], block_k=blocks[1],
                               gpu_kernel='triton', triton=launch)

  def ms(self, pass_name: str, blocks, launch: pa.TritonTuning
         ) -> float | None:
    """Median ms of the forward ('forward') or of forward + backward (any
    other pass); None in smoke mode, after checking the lowered launch."""
    attend = lambda tables, q, k, v: self._attend(tables, q, k, v, blocks,
                                                  launch)
    if pass_name == 'forward':
      fn, args = attend, (self.tables, self.q, self.k, self.v)
    else:
      def fn(tables, q, k, v, g):
        out, vjp = jax.vjp(attend, tables, q, k, v)
        return out, vjp(g)
      args = (self.tables, self.q, self.k, self.v, self.g)
    if self.smoke:
      self._check(lowered_text(fn, *args, platform='cuda'), pass_name,
                  launch)
      return None
    return median_ms(jax.jit(fn).lower(*args).compile(), args, self.repeats)

  @staticmethod
  def _check(text: str, pass_name: str, launch: pa.TritonTuning) -> None:
    found = dict(
        (name, (int(warps), int(stages))) for name, stages, warps in
        re.findall(r'name = "selfattn_flash_(\w+)", num_stages = (\d+) : '
                   r'i32, num_warps = (\d+) : i32', text))
    want = {name: tuple(getattr(launch, name)) for name in
            (PASSES if pass_name != 'forward' else ('forward',))}
    if found != want:
      raise AssertionError(f'lowered launches {found}, asked for {want}')


def markdown(result: dict) -> str:
  lines = [f'# tune_triton ({result["kind"]}) on {result["device"]}, JAX '
           f'{result["jax"]}, B={result["batch"]} H={result["heads"]} '
           f'L={result["length"]} D={result["head_dim"]}, bf16', '',
           '| causal | kernel | timed | swept | block_q | block_k | forward | '
           'dq | dkdv | ms | TFLOP/s | x cuDNN | status |',
           '|---|---|---|---|---:|---:|---|---|---|---:|---:|---:|---|']
  for r in result['rows']:
    cell = lambda key, spec='': ('' if r.get(key) is None
                                 else format(r[key], spec))
    launch = lambda name: ('' if name not in r else
                           '{}w {}s'.format(*r[name]))
    timed = 'forward' if r['pass'] == 'forward' else 'forward+backward'
    swept = r['pass'] if r['kernel'] == 'triton' else ''
    lines.append(
        f'| {r["causal"]} | {r["kernel"]} | {timed} | {swept} | '
        f'{cell("block_q")} | '
        f'{cell("block_k")} | {launch("forward")} | {launch("dq")} | '
        f'{launch("dkdv")} | {cell("ms", ".3f")} | {cell("tflops", ".0f")} '
        f'| {cell("x_cudnn", ".2f")} | {r.get("status", "ok")} |')
  lines += ['', 'Fastest forward + backward per causal setting '
            '(pallas_attention arguments):', '']
  lines += [f'    {line}' for line in result['best'] or ['(none timed)']]
  return '\n'.join(lines) + '\n'


def best_rows(rows: list[dict]) -> list[str]:
  out = []
  for causal in (False, True):
    ok = [r for r in rows if r['causal'] == causal and r['pass'] != 'forward'
          and r['kernel'] == 'triton' and r.get('ms') is not None]
    if ok:
      r = min(ok, key=lambda r: r['ms'])
      launches = ', '.join(f'{name}=TritonLaunch({r[name][0]}, {r[name][1]})'
                           for name in PASSES)
      out.append(f'causal={causal}: block_q={r["block_q"]}, '
                 f'block_k={r["block_k"]}, triton=TritonTuning({launches})'
                 f'  # {r["ms"]:.3f} ms forward + backward')
  return out


def row_key(pass_name: str, trial: dict) -> tuple:
  """What a row timed: the forward at its launch, or forward + backward
  at all three (a dict of pass -> (warps, stages))."""
  if pass_name == 'forward':
    return ('forward', tuple(trial['forward']))
  return ('both', tuple(tuple(trial[name]) for name in PASSES))


def sweep(timer: Timer, blocks, launches, flops: float, base: dict,
          record, out_of_time, earlier=(), on_failure=lambda: None) -> None:
  """The coordinate sweep of one block shape: forward, then dQ, then
  dK/dV, each pass's launch chosen with the earlier passes at their best. A
  forward + backward configuration already timed (dK/dV's trial at its
  default launch is dQ's best) is reused, not run again; so are `earlier`
  rows of this block shape (--resume), the failed ones skipped.
  on_failure() runs after a row fails."""
  default = pallas_kernels.default_triton_tuning(timer.q.shape[-1])
  chosen = {name: tuple(getattr(default, name)) for name in PASSES}
  seen, failed_before = {}, set()
  for r in earlier:
    # cuDNN's rows of this call sit among them (kernel_timing.cudnn_peer).
    if (r['kernel'] == 'triton'
        and (r['block_q'], r['block_k']) == tuple(blocks)):
      key = row_key(r['pass'], r)
      if 'ms' in r:
        seen[key] = r['ms']
      else:
        failed_before.add(key)
  for pass_name in PASSES:
    timed = {}
    for launch in launches:
      trial = {**chosen, pass_name: launch}
      key = row_key(pass_name, trial)
      if key in seen:
        timed[launch] = seen[key]
        continue
      if key in failed_before:
        continue
      if out_of_time():
        return
      row = dict(kernel='triton', block_q=blocks[0], block_k=blocks[1],
                 pass_name=pass_name, **trial)
      try:
        ms = timer.ms(pass_name, blocks, tuning(trial))
        peer = base.get('forward' if pass_name == 'forward'
                        else 'forward+backward')
        work = flops * (1 if pass_name == 'forward' else 3.5)
        row.update(ms=ms, tflops=None if ms is None else work / ms / 1e9,
                   x_cudnn=ms / peer if ms and peer else None,
                   status='ok' if ms is not None else 'lowered')
        timed[launch] = seen[key] = ms
      except Exception as e:  # noqa: BLE001  (a row, not a stop)
        traceback.print_exc()
        row['status'] = shared.short_error(e)
        record(row)
        on_failure()
        continue
      record(row)
    if timed and None not in timed.values():
      chosen[pass_name] = min(timed, key=timed.get)


def main(argv):
  del argv
  smoke = shared.SMOKE.value
  b, h, length, d = ((1, 2, 256, 64) if smoke else
                     (shared.BATCH.value, shared.HEADS.value,
                      shared.LENGTH.value, shared.HEAD_DIM.value))
  blocks_list = [(32, 32)] if smoke else parse_blocks(_BLOCKS.value)
  launches = SMOKE_LAUNCHES if smoke else LAUNCHES
  repeats = shared.REPEATS.value
  q, k, v, g = shared.random_inputs(b, h, length, d)
  kind = shared.KIND.value
  relative = position_module(kind, h, d)
  result = shared.new_result(kind, b, h, length, d, smoke)
  if shared.RESUME.value:
    # cuDNN's rows are made again.
    result['rows'] = [r for r in shared.earlier_rows(
        shared.OUT.value, 'tune_triton', kind) if r['kernel'] == 'triton']

  def save():
    result['best'] = best_rows(result['rows'])
    shared.write_outputs(shared.OUT.value, 'tune_triton', kind, result,
                         markdown(result))

  for causal, flops, base, out_of_time in shared.causal_rounds(
      result, q, k, v, g, repeats, smoke):

    def record(row, causal=causal):
      row = {'causal': causal, 'pass': row.pop('pass_name'), **row}
      result['rows'].append(row)
      print(row, flush=True)
      save()

    timer = Timer(q, k, v, g, relative, causal, smoke, repeats)
    earlier = [r for r in result['rows'] if r['causal'] == causal]
    for blocks in blocks_list:
      sweep(timer, blocks, launches, flops, base, record, out_of_time,
            earlier, shared.stop_if_device_lost)   # record() saved
  save()
  print(markdown(result))
  failed = [r for r in result['rows'] if r.get('status', 'ok')
            not in ('ok', 'lowered')]
  if smoke and failed:
    raise SystemExit(f'{len(failed)} smoke rows failed')


if __name__ == '__main__':
  app.run(main)
