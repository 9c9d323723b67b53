"""Registers and spills of the Triton kernels, compiled on a CPU host: the
Triton IR Pallas lowers them to (for an abstract H100, no GPU needed) is
compiled to PTX by the `triton` package, for sm_90a, at each launch, then
assembled with ptxas -v and disassembled with nvdisasm (kernel_facts.py's
readers).

  python scripts/triton_offline_facts.py \
      --triton_python=/tmp/tritonenv/bin/python [--encodings=none,alibi,t5,shaw]
      [--launches=4:2,8:2] [--block_k=128] [--out=DIR]

--triton_python: an interpreter with the `triton` package (not a dependency
of this project: `python3 -m venv /tmp/tritonenv && /tmp/tritonenv/bin/pip
install triton`); its own ptxas may be older than the PTX it writes, so the
CUDA tools are looked for as kernel_facts.py does, and --cuda_bin puts a
folder first.

What this is not: XLA compiles these kernels with its own Triton and pass
pipeline, so the numbers here are the `triton` package's reading of the
same IR, not the kernels a GPU runs; scripts/kernel_facts.py on a GPU reads
those. It is what a CPU can say about them: which kernels spill, at which
launch.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from scripts import kernel_facts  # noqa: E402
from scripts import kernel_timing as shared  # noqa: E402

TRITON_PYTHON = flags.DEFINE_string('triton_python', None, 'A Python with '
                                    'the triton package.')
LAUNCHES = flags.DEFINE_list('launches', '4:2,8:2', 'num_warps:num_stages '
                             'launches to compile each kernel at.')
BLOCK_K = flags.DEFINE_integer('block_k', 128, 'pallas_attention block_k '
                               '(block_q stays its default).')
CUDA_BIN = flags.DEFINE_string('cuda_bin', None, 'A folder with ptxas and '
                               'nvdisasm to try first.')

# Run by --triton_python: compiles each .ttir in argv[1] at the launch
# argv[2]:argv[3] for sm_90a and writes NAME.ptx beside it.
COMPILE = """
import glob, os, sys
import triton
from triton.backends.compiler import GPUTarget
folder, warps, stages = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for path in sorted(glob.glob(os.path.join(folder, '*.ttir'))):
  kernel = triton.compile(path, target=GPUTarget('cuda', 90, 32),
                          options=dict(num_warps=warps, num_stages=stages))
  with open(path[:-5] + '.ptx', 'w') as f:
    f.write(kernel.asm['ptx'])
print(triton.__version__)
"""


def parse_launches(values: list[str]) -> list[tuple[int, int]]:
  """['4:2', '8:3'] -> [(4, 2), (8, 3)]; app.UsageError for anything else."""
  launches = []
  for value in values:
    try:
      warps, stages = (int(x) for x in value.split(':'))
    except ValueError:
      raise app.UsageError(f'--launches: {value!r} is not '
                           'num_warps:num_stages') from None
    if warps not in (1, 2, 4, 8, 16) or stages < 1:
      raise app.UsageError(f'--launches: {value!r}: num_warps is a power of '
                           'two up to 16, num_stages at least 1')
    launches.append((warps, stages))
  return launches


def capture_ttir(encoding: str, causal: bool, shape, block_k: int
                 ) -> list[tuple[str, str]]:
  """[(kernel name, Triton IR text)] of the training step's Pallas calls
  (forward, dq, dkdv), lowered for 'cuda' on this host."""
  import jax
  import jax.numpy as jnp
  from jax._src.pallas.triton import lowering as triton_lowering

  from selfattn.nn import lowering

  captured = []
  original = triton_lowering.lower_jaxpr_to_triton_module

  def capturing(*args, **kwargs):
    result = original(*args, **kwargs)
    # The caller (Pallas's lowering rule) holds the sanitized kernel name.
    name = inspect.currentframe().f_back.f_locals.get('name', 'kernel')
    captured.append((name, result.module.operation.get_asm()))
    return result

  b, h, length, d = shape
  x = jax.ShapeDtypeStruct((b, h, length, d), jnp.bfloat16)
  step, params = shared.pallas_training_step(
      encoding, h, d, causal=causal, gpu_kernel='triton', block_k=block_k)

  triton_lowering.lower_jaxpr_to_triton_module = capturing
  try:
    lowering.lower(step, x, x, x, params, x, platform='cuda')
  finally:
    triton_lowering.lower_jaxpr_to_triton_module = original
  return captured


def main(argv):
  del argv
  if not TRITON_PYTHON.value:
    raise app.UsageError('--triton_python: a Python with the triton package '
                         '(see this script\'s docstring)')
  kernel_facts.check_names()
  launches = parse_launches(LAUNCHES.value)
  shape = (shared.BATCH.value, shared.HEADS.value, shared.LENGTH.value,
           shared.HEAD_DIM.value)
  tools = {name: ([os.path.join(CUDA_BIN.value, name)]
                  if CUDA_BIN.value else []) + kernel_facts.find_cuda_tools(
                      name) for name in ('ptxas', 'nvdisasm')}
  rows, notes = [], []
  with tempfile.TemporaryDirectory(prefix='triton_facts_') as scratch:
    for causal in shared.causal_settings():
      for encoding in kernel_facts.ENCODING_LIST.value:
        label = kernel_facts.label(encoding, causal)
        kernels = capture_ttir(encoding, causal, shape, BLOCK_K.value)
        for warps, stages in launches:
          folder = os.path.join(scratch, f'{label}_w{warps}s{stages}')
          os.makedirs(folder)
          for n, (name, ir) in enumerate(kernels):
            with open(os.path.join(folder, f'{n}_{name}.ttir'), 'w') as f:
              f.write(ir)
          run = subprocess.run([TRITON_PYTHON.value, '-c', COMPILE, folder,
                                str(warps), str(stages)],
                               capture_output=True, text=True, timeout=1800)
          if run.returncode:
            notes.append(f'{label} {warps}:{stages}: triton failed: '
                         + ' '.join(run.stderr.split())[-300:])
            continue
          triton_version = run.stdout.split()[-1]
          for n, (name, _) in enumerate(kernels):
            with open(os.path.join(folder, f'{n}_{name}.ptx')) as f:
              ptx = f.read()
            facts, sass, error = kernel_facts.assemble(
                ptx, tools['ptxas'], tools['nvdisasm'], folder)
            if error and error not in notes:
              notes.append(error)
            for row in kernel_facts.kernel_rows(ptx, facts, sass):
              rows.append({'family': f'triton {triton_version} {warps}w '
                                     f'{stages}s', 'encoding': label, **row})
          print(f'[triton_offline_facts] {label} at {warps}:{stages}: '
                f'{len(kernels)} kernels', flush=True)
  result = {'device': f'offline sm_90a (lowered for {shape})',
            'jax': __import__('jax').__version__, 'batch': shape[0],
            'heads': shape[1], 'length': shape[2], 'head_dim': shape[3],
            'ptxas': tools['ptxas'][:1],
            'ptxas_version': kernel_facts.tool_version(
                tools['ptxas'][0] if tools['ptxas'] else None),
            'nvdisasm': tools['nvdisasm'][:1], 'children': [], 'rows': rows,
            'notes': notes + [f'block_k {BLOCK_K.value}; compiled by the '
                              'triton package, not XLA\'s Triton']}
  text = kernel_facts.markdown(result)
  print(text)
  if shared.OUT.value:
    os.makedirs(shared.OUT.value, exist_ok=True)
    stem = os.path.join(shared.OUT.value, 'triton_offline_facts')
    with open(stem + '.md', 'w') as f:
      f.write(text)
    with open(stem + '.json', 'w') as f:
      json.dump(result, f, indent=2)


if __name__ == '__main__':
  app.run(main)
