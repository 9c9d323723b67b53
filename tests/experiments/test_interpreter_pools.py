"""scripts/interpreter_pools.py: the scripts that interpret the Hopper
kernels on a CPU (tune_hopper.py --smoke, kernel_facts.py --smoke's
children) start JAX with XLA:CPU pools that hold every simulated
warpgroup; without them tune_hopper.py --smoke hung on one core."""

import os
import subprocess
import sys

import pytest

from scripts import interpreter_pools as pools

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


@pytest.mark.parametrize('argv, smoke', [
    (['x', '--smoke'], True), (['x', '--smoke=true'], True),
    (['x', '--smoke=1'], True), (['x', '--smoke=false'], False),
    (['x', '--nosmoke'], False), (['x', '--smoke', '--nosmoke'], False),
    (['x', '--smoke_test'], False), (['x'], False),
    (['--smoke'], False)])          # argv[0] is the program
def test_smoke_is_read_as_absl_reads_it(argv, smoke):
  assert pools.smoke_requested(argv) is smoke


def test_pools_are_added_once_and_keep_other_flags():
  assert pools.with_pools(None) == pools.POOL_FLAG
  assert (pools.with_pools('--xla_dump_to=/d')
          == f'--xla_dump_to=/d {pools.POOL_FLAG}')
  enough = '--xla_force_host_platform_device_count=16'
  assert pools.with_pools(enough) == enough
  # Fewer devices than warpgroups brings the deadlock back: overridden
  # (XLA reads the last setting).
  few = '--xla_force_host_platform_device_count=2'
  assert pools.with_pools(few) == f'{few} {pools.POOL_FLAG}'


def test_the_flag_is_set_before_jax_starts():
  """In a fresh process, as tune_hopper.py does it: the CPU client then
  has POOL_THREADS devices (which sizes its pools), also where XLA_FLAGS
  asked for fewer."""
  code = ('import sys; from scripts import interpreter_pools as p; '
          'p.for_smoke_run(["tune_hopper", "--smoke"]); import jax; '
          'print(len(jax.devices("cpu")))')
  # A smaller count set before is overridden: XLA reads the last one.
  env = dict(os.environ,
             XLA_FLAGS='--xla_force_host_platform_device_count=2')
  out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.split()[-1] == str(pools.POOL_THREADS)
