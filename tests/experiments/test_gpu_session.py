"""scripts/gpu_session.sh's device calls stay within what the device tool
sends: the working tree and the carried paths together at most 64 MiB.
The kernel-side steps carry .whl/kernel, about 6 MiB of wheels (three the
suite needs, and tokamax with what it needs for bench_gpu's tokamax
peers; `prepare` makes it and prints the sums); the repository must leave
room for them. All of .whl (about 41 MiB) does not fit beside the repository:
a call carrying it would be refused, as one was on 2026-11-26."""

import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
LIMIT = 64 * 2 ** 20
# The kernel subset's wheels (5.8 MiB) and room to grow.
MARGIN = 10 * 2 ** 20


def _tracked_bytes() -> int:
  try:
    names = subprocess.run(
        ['git', 'ls-files', '-z', '-co', '--exclude-standard'], cwd=ROOT,
        check=True, capture_output=True).stdout.split(b'\0')
  except (OSError, subprocess.CalledProcessError):
    pytest.skip('not a git checkout')
  return sum(os.path.getsize(os.path.join(ROOT, n.decode()))
             for n in names if n and os.path.isfile(os.path.join(ROOT,
                                                                 n.decode())))


def test_the_repository_leaves_room_for_the_kernel_wheels_in_a_device_call():
  size = _tracked_bytes()
  assert size + MARGIN <= LIMIT, (
      f'the working tree is {size / 2 ** 20:.1f} MiB: with the kernel '
      f'wheels and {MARGIN // 2 ** 20} MiB of room it passes the 64 MiB a '
      'device call sends (move large results out of git, or shrink them)')


def test_the_kernel_steps_are_told_to_carry_the_subset():
  with open(os.path.join(ROOT, 'scripts', 'gpu_session.sh')) as f:
    script = f.read()
  wheels = re.search(r'^KERNEL_WHEELS="([^"]+)"', script, re.M).group(1)
  assert set(wheels.split()) == {'ml_collections', 'tensorboardx',
                                 'importlib_resources'}
  # tokamax's, pinned; not its profiler xprof (22 MB: scripts/tokamax_peer.py
  # stubs the one name tokamax imports from it).
  tokamax = re.search(r'^TOKAMAX_WHEELS="([^"]+)"', script, re.M).group(1)
  specs = dict(s.split('==') for s in tokamax.split())
  assert all(specs.values()) and 'tokamax' in specs and 'xprof' not in specs
  assert 'WHL_DIR=.whl/kernel bash scripts/gpu_session.sh kernel' in script
  assert 'carry: [".whl"]' not in script
