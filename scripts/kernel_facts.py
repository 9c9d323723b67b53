"""What the GPU compiler made of selfattn's attention kernels: registers,
spills and matrix instructions per kernel (issue 47 item 1, the PTX and
SASS facts that explain a row of bench_gpu.py).

  python scripts/kernel_facts.py --out DIR    # on an H100 / H200
  python scripts/kernel_facts.py --smoke      # the CPU dry run

For each kernel family (--kernels: `hopper`, the Mosaic GPU kernels;
`triton`, the Pallas-Triton ones; `hopper_fused`, not by default, the
Mosaic GPU kernels with the one-kernel backward, HopperConfig.fused_dq, for
none, ALiBi and T5) a child process compiles and runs once
the training step bench_gpu.py times (the loss sum(out * g) and its
gradients in q, k, v and the encoding's tables, pallas_attention with that
gpu_kernel) for each --encodings (their position modules at their defaults,
as the tuners use them) at B x H x L x D (default 2 x 16 x 8192 x 64,
bf16), with the PTX dumped: Mosaic GPU writes each module's PTX to the
child's stdout (MOSAIC_GPU_DUMP_PTX), and XLA, which compiles the Triton
kernels, writes its modules' PTX under --xla_dump_to. This process then
assembles each PTX module with ptxas -v (as Mosaic GPU does: --opt-level 3,
the module's own target) and disassembles it with nvdisasm, where it finds
them (find_cuda_tools: JAX's own CUDA root first).

Per kernel whose name has `selfattn` in it (or, where none does, per
kernel with a matrix instruction): registers per thread at launch, spill
stores and loads and the stack frame in bytes (ptxas -v), the register
limits its warpgroups move to at run time (setmaxnreg), the matrix
instructions in
the PTX (wgmma.mma_async: Hopper's warpgroup MMA; mma.sync and wmma.mma:
the warp-level MMA of earlier GPUs) and in the SASS (HGMMA, HMMA), and the
SASS's local-memory loads and stores (LDL, STL: spills and stack arrays).
Static counts: an instruction in a loop counts once.

Outputs under --out: kernel_facts.md and, unless --json=false,
kernel_facts.json (what ran, each kernel's facts and ptxas's own lines, a
failed step's error).
"""

from __future__ import annotations

import collections
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from scripts import interpreter_pools  # noqa: E402
from scripts import kernel_timing as shared  # noqa: E402

# hopper_fused: the Hopper kernels with the one-kernel backward
# (HopperConfig.fused_dq) for the encodings that have it; not a default
# family until TUNED takes it.
KERNELS = ('hopper', 'triton', 'hopper_fused')
DEFAULT_KERNELS = ('hopper', 'triton')
ENCODINGS = ('none', 'alibi', 't5', 'shaw')

# The shape, --out, --smoke, --causal and --time_budget are the tuners'
# flags (scripts/kernel_timing.py).
KERNEL_FAMILIES = flags.DEFINE_list('kernels', ','.join(DEFAULT_KERNELS),
                                    f'Kernel families, of {KERNELS}.')
ENCODING_LIST = flags.DEFINE_list(
    'encodings', 'shaw,t5,alibi,none',
    f'Encodings, of {ENCODINGS}, in the order they compile (the slowest '
    'rows of bench_gpu.py first).')
WRITE_JSON = flags.DEFINE_bool('json', True, 'Also write kernel_facts.json '
                                '(gpu_session.sh kernel leaves it out: a '
                                'call brings back 8 files).')
CHILD = flags.DEFINE_enum('child', None, KERNELS, 'Internal: run as the '
                          'child that compiles this family\'s kernels.')

# The line a child prints before each encoding's step, so that the PTX
# Mosaic GPU writes to the same stdout after it is that encoding's.
MARKER = '=== kernel_facts encoding: '

PTX_MMA = {'wgmma': re.compile(r'\bwgmma\.mma_async\b'),
           'mma.sync': re.compile(r'(?<![\w.])mma\.sync\b'),
           'wmma': re.compile(r'\bwmma\.mma\b')}
SASS_COUNTED = ('HGMMA', 'HMMA', 'LDL', 'STL')
SYSTEM_CUDA = '/usr/local/cuda'


# --------------------------------------------------------------------------
# Reading the compiler's output (tested on recorded output of the real
# tools: tests/experiments/compiler_output).
# --------------------------------------------------------------------------

def split_ptx_modules(text: str) -> list[str]:
  """The PTX modules in `text` (a child's stdout, or a file): each from
  its `.version` line to its last closing brace, so that other output
  between them is left out."""
  lines = text.splitlines()
  starts = [i for i, line in enumerate(lines)
            if line.startswith('.version')]
  modules = []
  for n, start in enumerate(starts):
    end = starts[n + 1] if n + 1 < len(starts) else len(lines)
    body = lines[start:end]
    closing = [i for i, line in enumerate(body) if line.strip() == '}']
    if closing:
      modules.append('\n'.join(body[:closing[-1] + 1]) + '\n')
  return modules


def ptx_target(ptx: str) -> str | None:
  """The module's `.target` (e.g. sm_90a), ptxas's --gpu-name."""
  m = re.search(r'^\.target\s+(sm_\w+)', ptx, re.M)
  return m.group(1) if m else None


def ptx_entries(ptx: str) -> dict[str, dict]:
  """{entry name: {'wgmma', 'mma.sync', 'wmma': static count,
  'setmaxnreg': ['inc 232', 'dec 40', ...]}} for each `.entry` of a PTX
  module (a helper .func after an entry counts with it). setmaxnreg moves
  a warpgroup's register limit at run time, which ptxas -v's count (the
  registers at launch) does not show."""
  entries: dict[str, dict] = {}
  name = None
  for line in ptx.splitlines():
    m = re.match(r'\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+([\w$.]+)', line)
    if m:
      name = m.group(1)
      entries[name] = {**{k: 0 for k in PTX_MMA}, 'setmaxnreg': []}
      continue
    if name is None or line.lstrip().startswith('//'):
      continue
    for key, pattern in PTX_MMA.items():
      entries[name][key] += len(pattern.findall(line))
    m = re.search(r'\bsetmaxnreg\.(inc|dec)\S*\s+(\d+)', line)
    if m:
      entries[name]['setmaxnreg'].append(f'{m.group(1)} {m.group(2)}')
  return entries


def parse_ptxas(text: str) -> dict[str, dict]:
  """ptxas -v's report per function: {name: {'registers', 'spill_stores',
  'spill_loads', 'stack_frame', 'barriers', 'lines'}} (bytes; 'lines':
  ptxas's own lines for that function)."""
  facts: dict[str, dict] = {}
  name = None
  for line in text.splitlines():
    m = re.search(r"(?:Compiling entry function|Function properties for)"
                  r" '?([\w$.]+)'?", line)
    if m:
      name = m.group(1)
      facts.setdefault(name, {'lines': []})
    if name is None:
      continue
    record = facts[name]
    m = re.search(r'(\d+) bytes stack frame, (\d+) bytes spill stores, '
                  r'(\d+) bytes spill loads', line)
    if m:
      record.update(stack_frame=int(m.group(1)),
                    spill_stores=int(m.group(2)),
                    spill_loads=int(m.group(3)))
    m = re.search(r'Used (\d+) registers(?:, used (\d+) barriers)?', line)
    if m:
      record['registers'] = int(m.group(1))
      if m.group(2) is not None:
        record['barriers'] = int(m.group(2))
    if 'ptxas' in line or 'bytes' in line:
      record['lines'].append(line.strip())
  # A warning names its function in quotes: file it there too.
  for line in text.splitlines():
    m = re.search(r"warning.*'([\w$.]+)'", line)
    if m and m.group(1) in facts:
      lines = facts[m.group(1)]['lines']
      if line.strip() not in lines:
        lines.append(line.strip())
  return facts


def sass_functions(sass: str) -> dict[str, tuple[list, dict[str, int]]]:
  """{function: (code, labels)} of nvdisasm's listing: code is its
  instructions as (byte address, opcode, the rest of the line), labels
  each label's address (the instruction after it)."""
  functions: dict[str, tuple[list, dict[str, int]]] = {}
  code: list = []
  labels: dict[str, int] = {}
  pending: list[str] = []
  for line in sass.splitlines():
    m = re.match(r'\.text\.([\w$.]+):', line.strip())
    if m:
      code, labels, pending = [], {}, []
      functions[m.group(1)] = (code, labels)
      continue
    m = re.match(r'\s*(\.L\w+):', line)
    if m:
      pending.append(m.group(1))
      continue
    # /*0070*/   @!P0 HGMMA.64x8x16.F32.BF16 R24, gdesc[UR4], RZ ;
    m = re.match(r'\s*/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)'
                 r'(.*)', line)
    if m and functions:
      addr = int(m.group(1), 16)
      labels.update(dict.fromkeys(pending, addr))
      pending = []
      code.append((addr, m.group(2), m.group(3)))
  return functions


def opcode_counts(opcodes: list[str]) -> dict[str, int]:
  """The static count of each SASS_COUNTED opcode (HGMMA.64x64x16.F32.BF16
  counts as HGMMA; HFMA2.MMA, a plain FMA, counts as nothing)."""
  return {k: opcodes.count(k) for k in SASS_COUNTED}


def sass_counts(sass: str) -> dict[str, dict[str, int]]:
  """{function: {opcode: static count}} of nvdisasm's listing for the
  opcodes in SASS_COUNTED."""
  return {name: opcode_counts([op for _, op, _ in code])
          for name, (code, _) in sass_functions(sass).items()}


def sass_loops(sass: str) -> dict[str, list[dict[str, int]]]:
  """{function: [loop]} of nvdisasm's listing: each backward branch
  closes a loop from its target label to itself, and a loop is
  {'start', 'end' (byte addresses), 'instructions', and the static count of
  each SASS_COUNTED opcode in it}, in address order. Where the spills sit
  matters more than their total: a kernel's loop over its far blocks runs
  tens of times per program, a near-diagonal loop a few. The one-line
  self-branch that ends every kernel is not a loop."""
  loops: dict[str, list[dict[str, int]]] = {}
  for name, (code, labels) in sass_functions(sass).items():
    loops[name] = []
    for addr, op, rest in code:
      target = re.search(r'\(\s*(\.L\w+)\s*\)', rest)
      if op != 'BRA' or not target or labels.get(target.group(1), addr) >= addr:
        continue
      start = labels[target.group(1)]
      body = [o for a, o, _ in code if start <= a <= addr]
      loops[name].append({'start': start, 'end': addr,
                          'instructions': len(body), **opcode_counts(body)})
  return loops


def kernel_rows(ptx: str, ptxas: dict[str, dict],
                sass: dict[str, dict[str, int]]) -> list[dict]:
  """One row per kernel of interest in a PTX module: its name has
  `selfattn` in it, or, where no entry's does (a compiler's own naming),
  it has a matrix instruction."""
  entries = ptx_entries(ptx)
  wanted = [n for n in entries if 'selfattn' in n]
  if not wanted:
    wanted = [n for n, c in entries.items() if any(c.values())]
  rows = []
  for name in wanted:
    facts = ptxas.get(name, {})
    rows.append({'kernel': name,
                 **{k: facts.get(k) for k in ('registers', 'spill_stores',
                                              'spill_loads', 'stack_frame',
                                              'barriers')},
                 'ptx': entries[name],
                 'sass': sass.get(name),
                 'ptxas_lines': facts.get('lines', [])})
  return rows


# --------------------------------------------------------------------------
# The CUDA tools.
# --------------------------------------------------------------------------

def jax_cuda_path() -> str | None:
  """The CUDA root JAX (and so Mosaic GPU, and XLA) compiles with:
  jax._src.lib.cuda_path ($CUDA_ROOT, else the nvidia.cu13 or
  nvidia.cuda_nvcc wheel), None where JAX found none or has no such
  attribute."""
  try:
    from jax._src import lib
  except ImportError:
    return None
  return getattr(lib, 'cuda_path', None)


def find_cuda_tools(name: str) -> list[str]:
  """Every ptxas (or nvdisasm) found, the one JAX compiles with first:
  jax_cuda_path()/bin, $MOSAIC_GPU_CUDA_ROOT/bin, a CUDA wheel on sys.path
  (nvidia/cu13/bin, nvidia/cuda_nvcc/bin, ...), PATH, SYSTEM_CUDA/bin
  (Mosaic GPU's fallback)."""
  candidates = []
  for root in (jax_cuda_path(), os.environ.get('MOSAIC_GPU_CUDA_ROOT')):
    if root:
      candidates.append(os.path.join(root, 'bin', name))
  for entry in sys.path:
    candidates += sorted(glob.glob(os.path.join(entry, 'nvidia', '*', 'bin',
                                                name)))
  on_path = shutil.which(name)
  if on_path:
    candidates.append(on_path)
  candidates.append(os.path.join(SYSTEM_CUDA, 'bin', name))
  found = []
  for path in candidates:
    real = os.path.realpath(path)
    if (os.path.isfile(path) and os.access(path, os.X_OK)
        and real not in map(os.path.realpath, found)):
      found.append(path)
  return found


def assemble(ptx: str, ptxas: list[str], nvdisasm: list[str],
             workdir: str, seconds: float = 300
             ) -> tuple[dict, dict, str | None]:
  """(ptxas -v facts, SASS counts, error) of one PTX module, each tool
  given at most `seconds`. Each ptxas is tried in turn: one older than the
  PTX's ISA refuses it."""
  if not ptxas:
    return {}, {}, 'no ptxas found'
  try:
    return _assemble(ptx, ptxas, nvdisasm, workdir, seconds)
  except subprocess.TimeoutExpired as e:
    return {}, {}, f'{os.path.basename(e.cmd[0])} ran out of time'


def _assemble(ptx, ptxas, nvdisasm, workdir, seconds):
  target = ptx_target(ptx) or 'sm_90a'
  src = os.path.join(workdir, 'module.ptx')
  obj = os.path.join(workdir, 'module.o')
  with open(src, 'w') as f:
    f.write(ptx)
  errors = []
  for tool in ptxas:
    run = subprocess.run([tool, '--opt-level', '3', '--gpu-name', target,
                          '-v', '--output-file', obj, src],
                         capture_output=True, text=True, timeout=seconds)
    if run.returncode == 0:
      break
    errors.append(f'{tool}: {" ".join((run.stderr or run.stdout).split())}'
                  [:300])
  else:
    return {}, {}, 'ptxas failed: ' + '; '.join(errors)
  facts = parse_ptxas(run.stdout + run.stderr)
  if not nvdisasm:
    return facts, {}, 'no nvdisasm found: no SASS counts'
  dis = subprocess.run([nvdisasm[0], '-ndf', '-c', obj], capture_output=True,
                       text=True, timeout=seconds)
  if dis.returncode:
    return facts, {}, f'nvdisasm failed: {dis.stderr[-300:]}'
  loops = sass_loops(dis.stdout)
  counts = {name: {**c, 'loops': loops[name]}
            for name, c in sass_counts(dis.stdout).items()}
  return facts, counts, None


# --------------------------------------------------------------------------
# The child: compile and run each encoding's training step once.
# --------------------------------------------------------------------------

def shape() -> tuple[int, int, int, int]:
  """(B, H, L, D): the flags', or the dry run's 1 x 1 x 128 x 64."""
  if shared.SMOKE.value:
    return 1, 1, 128, 64
  return (shared.BATCH.value, shared.HEADS.value, shared.LENGTH.value,
          shared.HEAD_DIM.value)


def label(encoding: str, causal: bool) -> str:
  """An (encoding, mask) as the markers and XLA's module names carry it."""
  return f'{encoding}_{"causal" if causal else "bidirectional"}'


def child(kind: str) -> None:
  import contextlib

  encodings = ENCODING_LIST.value
  with contextlib.ExitStack() as stack:
    if kind == 'hopper_fused':
      from selfattn.nn import hopper_backward
      # The one-kernel backward; the kinds without it would repeat
      # `hopper`.
      stack.enter_context(hopper_backward.fused_in_tuned())
      encodings = [e for e in encodings if e in hopper_backward.FUSED_KINDS]
    compile_steps(kind, encodings)


def compile_steps(kind: str, encodings: list[str]) -> None:
  """Compiles and runs the training step of each encoding and mask, each
  after its marker line (ptx_by_encoding)."""
  import jax

  smoke = shared.SMOKE.value
  b, h, length, d = shape()
  q, k, v, g = shared.random_inputs(b, h, length, d)
  for causal in shared.causal_settings():
    for encoding in encodings:
      step, params = shared.pallas_training_step(
          encoding, h, d, causal=causal,
          gpu_kernel='hopper' if kind.startswith('hopper') else kind,
          interpret=True if smoke else None)
      # The jitted function's name is in XLA's dump files' names.
      step.__name__ = f'facts_{label(encoding, causal)}'
      print(f'{MARKER}{label(encoding, causal)}', flush=True)
      started = time.perf_counter()
      try:
        value, _ = jax.jit(step)(q, k, v, params, g)
        jax.block_until_ready(value)
        status = f'ran in {time.perf_counter() - started:.1f}s'
      except Exception as e:  # noqa: BLE001  (an encoding, not a stop)
        status = 'failed: ' + shared.short_error(e)
      sys.stdout.flush()
      print(f'[kernel_facts] {kind} {label(encoding, causal)}: {status}',
            file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# The parent.
# --------------------------------------------------------------------------

def ptx_by_encoding(kind: str, stdout: str, dump_dir: str
                    ) -> dict[str, list[str]]:
  """{label: [PTX module]} from a child's output (label: `shaw_causal`,
  `none_bidirectional`, ...): Mosaic GPU's modules follow the label's
  marker in stdout; XLA's files carry the jitted function's name
  (facts_LABEL)."""
  found: dict[str, list[str]] = collections.defaultdict(list)
  if kind.startswith('hopper'):
    for part in stdout.split(MARKER)[1:]:
      name, _, rest = part.partition('\n')
      modules = split_ptx_modules(rest)
      if modules:
        found[name.strip()] += modules
  else:
    for path in sorted(glob.glob(os.path.join(dump_dir, '*.ptx'))):
      m = re.search(r'facts_(\w+?_(?:causal|bidirectional))\b',
                    os.path.basename(path))
      if m:
        with open(path) as f:
          found[m.group(1)] += split_ptx_modules(f.read())
  return dict(found)


def run_child(kind: str, seconds: float | None, scratch: str) -> dict:
  """Runs the child for `kind` (for at most `seconds`, if given): its exit,
  stderr's status lines and the PTX it dumped, by label."""
  dump_dir = os.path.join(scratch, f'xla_{kind}')
  os.makedirs(dump_dir, exist_ok=True)
  # Mosaic GPU's other dumps would interleave with the PTX in stdout, and
  # MOSAIC_GPU_DUMP_TO would send the PTX to files: only the PTX, here.
  env = {k: v for k, v in os.environ.items()
         if not k.startswith('MOSAIC_GPU_DUMP')}
  env['PYTHONUNBUFFERED'] = '1'
  xla_flags = [env.get('XLA_FLAGS', '')]
  if kind.startswith('hopper'):
    env['MOSAIC_GPU_DUMP_PTX'] = '1'
  else:
    xla_flags.append(f'--xla_dump_to={dump_dir}')
  env['XLA_FLAGS'] = ' '.join(filter(None, xla_flags))
  if shared.SMOKE.value:      # the Mosaic GPU interpreter's pools
    env['XLA_FLAGS'] = interpreter_pools.with_pools(env['XLA_FLAGS'])
  argv = [sys.executable, os.path.abspath(__file__), f'--child={kind}',
          f'--encodings={",".join(ENCODING_LIST.value)}',
          f'--causal={",".join(shared.CAUSAL.value)}',
          f'--length={shared.LENGTH.value}', f'--batch={shared.BATCH.value}',
          f'--heads={shared.HEADS.value}',
          f'--head_dim={shared.HEAD_DIM.value}',
          f'--smoke={shared.SMOKE.value}']
  out_path = os.path.join(scratch, f'{kind}.stdout')
  err_path = os.path.join(scratch, f'{kind}.stderr')
  started = time.perf_counter()
  with open(out_path, 'w') as out, open(err_path, 'w') as err:
    try:
      code = subprocess.run(argv, stdout=out, stderr=err, env=env, cwd=ROOT,
                            timeout=seconds).returncode
    except subprocess.TimeoutExpired:
      code = 'stopped at its time share'
  with open(out_path) as f:
    stdout = f.read()
  with open(err_path) as f:
    errors = f.read()
  return {'kind': kind, 'exit': code,
          'seconds': round(time.perf_counter() - started, 1),
          'status': [line for line in errors.splitlines()
                     if line.startswith('[kernel_facts]')],
          'stderr_tail': '' if code == 0 else errors[-1500:],
          # What XLA dumped of the steps, should no PTX be among it.
          'dumped': sorted(f for f in os.listdir(dump_dir)
                           if 'facts_' in f)[:12],
          'ptx': ptx_by_encoding(kind, stdout, dump_dir)}


def markdown(result: dict) -> str:
  cell = lambda x: '' if x is None else str(x)
  lines = [f'# kernel_facts on {result["device"]}, JAX {result["jax"]}, '
           f'B={result["batch"]} H={result["heads"]} L={result["length"]} '
           f'D={result["head_dim"]}, bf16', '',
           f'ptxas: {", ".join(result["ptxas"]) or "none"} '
           f'({result.get("ptxas_version") or "version not read"}); '
           f'nvdisasm: {", ".join(result["nvdisasm"]) or "none"}', '',
           'Registers: per thread at launch (ptxas -v); setmaxnreg: the '
           'limits warpgroups move to at run time (PTX). SASS loops: each '
           'loop\'s static instruction count (its LDL/STL), in address order; '
           'a loop over the far blocks runs tens of times a program, one '
           'over the near-diagonal blocks a few.', '',
           '| family | encoding | kernel | registers | setmaxnreg | '
           'spill stores (B) | spill loads (B) | stack (B) | PTX wgmma | '
           'PTX mma.sync/wmma | SASS HGMMA | SASS HMMA | SASS LDL/STL | '
           'SASS loops: instructions (LDL/STL) |',
           '|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|']
  for r in result['rows']:
    sass = r.get('sass') or {}
    ptx = r['ptx']
    local = f'{sass["LDL"]}/{sass["STL"]}' if sass else ''
    loops = ', '.join(f'{x["instructions"]} ({x["LDL"]}/{x["STL"]})'
                      for x in sass.get('loops', []))
    lines.append(
        f'| {r["family"]} | {r["encoding"]} | {r["kernel"]} | '
        f'{cell(r["registers"])} | {", ".join(ptx["setmaxnreg"])} | '
        f'{cell(r["spill_stores"])} | '
        f'{cell(r["spill_loads"])} | {cell(r["stack_frame"])} | '
        f'{ptx["wgmma"]} | {ptx["mma.sync"] + ptx["wmma"]} | '
        f'{cell(sass.get("HGMMA"))} | {cell(sass.get("HMMA"))} | {local} | '
        f'{loops} |')
  lines += ['', 'Children:', '']
  for c in result['children']:
    lines.append(f'- {c["kind"]}: exit {c["exit"]} after {c["seconds"]}s; '
                 + '; '.join(c['status']))
  lines += [f'- {note}' for note in result['notes']]
  warnings = [w for r in result['rows'] for w in r['ptxas_lines']
              if 'warning' in w.lower()]
  if warnings:
    lines += ['', 'ptxas warnings:', '']
    lines += [f'- {w}' for w in dict.fromkeys(warnings)]
  return '\n'.join(lines) + '\n'


def check_names() -> None:
  """app.UsageError for a --kernels or --encodings name not known."""
  for name, values, valid in (('kernels', KERNEL_FAMILIES.value, KERNELS),
                              ('encodings', ENCODING_LIST.value, ENCODINGS)):
    bad = [x for x in values if x not in valid]
    if bad or not values:
      raise app.UsageError(f'--{name}: {bad or values}; valid: '
                           f'{", ".join(valid)}')
  shared.causal_settings()


def tool_version(tool: str | None) -> str | None:
  """The last line of `tool --version` (e.g. ptxas's build), or None."""
  if tool is None:
    return None
  try:
    out = subprocess.run([tool, '--version'], capture_output=True,
                         text=True, timeout=30).stdout.strip()
  except (OSError, subprocess.TimeoutExpired):
    return None
  return out.splitlines()[-1] if out else None


def save(result: dict) -> str:
  """kernel_facts.md (and .json) under --out, rewritten after each family
  and on an interrupt, so a time limit keeps what was read; the table."""
  text = markdown(result)
  if shared.OUT.value:
    os.makedirs(shared.OUT.value, exist_ok=True)
    if WRITE_JSON.value:
      with open(os.path.join(shared.OUT.value, 'kernel_facts.json'),
                'w') as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(shared.OUT.value, 'kernel_facts.md'), 'w') as f:
      f.write(text)
  return text


def read_family(kind: str, result: dict, scratch: str, deadline: float | None,
                ptxas: list[str], nvdisasm: list[str], share: float) -> None:
  """Runs `kind`'s child within `share` of the time to `deadline` (None:
  no limit), then reads its kernels into result['rows']."""
  import jax
  seconds = (None if deadline is None
             else share * (deadline - time.perf_counter()))
  if seconds is not None and seconds <= 1:
    result['notes'].append(f'{kind}: not run (no time left)')
    return
  ran = run_child(kind, seconds, scratch)
  print(f'[kernel_facts] {kind}: exit {ran["exit"]} after '
        f'{ran["seconds"]}s', flush=True)
  print('\n'.join(ran['status']), flush=True)
  modules = ran.pop('ptx')
  ran['modules'] = {name: len(m) for name, m in modules.items()}
  result['children'].append(ran)
  for name, ptx_modules in modules.items():
    for ptx in ptx_modules:
      left = None if deadline is None else deadline - time.perf_counter()
      if left is not None and left <= 1:
        result['notes'].append(f'{kind} {name}: a module not assembled '
                               f'(no time left)')
        continue
      facts, sass, error = assemble(ptx, ptxas, nvdisasm, scratch,
                                    seconds=300 if left is None
                                    else min(300, left))
      if error and error not in result['notes']:
        result['notes'].append(error)
      for row in kernel_rows(ptx, facts, sass):
        result['rows'].append({'family': kind, 'encoding': name, **row})
  if not modules:
    result['notes'].append(
        f'{kind}: no PTX dumped (backend {jax.default_backend()}; '
        f'XLA\'s dump of the steps: {", ".join(ran["dumped"]) or "none"})')


def main(argv):
  del argv
  check_names()
  if CHILD.value:
    child(CHILD.value)
    return
  import jax
  started = time.perf_counter()
  budget = shared.BUDGET.value
  deadline = started + budget if budget else None
  b, h, length, d = shape()
  ptxas, nvdisasm = find_cuda_tools('ptxas'), find_cuda_tools('nvdisasm')
  result = {'device': jax.devices()[0].device_kind, 'jax': jax.__version__,
            'batch': b, 'heads': h, 'length': length, 'head_dim': d,
            'smoke': shared.SMOKE.value, 'ptxas': ptxas,
            'ptxas_version': tool_version(ptxas[0] if ptxas else None),
            'nvdisasm': nvdisasm, 'children': [], 'rows': [], 'notes': []}
  families = KERNEL_FAMILIES.value
  try:
    with tempfile.TemporaryDirectory(prefix='kernel_facts_') as scratch:
      for n, kind in enumerate(families):
        # Each family gets its share of what is left, of which its child
        # may take 80%; ptxas and nvdisasm take the rest.
        read_family(kind, result, scratch, deadline, ptxas, nvdisasm,
                    share=0.8 / (len(families) - n))
        save(result)
  except KeyboardInterrupt:
    result['notes'].append('interrupted: the table holds what was read')
    save(result)
    raise
  print(save(result))


if __name__ == '__main__':
  app.run(main)
