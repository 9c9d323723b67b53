"""scripts/kernel_probe.py and probe_verdicts.py: a row that hangs, crashes
or raises in its child process gets that verdict and the rows after it
are still probed in a fresh child; the timing scripts skip exactly the rows
that could stop their process. The children here are stand-ins (a few
lines of Python acting out each outcome); the probe's own child, which
runs bench_gpu's rows, is dry-run on the CPU in BENCHMARKS.md."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from scripts import kernel_probe
from scripts import probe_verdicts

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

# Acts out each row by its encoding's name; appends a line per child
# started to the file named by argv[2].
STAND_IN = textwrap.dedent('''
    import json, os, sys, time
    def say(**m):
        print(json.dumps(m), flush=True)
    with open(sys.argv[2], 'a') as f:
        f.write('child\\n')
    if sys.argv[3] == 'silent':
        time.sleep(30)
    say(ready=True)
    print('{a library writing to stdout', flush=True)   # not a message
    print('[1, 2]', flush=True)
    if sys.argv[3] == 'quits':
        sys.exit(0)
    for key in sys.argv[1].split(','):
        encoding, impl, causal = key.split(':')
        say(start=key)
        if encoding == 'slow_compile':
            time.sleep(30)
        say(compiled=key)
        if encoding == 'hangs':
            time.sleep(30)
        if encoding == 'crashes':
            os._exit(3)
        say(ran=key)
        verdict = {'raises': 'error', 'off': 'wrong'}.get(encoding, 'ok')
        say(encoding=encoding, impl=impl, causal=causal == '1',
            verdict=verdict, detail='stand-in')
        if verdict == 'error':
            sys.exit(0)
''')


def _probe(tmp_path, encodings, mode='normal', budget=60.0, saved=None):
  children = tmp_path / 'children.txt'
  keys = [(e, 'pallas_hopper', False) for e in encodings]

  def argv(remaining):
    return [sys.executable, '-c', STAND_IN,
            ','.join(kernel_probe.key_text(k) for k in remaining),
            str(children), mode]

  result = kernel_probe.run_probes(
      argv, keys, budget=budget, compile_timeout=1.0, run_timeout=0.5,
      start_timeout=1.0, log=lambda s: None,
      save=None if saved is None else saved.append)
  started = (children.read_text().count('child') if children.exists()
             else 0)
  return result, started


def test_each_outcome_gets_its_verdict_and_the_rows_after_it_still_run(
    tmp_path):
  saved = []
  result, children = _probe(
      tmp_path, ['ok1', 'hangs', 'ok2', 'crashes', 'raises', 'off',
                 'slow_compile', 'ok3'], saved=saved)
  verdicts = {p['encoding']: (p['verdict'], p['detail'])
              for p in result['probes']}
  assert verdicts == {
      'ok1': ('ok', 'stand-in'),
      'hangs': ('hung', 'running took over 0.5 s'),
      'ok2': ('ok', 'stand-in'),
      'crashes': ('crashed', 'exit status 3 while running'),
      'raises': ('error', 'stand-in'),
      'off': ('wrong', 'stand-in'),
      'slow_compile': ('hung', 'compiling took over 1 s'),
      'ok3': ('ok', 'stand-in')}
  assert result['not_probed'] == [] and result['stopped'] is None
  # A fresh child after the hang, the crash, the error and the slow
  # compile; the 'wrong' row does not stop its child.
  assert children == 5
  # Saved after every verdict: a probe killed from outside keeps them.
  assert [len(s['probes']) for s in saved] == list(range(1, 9))
  assert saved[3]['not_probed'] == [
      'raises:pallas_hopper:0', 'off:pallas_hopper:0',
      'slow_compile:pallas_hopper:0', 'ok3:pallas_hopper:0']


def test_the_budget_and_a_child_that_never_starts_stop_the_probe(tmp_path):
  result, _ = _probe(tmp_path, ['ok1', 'ok2'], budget=0.0)
  assert result['probes'] == []
  assert result['stopped'] == 'the budget of 0 s ended'
  assert result['not_probed'] == ['ok1:pallas_hopper:0',
                                  'ok2:pallas_hopper:0']
  result, _ = _probe(tmp_path, ['ok1'], mode='silent')
  assert result['stopped'] == 'the child did not start in 1 s'
  assert result['probes'] == []
  result, _ = _probe(tmp_path, ['ok1'], mode='quits')
  assert result['stopped'] == ('the child ended (exit status 0) with 1 rows '
                               'left')


@pytest.mark.skipif(sys.platform != 'linux', reason='prctl is Linux only')
def test_a_child_dies_with_its_probe(tmp_path):
  """A child hung on a GPU must not outlive a probe killed by its time
  limit (it would share the card with the timings after it)."""
  armed = tmp_path / 'armed'
  child = (f'import sys, time; sys.path.insert(0, {ROOT!r}); '
           'from scripts import kernel_probe; '
           'kernel_probe.die_with_parent(); '
           f'open({str(armed)!r}, "w").close(); time.sleep(60)')
  parent = textwrap.dedent(f'''
      import subprocess, sys, time
      child = subprocess.Popen([sys.executable, '-c', {child!r}])
      print(child.pid, flush=True)
      time.sleep(60)
  ''')
  proc = subprocess.Popen([sys.executable, '-c', parent],
                          stdout=subprocess.PIPE, text=True)
  child_pid = int(proc.stdout.readline())
  deadline = time.monotonic() + 20
  while not armed.exists() and time.monotonic() < deadline:
    time.sleep(0.02)
  os.kill(child_pid, 0)                      # alive while its parent is
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  deadline = time.monotonic() + 10
  while time.monotonic() < deadline:
    try:
      os.kill(child_pid, 0)
    except ProcessLookupError:
      break
    # A zombie until reaped by init: gone from the table, or state Z.
    with open(f'/proc/{child_pid}/stat') as f:
      if f.read().split(')')[-1].split()[0] == 'Z':
        break
    time.sleep(0.05)
  else:
    os.kill(child_pid, signal.SIGKILL)
    pytest.fail('the child outlived its killed parent')


PROBE = {
    'probes': [
        {'encoding': 'none', 'impl': 'pallas_hopper', 'causal': False,
         'verdict': 'ok', 'detail': 'out 3e-03'},
        {'encoding': 'alibi', 'impl': 'pallas_hopper', 'causal': False,
         'verdict': 'hung', 'detail': 'running took over 20 s'},
        {'encoding': 't5', 'impl': 'pallas_hopper', 'causal': False,
         'verdict': 'error', 'detail': 'XlaRuntimeError: illegal address'},
        {'encoding': 'shaw', 'impl': 'pallas_hopper', 'causal': False,
         'verdict': 'wrong', 'detail': 'out 0.9'},
        {'encoding': 'none', 'impl': 'pallas', 'causal': False,
         'verdict': 'crashed', 'detail': 'exit status -11 while running'},
    ],
    'not_probed': [], 'stopped': None, 'seconds': 9.0}


def test_the_timing_scripts_skip_exactly_the_rows_that_could_stop_them():
  skip = lambda *row: probe_verdicts.skip_reason(PROBE, *row)
  assert skip('none', 'pallas_hopper', False) is None
  assert skip('shaw', 'pallas_hopper', False) is None      # wrong: timed
  assert skip('alibi', 'pallas_hopper', False) == (
      'skipped: kernel_probe: hung (running took over 20 s)')
  assert skip('t5', 'pallas_hopper', False).startswith(
      'skipped: kernel_probe: error (XlaRuntimeError')
  # rope runs none's kernels: none's verdicts.
  assert skip('rope', 'pallas_hopper', False) is None
  assert skip('rope', 'pallas', False).startswith('skipped: kernel_probe: '
                                                  'crashed')
  # Not probed: runs, unless its family (the Hopper rows share their
  # forward) hung or crashed somewhere.
  assert skip('none', 'pallas_hopper_fused', False) == (
      'skipped: not probed, and kernel_probe found alibi/pallas_hopper '
      '(bidirectional) hung')
  assert skip('t5', 'pallas_hopper', True).startswith('skipped: not probed')
  assert skip('t5', 'fused', True) is None
  assert probe_verdicts.skip_reason(None, 'alibi', 'pallas_hopper',
                                    False) is None
  healthy = {**PROBE, 'probes': PROBE['probes'][:1]}
  assert probe_verdicts.skip_reason(healthy, 'none', 'pallas_hopper_fused',
                                    False) is None
  assert probe_verdicts.note(PROBE, 'shaw', 'pallas_hopper', False) == (
      'wrong (out 0.9)')
  assert probe_verdicts.note(PROBE, 'xl', 'pallas', True) == 'not probed'


def test_a_verdict_file_with_an_unknown_verdict_is_refused(tmp_path):
  path = tmp_path / 'probe.json'
  bad = {**PROBE, 'probes': [{**PROBE['probes'][0], 'verdict': 'fine'}]}
  path.write_text(json.dumps(bad))
  with pytest.raises(ValueError, match="verdict 'fine' unknown; valid: ok, "
                     'wrong, error, hung, crashed'):
    probe_verdicts.load(str(path))
  path.write_text(json.dumps(PROBE))
  assert probe_verdicts.load(str(path)) == PROBE


def test_the_plan_probes_hopper_first_and_fused_rows_only_where_they_differ():
  keys = kernel_probe.plan(('none', 'shaw'), ('pallas_hopper',
                                              'pallas_hopper_fused'),
                           (False,))
  assert keys == [('none', 'pallas_hopper', False),
                  ('shaw', 'pallas_hopper', False),
                  ('none', 'pallas_hopper_fused', False)]
  assert kernel_probe.parse_key(kernel_probe.key_text(keys[2])) == keys[2]
  # bench_gpu's FUSED_ENCODINGS, written out here (the parent imports no
  # JAX).
  from selfattn.nn import hopper_backward
  assert kernel_probe.FUSED_ENCODINGS == hopper_backward.FUSED_KINDS + (
      'rope',)


def test_bench_gpu_and_tune_hopper_skip_what_the_probe_found_hanging(
    tmp_path):
  probe = tmp_path / 'probe.json'
  probe.write_text(json.dumps({**PROBE, 'probes': PROBE['probes'][:2]}))
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  subprocess.run(
      [sys.executable, 'scripts/bench_gpu.py', '--smoke', '--lengths=32',
       '--encodings=alibi', '--impls=pallas_hopper', '--peers=flax',
       f'--probe={probe}', f'--out={tmp_path}', '--check=false'],
      cwd=ROOT, env=env, check=True, capture_output=True)
  rows = json.loads((tmp_path / 'bench_gpu.json').read_text())['rows']
  assert [(r['impl'], r['encoding'], r['status'], r.get('probe'))
          for r in rows] == [
      ('flax', 'none', 'ok', None),
      ('selfattn:pallas_hopper', 'alibi',
       'skipped: kernel_probe: hung (running took over 20 s)',
       'hung (running took over 20 s)')]
  subprocess.run(
      [sys.executable, 'scripts/tune_hopper.py', '--smoke', '--kind=alibi',
       f'--probe={probe}', f'--out={tmp_path}'],
      cwd=ROOT, env=env, check=True, capture_output=True)
  rows = json.loads((tmp_path / 'tune_hopper_alibi.json').read_text())['rows']
  assert [(r['causal'], r['status']) for r in rows] == [
      (False, 'skipped: kernel_probe: hung (running took over 20 s)'),
      (True, 'skipped: not probed, and kernel_probe found alibi/'
       'pallas_hopper (bidirectional) hung')]
