"""Issue 47's performance targets for selfattn's own GPU kernel, and the
table scripts/bench_gpu.py prints of them: target / measured / met, each
ratio over cuDNN without bias measured in the same call. No flags, so tests
import it beside other drivers."""

from __future__ import annotations


def _fmt(value, spec: str) -> str:
  return '' if value is None else format(value, spec)


# Issue 47's targets for selfattn's own kernel (impl 'pallas'), H100/H200,
# bf16, B = 2, H = 16, L = 8192, D = 64: time over cuDNN's without bias in
# the same call, and compiled memory over cuDNN's. A target is met only
# where it was measured.
TIME_TARGETS = {'none': 1.2, 'alibi': 1.25, 't5': 1.5, 'shaw': 2.0}
MEMORY_TARGET = 1.5


def row_impl(impl: str) -> str:
  """The `impl` of bench_gpu.py's row for selfattn's attention_impl=impl
  (peers' rows are named by the peer alone)."""
  return f'selfattn:{impl}'


# selfattn's own kernels: the Hopper ones where they apply (Triton
# elsewhere), with the two-kernel or the one-kernel backward, and 'pallas'
# as 'auto' routes it; the fastest row counts.
KERNEL_ROWS = (row_impl('pallas_hopper'), row_impl('pallas_hopper_fused'),
               row_impl('pallas'))
KERNEL_ROW = KERNEL_ROWS[0]

# The largest forward error (|out - ref| / |ref| against the float32 plain
# path, bench_gpu's rel err) of a correct bf16 row: the H100's rows of
# 2026-11-26 had 1.9e-3 to 2.4e-3; a broken kernel's is order 1.
REL_ERR_LIMIT = 2e-2


def checked(rows: list[dict], row: dict) -> bool | None:
  """Whether the row's kernel was checked against the plain path in this
  call: True where a check passed (its rel err at bench_gpu's check
  length, any length of the same impl, encoding and mask, or
  kernel_probe's 'ok'), False where one failed (that rel err over
  REL_ERR_LIMIT, or the probe's 'wrong'), None where none ran."""
  same = [r for r in rows if (r.get('impl'), r.get('encoding'),
                              r.get('causal')) == (row.get('impl'),
                                                   row.get('encoding'),
                                                   row.get('causal'))]
  errors = [r['rel_err'] for r in same if r.get('rel_err') is not None]
  probe = row.get('probe') or ''
  if probe.startswith('wrong') or any(e > REL_ERR_LIMIT for e in errors):
    return False
  if errors or probe.startswith('ok'):
    return True
  return None


def targets(rows: list[dict], length: int) -> list[dict]:
  """Per (encoding of TIME_TARGETS, mask): target, measured ratio to
  cuDNN (time and compiled memory) and whether each is met; measured None
  where this run has no pallas row or no cuDNN row at `length` (a CPU run:
  'not measured', never 'met'). The fastest kernel row counts, leaving
  out those whose check failed (`checked`); a target is met only where
  that row's check passed ('checked' False or None: met None, the table's
  'unchecked')."""
  cudnn = {r['causal']: r for r in rows
           if r.get('impl') == 'cudnn' and r.get('length') == length
           and r.get('status') == 'ok'}
  out = []
  for causal in sorted({r['causal'] for r in rows if 'causal' in r}):
    for encoding, target in TIME_TARGETS.items():
      mine = min((r for r in rows if r.get('impl') in KERNEL_ROWS
                  and r.get('encoding') == encoding
                  and r.get('length') == length and r['causal'] == causal
                  and r.get('status') == 'ok'
                  and checked(rows, r) is not False),
                 key=lambda r: r['ms'], default=None)
      correct = None if mine is None else checked(rows, mine)
      base = cudnn.get(causal)
      time_ratio = mib_ratio = None
      if mine is not None and base is not None:
        time_ratio = mine['ms'] / base['ms']
        if mine.get('compiled_mib') and base.get('compiled_mib'):
          mib_ratio = mine['compiled_mib'] / base['compiled_mib']
      out.append({'encoding': encoding, 'causal': causal, 'length': length,
                  'row': None if mine is None else mine['impl'],
                  'checked': correct,
                  'target': target, 'measured': time_ratio,
                  'met': (None if time_ratio is None or not correct
                          else time_ratio <= target),
                  'memory_target': MEMORY_TARGET, 'memory': mib_ratio,
                  'memory_met': (None if mib_ratio is None or not correct
                                 else mib_ratio <= MEMORY_TARGET)})
  return out


def targets_table(entries: list[dict]) -> str:
  """Markdown: target / measured / met, time and memory over cuDNN; a
  ratio whose row was not checked against the plain path is 'unchecked',
  not met."""
  def met(value, measured, correct):
    if measured is None:
      return 'not measured'
    if not correct:
      return 'unchecked'
    return 'yes' if value else 'no'
  lines = ['| encoding | mask | L | time target (x cuDNN) | measured | met | '
           'memory target | measured | met |',
           '|---|---|---:|---:|---:|---|---:|---:|---|']
  for e in entries:
    lines.append(
        f'| {e["encoding"]} | {"causal" if e["causal"] else "bidir"} | '
        f'{e["length"]} | {e["target"]:.2f} | {_fmt(e["measured"], ".2f")} | '
        f'{met(e["met"], e["measured"], e["checked"])} | '
        f'{e["memory_target"]:.2f} | {_fmt(e["memory"], ".2f")} | '
        f'{met(e["memory_met"], e["memory"], e["checked"])} |')
  return '\n'.join(lines)
