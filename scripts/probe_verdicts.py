"""scripts/kernel_probe.py's verdicts, read by the scripts that time the
kernels (bench_gpu.py, tune_hopper.py): which (encoding, impl, causal)
rows are safe to run in their one process. No JAX here.

A verdict is one of:
  ok       the row's loss and gradients ran and match the plain path
  wrong    they ran, but some output is over the probe's tolerance: safe
           to time (the bench's rel err column shows the damage)
  error    the call raised: at compile time harmless, at run time a CUDA
           error that leaves the process's GPU context unusable for every
           later row, which the probe cannot tell apart: skipped
  hung     no result within the probe's time limit (a barrier waited on
           forever): skipped, it would hold the process until killed
  crashed  the probe's process died (a signal): skipped
A row the probe did not reach (its time budget ended, or it was not
asked for) runs, unless a probe of its kernel family hung or crashed: the
Hopper rows share their forward, so one hang makes the unprobed others
suspect too. rope's rows take none's verdicts (the same kernels).
"""

from __future__ import annotations

import json

VERDICTS = ('ok', 'wrong', 'error', 'hung', 'crashed')
STOPS = ('error', 'hung', 'crashed')
# Encodings whose rows run another's kernels: rope rotates q and k, then
# runs none's.
SAME_KERNELS = {'rope': 'none'}


def family(impl: str) -> str:
  """The kernels an impl runs: the two Hopper rows share their forward."""
  return 'pallas_hopper' if impl.startswith('pallas_hopper') else impl


def load(path: str | None) -> dict | None:
  """The probe's JSON (kernel_probe.py --out_json), or None for no path."""
  if not path:
    return None
  with open(path) as f:
    probe = json.load(f)
  for p in probe['probes']:
    if p['verdict'] not in VERDICTS:
      raise ValueError(f'{path}: verdict {p["verdict"]!r} unknown; valid: '
                       f'{", ".join(VERDICTS)}')
  return probe


def find(probe: dict | None, encoding: str, impl: str, causal: bool
         ) -> dict | None:
  """The probe of this row (or of the row whose kernels it runs), if it
  ran."""
  for name in dict.fromkeys((encoding, SAME_KERNELS.get(encoding, encoding))):
    for p in (probe or {}).get('probes', ()):
      if (p['encoding'], p['impl'], p['causal']) == (name, impl, causal):
        return p
  return None


def skip_reason(probe: dict | None, encoding: str, impl: str, causal: bool
                ) -> str | None:
  """Why a row must not run in the timing process ('skipped: ...'), or
  None where it may (or there is no probe)."""
  if probe is None:
    return None
  mine = find(probe, encoding, impl, causal)
  if mine is not None:
    if mine['verdict'] in STOPS:
      return (f'skipped: kernel_probe: {mine["verdict"]} '
              f'({mine.get("detail", "")})')
    return None
  for p in probe['probes']:
    if family(p['impl']) == family(impl) and p['verdict'] in ('hung',
                                                              'crashed'):
      return (f'skipped: not probed, and kernel_probe found '
              f'{p["encoding"]}/{p["impl"]} '
              f'({"causal" if p["causal"] else "bidirectional"}) '
              f'{p["verdict"]}')
  return None


def note(probe: dict | None, encoding: str, impl: str, causal: bool
         ) -> str | None:
  """The row's verdict in a few words, for the bench's JSON."""
  mine = find(probe, encoding, impl, causal)
  if mine is None:
    return None if probe is None else 'not probed'
  detail = mine.get('detail')
  return mine['verdict'] + (f' ({detail})' if detail else '')
