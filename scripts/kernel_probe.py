"""Which of bench_gpu.py's kernel rows are safe to time: each row's loss and
gradients run once at a small shape, in a child process under a time
limit, before the call's timed runs.

  python scripts/kernel_probe.py --out_json=/tmp/probe.json      # on a GPU
  python scripts/kernel_probe.py --smoke --out_json=/tmp/p.json  # CPU dry run
  python scripts/bench_gpu.py --probe=/tmp/probe.json ...        # its use

Why: a kernel that has never run on a GPU can hang (a barrier waited on
forever) or fault (an illegal address, after which the CUDA context is
unusable for every later call of the process). Inside bench_gpu.py's one
process either costs every row after it, and a lent GPU gives one call.
Here the parent starts a child that probes the rows in turn, printing a
line as each starts, compiles, runs and ends. A child silent for longer
than its phase allows (--compile_timeout compiling or checking,
--run_timeout running) is killed, that row 'hung', and a fresh child goes
on with the rest, as after an error or a crash. Verdicts and what the
timing scripts do with them: scripts/probe_verdicts.py.

A probe: bench_gpu.selfattn_case's row for (encoding, impl, causal) at
B x H x L x D = 1 x 2 x 640 x 64 in bf16 (L not a multiple of the blocks,
so padding and masked blocks run; far blocks exist for T5, Shaw and
ALiBi), its jitted loss and gradients once, and the loss and every
gradient against the plain path in float32 (relative error in the norm,
--tolerance). By default the Hopper rows of none, ALiBi, T5 and Shaw
(rope's rows run none's kernels and take its verdict); Triton's rows
on request (--impls). Rows start until --budget seconds have passed; the
rest are 'not probed'. The last line printed is `PROBE_SKIPS=N`, the
number of probed rows the timing scripts will skip.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from scripts import probe_verdicts  # noqa: E402

# rope runs none's kernels after its rotation, xl the plain path: their
# rows take the verdicts of none's and of nothing (probe_verdicts.py).
ENCODINGS = ('none', 'alibi', 't5', 'shaw', 'rope', 'xl')
DEFAULT_ENCODINGS = ('none', 'alibi', 't5', 'shaw')
# Hopper first: its kernels have never run on a GPU. Triton's have (issue
# 47's table), and compile for up to 43 s each (T5, Shaw on an H100):
# probed only when asked for.
IMPLS = ('pallas_hopper', 'pallas_hopper_fused', 'pallas')
DEFAULT_IMPLS = ('pallas_hopper', 'pallas_hopper_fused')
# The encodings with a one-kernel Hopper backward (bench_gpu's
# FUSED_ENCODINGS, hopper_backward.FUSED_KINDS and rope; not imported: this
# parent runs no JAX). The others' pallas_hopper_fused row repeats their
# pallas_hopper row's numbers: nothing of its own to probe.
FUSED_ENCODINGS = ('none', 'alibi', 't5', 'rope')
SHAPE = dict(batch=1, heads=2, length=640, head_dim=64)
SMOKE_SHAPE = dict(batch=1, heads=2, length=40, head_dim=16)


def plan(encodings, impls, masks) -> list[tuple[str, str, bool]]:
  """(encoding, impl, causal) of every row to probe, in probing order."""
  return [(e, i, c) for i in impls for e in encodings for c in masks
          if i != 'pallas_hopper_fused' or e in FUSED_ENCODINGS]


def key_text(key) -> str:
  encoding, impl, causal = key
  return f'{encoding}:{impl}:{int(causal)}'


def parse_key(text: str) -> tuple[str, str, bool]:
  encoding, impl, causal = text.split(':')
  return encoding, impl, causal == '1'


# --------------------------------------------------------------------------
# The parent: children, time limits, verdicts.
# --------------------------------------------------------------------------

class Lines:
  """A child's stdout, a line at a time, with a time limit per read."""

  def __init__(self, stream):
    self.fd, self.buffer = stream.fileno(), b''

  def read(self, timeout: float) -> str | None:
    """The next line, '' at the end of the stream, None on timeout."""
    end = time.monotonic() + timeout
    while b'\n' not in self.buffer:
      left = end - time.monotonic()
      if left <= 0 or not select.select([self.fd], [], [], left)[0]:
        return None
      chunk = os.read(self.fd, 65536)
      if not chunk:
        rest, self.buffer = self.buffer, b''
        return rest.decode(errors='replace')
      self.buffer += chunk
    line, self.buffer = self.buffer.split(b'\n', 1)
    return line.decode(errors='replace') + '\n'


def die_with_parent() -> None:
  """Called by a child first: SIGKILL when its parent dies (Linux), so that
  a child hung on the GPU does not outlive a killed probe and share the
  card with the timed runs after it. (Not a preexec_fn: forking a process
  that runs threads, as one that imported JAX does, may deadlock there.)"""
  if sys.platform != 'linux':
    return
  import ctypes
  import signal
  parent = os.getppid()
  pr_set_pdeathsig = 1
  ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
  if os.getppid() != parent:      # it died before the line above
    os._exit(1)


def run_probes(child_argv, probes, budget: float, compile_timeout: float,
               run_timeout: float, start_timeout: float, log=print,
               save=None) -> dict:
  """Probes each of `probes` in children started by child_argv(remaining
  keys) until `budget` seconds have passed; returns the JSON record, also
  passed to save() after every verdict (a killed probe keeps them).

  A child says 'ready' (JAX imported, inputs made), then per row 'start',
  'compiled', 'ran' and the verdict; the phase it is in sets how long it
  may stay silent: start_timeout before 'ready', compile_timeout while it
  compiles or checks, run_timeout while the row's kernels run."""
  started = time.monotonic()
  pending = list(probes)
  done: list[dict] = []
  stopped = None      # why probing ended before every row had its verdict

  def record(key, verdict, detail, seconds=None):
    encoding, impl, causal = key
    done.append(dict(encoding=encoding, impl=impl, causal=causal,
                     verdict=verdict, detail=detail, seconds=seconds))
    pending.remove(key)
    log(f'  {key_text(key):32s} {verdict:8s} {detail}')
    if save is not None:
      save(result())

  def result():
    return dict(probes=list(done), not_probed=[key_text(k) for k in pending],
                stopped=stopped, seconds=time.monotonic() - started)

  while pending and stopped is None:
    proc = subprocess.Popen(child_argv(pending), stdout=subprocess.PIPE)
    lines = Lines(proc.stdout)
    in_flight, since = None, time.monotonic()
    limit, phase = start_timeout, 'starting'
    try:
      while True:
        line = lines.read(max(0.0, since + limit - time.monotonic()))
        if line is None:              # silent past its phase's limit
          if in_flight is not None:
            record(in_flight, 'hung', f'{phase} took over {limit:g} s')
          else:
            stopped = f'the child did not start in {start_timeout:g} s'
          break
        if line == '':                # the child ended
          code = proc.wait()
          if in_flight is not None:
            record(in_flight, 'crashed', f'exit status {code} while '
                   f'{phase}')
          elif pending:
            stopped = (f'the child ended (exit status {code}) with '
                       f'{len(pending)} rows left')
          break
        try:
          msg = json.loads(line) if line.startswith('{') else None
        except ValueError:
          msg = None
        if not isinstance(msg, dict):     # another library's output
          log(line.rstrip())
          continue
        since = time.monotonic()
        limit, phase = compile_timeout, 'checking'
        if 'start' in msg:
          if since - started > budget:
            stopped = f'the budget of {budget:g} s ended'
            break
          in_flight, phase = parse_key(msg['start']), 'compiling'
        elif 'compiled' in msg:
          limit, phase = run_timeout, 'running'
        elif 'verdict' in msg:
          key = (msg['encoding'], msg['impl'], msg['causal'])
          record(key, msg['verdict'], msg.get('detail', ''),
                 msg.get('seconds'))
          in_flight = None
          if msg['verdict'] == 'error':
            break       # the rest in a fresh process (a GPU context error)
    finally:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  return result()


# --------------------------------------------------------------------------
# The child: the probes themselves.
# --------------------------------------------------------------------------

def emit(**msg) -> None:
  print(json.dumps(msg), flush=True)


def child(keys, smoke: bool, tolerance: float) -> None:
  die_with_parent()
  import jax
  import jax.numpy as jnp
  from absl import flags
  from scripts import bench_gpu
  flags.FLAGS(['kernel_probe'])     # bench_gpu's flags at their defaults

  shape = SMOKE_SHAPE if smoke else SHAPE
  dtype = jnp.float32 if smoke else jnp.bfloat16
  x = bench_gpu.inputs(shape['batch'], shape['heads'], shape['length'],
                       shape['head_dim'], dtype)
  x32 = {n: a.astype(jnp.float32) for n, a in x.items()}
  emit(ready=True, backend=jax.default_backend(),
       device=jax.devices()[0].device_kind)
  references = {}

  def gradients(case):
    return bench_gpu.grad_step(case)(*case.args, x['g'])

  def relative(a, b) -> float:
    a, b = (jnp.asarray(t, jnp.float32) for t in (a, b))
    return float(jnp.linalg.norm(a - b) / max(float(jnp.linalg.norm(b)),
                                              1e-30))

  for key in keys:
    encoding, impl, causal = key
    emit(start=key_text(key))
    began = time.perf_counter()
    try:
      case = bench_gpu.selfattn_case(impl, encoding, x, causal)
      compiled = bench_gpu.grad_step(case).lower(*case.args, x['g']).compile()
      emit(compiled=key_text(key))
      value, grads = jax.block_until_ready(compiled(*case.args, x['g']))
      emit(ran=key_text(key))
      if (encoding, causal) not in references:
        plain = bench_gpu.selfattn_case('plain', encoding, x32, causal)
        with jax.default_matmul_precision('highest'):
          references[encoding, causal] = gradients(plain)
      value_ref, grads_ref = references[encoding, causal]
      # The loss sum(out * g) stands for the output (a check of its own
      # would compile the row's forward again).
      errors = {'loss': relative(value, value_ref)}
      names = ('q', 'k', 'v', 'params')
      for (path, g), r in zip(jax.tree_util.tree_leaves_with_path(grads),
                              jax.tree.leaves(grads_ref)):
        name = names[path[0].idx] + jax.tree_util.keystr(path[1:])
        errors['d' + name] = relative(g, r)
      worst = max(errors, key=errors.get)
      verdict = 'ok' if errors[worst] <= tolerance else 'wrong'
      detail = (f'{case.path}; loss {errors["loss"]:.1e}, worst {worst} '
                f'{errors[worst]:.1e}')
    except Exception as e:  # noqa: BLE001  (a verdict, not a stop)
      verdict, detail = 'error', bench_gpu._short(e)
    emit(encoding=encoding, impl=impl, causal=causal, verdict=verdict,
         detail=detail, seconds=round(time.perf_counter() - began, 2))
    if verdict == 'error':
      return      # the parent goes on in a fresh process


# --------------------------------------------------------------------------

def table(result: dict) -> str:
  lines = ['| encoding | impl | causal | verdict | s | detail |',
           '|---|---|---|---|---:|---|']
  for p in result['probes']:
    seconds = '' if p.get('seconds') is None else f'{p["seconds"]:.1f}'
    lines.append(f'| {p["encoding"]} | {p["impl"]} | {p["causal"]} | '
                 f'{p["verdict"]} | {seconds} | {p["detail"]} |')
  return '\n'.join(lines)


def skips(result: dict, keys) -> int:
  return sum(probe_verdicts.skip_reason(result, *key) is not None
             for key in keys)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--out_json', help='Where the verdicts go (JSON).')
  parser.add_argument('--smoke', action='store_true',
                      help='CPU dry run: tiny float32 rows (interpret mode).')
  parser.add_argument('--encodings', default=','.join(DEFAULT_ENCODINGS),
                      help=f'Of {", ".join(ENCODINGS)}.')
  parser.add_argument('--impls', default=','.join(DEFAULT_IMPLS),
                      help=f'Of {", ".join(IMPLS)}.')
  parser.add_argument('--causal', default='false,true',
                      help='Masks to probe: false, true or false,true.')
  parser.add_argument('--budget', type=float, default=60.0,
                      help='Seconds after which no new probe starts.')
  parser.add_argument('--compile_timeout', type=float, default=60.0,
                      help="Seconds a row's compile (or its check against "
                           "the plain path) may take before it counts as "
                           "hung.")
  parser.add_argument('--run_timeout', type=float, default=20.0,
                      help="Seconds a compiled row's run may take before it "
                           "counts as hung (it takes milliseconds).")
  parser.add_argument('--start_timeout', type=float, default=60.0,
                      help='Seconds a child may take to import JAX and '
                           'make the inputs.')
  parser.add_argument('--tolerance', type=float, default=5e-2,
                      help="Largest relative error of an 'ok' row (bf16 "
                           "rounding is about 1e-2; a broken kernel's is "
                           "order 1).")
  parser.add_argument('--child', help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child is not None:
    child([parse_key(k) for k in args.child.split(',')], args.smoke,
          args.tolerance)
    return 0

  masks = []
  for c in args.causal.split(','):
    if c.strip().lower() not in ('false', 'true'):
      parser.error(f'--causal: {c!r} unknown; valid: false, true')
    masks.append(c.strip().lower() == 'true')
  for name, given, valid in (('encodings', args.encodings, ENCODINGS),
                             ('impls', args.impls, IMPLS)):
    for item in given.split(','):
      if item not in valid:
        parser.error(f'--{name}: {item!r} unknown; valid: {", ".join(valid)}')
  keys = plan(args.encodings.split(','), args.impls.split(','), masks)

  def child_argv(remaining):
    return ([sys.executable, os.path.abspath(__file__),
             '--child=' + ','.join(key_text(k) for k in remaining),
             f'--tolerance={args.tolerance}']
            + (['--smoke'] if args.smoke else []))

  print(f'# kernel_probe: {len(keys)} rows, budget {args.budget:.0f} s; '
        f'a row hangs past {args.compile_timeout:.0f} s compiling or '
        f'{args.run_timeout:.0f} s running', flush=True)
  shape = SMOKE_SHAPE if args.smoke else SHAPE

  def save(result):
    if args.out_json:
      with open(args.out_json, 'w') as f:
        json.dump({**result, 'shape': shape}, f, indent=1)

  save(dict(probes=[], not_probed=[key_text(k) for k in keys],
            stopped=None, seconds=0.0))
  result = run_probes(child_argv, keys, args.budget, args.compile_timeout,
                      args.run_timeout, args.start_timeout,
                      log=lambda s: print(s, flush=True), save=save)
  save(result)
  print(table(result))
  if result['stopped']:
    print(f'stopped: {result["stopped"]}; not probed: '
          f'{len(result["not_probed"])} rows')
  print(f'total {result["seconds"]:.0f} s')
  print(f'PROBE_SKIPS={skips(result, keys)}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
