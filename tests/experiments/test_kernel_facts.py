"""scripts/kernel_facts.py reads the CUDA compiler's own output: checked on
what ptxas -v and nvdisasm printed for three small sm_90a kernels
(compiler_output/, made as its README.md says), against counts taken by
hand from those files: tile_mma's 4 wmma.mma.sync become 8 HMMA.16816,
tile_wgmma's 4 wgmma.mma_async 4 HGMMA, and `pressure` spills under a
32-register cap. CI has no ptxas: the tools' runs are the fixture."""

import os
import subprocess

import pytest

from scripts import kernel_facts

HERE = os.path.join(os.path.dirname(__file__), 'compiler_output')


def _read(name):
  with open(os.path.join(HERE, name)) as f:
    return f.read()


PTX, PTXAS, SASS = (_read('mma_kernels.ptx'), _read('mma_kernels.ptxas.txt'),
                    _read('mma_kernels.sass'))


def test_ptxas_report_per_kernel():
  facts = kernel_facts.parse_ptxas(PTXAS)
  assert set(facts) == {'tile_mma', 'pressure', 'tile_wgmma'}
  got = {n: {k: f[k] for k in ('registers', 'barriers', 'stack_frame',
                               'spill_stores', 'spill_loads')}
         for n, f in facts.items()}
  assert got == {
      'tile_wgmma': dict(registers=30, barriers=0, stack_frame=0,
                         spill_stores=0, spill_loads=0),
      'pressure': dict(registers=32, barriers=0, stack_frame=192,
                       spill_stores=128, spill_loads=132),
      'tile_mma': dict(registers=32, barriers=0, stack_frame=0,
                       spill_stores=0, spill_loads=0)}
  # ptxas's own lines are kept, each with the function it belongs to.
  assert any('128 bytes spill stores' in line
             for line in facts['pressure']['lines'])
  assert not any('spill stores' in line and not line.startswith('0 bytes')
                 for line in facts['tile_mma']['lines'])


def test_ptx_matrix_instructions_per_entry():
  entries = kernel_facts.ptx_entries(PTX)
  assert entries == {
      'tile_mma': {'wgmma': 0, 'mma.sync': 0, 'wmma': 4, 'setmaxnreg': []},
      'pressure': {'wgmma': 0, 'mma.sync': 0, 'wmma': 0, 'setmaxnreg': []},
      'tile_wgmma': {'wgmma': 4, 'mma.sync': 0, 'wmma': 0,
                     'setmaxnreg': []}}
  assert kernel_facts.ptx_target(PTX) == 'sm_90a'


def test_sass_counts_matrix_and_local_memory_instructions():
  counts = kernel_facts.sass_counts(SASS)
  assert counts['tile_wgmma']['HGMMA'] == 4
  assert counts['tile_mma']['HMMA'] == 8
  # HFMA2.MMA (an FMA on the MMA pipe) is not a matrix instruction.
  assert 'HFMA2.MMA' in SASS and counts['pressure']['HMMA'] == 0
  # The spills and the indexed array live in local memory.
  assert counts['pressure']['STL'] > 0 and counts['pressure']['LDL'] > 0
  assert counts['tile_mma']['STL'] == counts['tile_mma']['LDL'] == 0


def _renamed(ptx, suffix):
  """The fixture's module with every kernel renamed: another module."""
  for name in ('tile_mma', 'pressure', 'tile_wgmma'):
    ptx = ptx.replace(name, f'{name}_{suffix}')
  return ptx


def test_modules_are_cut_out_of_interleaved_output():
  """A child's stdout holds each Mosaic GPU module's PTX between the
  markers and other output: each module is cut out whole and attributed
  to the label whose marker precedes it (two modules under one marker
  here, as a forward and a backward are), and what follows a module's
  last brace (here ptxas's report) is left out."""
  forward, backward, other = (_renamed(PTX, x) for x in ('fwd', 'bwd', 'x'))
  stdout = (f'{kernel_facts.MARKER}shaw_causal\nsome log line\n{forward}'
            f'{PTXAS}{backward}\n{kernel_facts.MARKER}none_bidirectional\n'
            f'{other}\nSASS follows\n}}\n'
            f'{kernel_facts.MARKER}t5_causal\nno PTX for this one\n')
  found = kernel_facts.ptx_by_encoding('hopper', stdout, dump_dir='')
  assert set(found) == {'shaw_causal', 'none_bidirectional'}
  entries = lambda modules: [sorted(kernel_facts.ptx_entries(m))
                             for m in modules]
  assert entries(found['shaw_causal']) == entries([forward, backward])
  assert entries(found['none_bidirectional']) == entries([other])
  for module in found['shaw_causal'] + found['none_bidirectional']:
    assert module.startswith('.version')
    assert 'ptxas info' not in module and 'log line' not in module
  # Output after the last brace but before the next marker that itself
  # ends in a lone brace is the one case glued on; the child's
  # environment keeps Mosaic GPU's other dumps out (test below).
  assert 'SASS follows' in found['none_bidirectional'][0]


@pytest.fixture
def default_flags():
  from absl import flags
  flags.FLAGS(['kernel_facts'])
  yield
  flags.FLAGS.unparse_flags()


def test_the_child_gets_mosaic_gpus_ptx_dump_alone(tmp_path, monkeypatch,
                                                   default_flags):
  """Other MOSAIC_GPU_DUMP_* settings inherited by the child would
  interleave MLIR with the PTX in its stdout, or send the PTX to files."""
  seen = {}

  def fake_run(argv, stdout, stderr, env, cwd, timeout):
    seen.clear()
    seen.update(env)
    return subprocess.CompletedProcess(argv, 0)

  monkeypatch.setattr(kernel_facts.subprocess, 'run', fake_run)
  monkeypatch.setenv('MOSAIC_GPU_DUMP_TO', '/somewhere')
  monkeypatch.setenv('MOSAIC_GPU_DUMP_MLIR_PASSES', '1')
  ran = kernel_facts.run_child('hopper', 10.0, str(tmp_path))
  assert seen['MOSAIC_GPU_DUMP_PTX'] == '1'
  assert not {k for k in seen if k.startswith('MOSAIC_GPU_DUMP')} - {
      'MOSAIC_GPU_DUMP_PTX'}
  assert ran['exit'] == 0 and ran['ptx'] == {}
  kernel_facts.run_child('triton', 10.0, str(tmp_path))
  assert '--xla_dump_to=' + str(tmp_path / 'xla_triton') in seen['XLA_FLAGS']
  assert 'MOSAIC_GPU_DUMP_PTX' not in seen


def test_xla_dump_files_are_attributed_by_the_jitted_name(tmp_path):
  # XLA's names: module_NNNN.<module name>.ptx, or .<shard>.ptx when it
  # compiles a module in parts.
  (tmp_path / 'module_0007.jit_facts_t5_causal.ptx').write_text(PTX)
  (tmp_path / 'module_0009.jit_facts_shaw_bidirectional.0.ptx').write_text(
      _renamed(PTX, 'a'))
  (tmp_path / 'module_0009.jit_facts_shaw_bidirectional.1.ptx').write_text(
      _renamed(PTX, 'b'))
  (tmp_path / 'module_0003.jit_other.ptx').write_text(PTX)
  (tmp_path / 'module_0007.jit_facts_t5_causal.before_optimizations.txt'
   ).write_text('HloModule')
  found = kernel_facts.ptx_by_encoding('triton', '', str(tmp_path))
  assert sorted(found) == ['shaw_bidirectional', 't5_causal']
  assert len(found['t5_causal']) == 1 and len(found['shaw_bidirectional']) == 2
  assert {n for m in found['shaw_bidirectional']
          for n in kernel_facts.ptx_entries(m)} >= {'tile_mma_a', 'tile_mma_b'}


def test_register_limits_moved_at_run_time_are_read_from_the_ptx():
  """The Hopper kernels' warpgroups move their register limits
  (setmaxnreg), which ptxas -v's count at launch does not show."""
  body = ('.version 8.0\n.target sm_90a\n.visible .entry selfattn_k(\n)\n{\n'
          '\tsetmaxnreg.dec.sync.aligned.u32 40;\n'
          '\tsetmaxnreg.inc.sync.aligned.u32 232;\n}\n')
  assert kernel_facts.ptx_entries(body)['selfattn_k']['setmaxnreg'] == [
      'dec 40', 'inc 232']
  assert kernel_facts.ptx_entries(PTX)['tile_wgmma']['setmaxnreg'] == []


def test_a_predicated_instruction_counts_as_its_opcode():
  sass = ('.text.k:\n'
          '        /*0010*/              @!P0 LDL.LU R2, [R1+0x4] ;\n'
          '        /*0020*/              @UP1 HGMMA.64x8x16.F32.BF16 R24, '
          'gdesc[UR4], RZ ;\n'
          '        /*0030*/                   HFMA2.MMA R3, -RZ, RZ, 0 ;\n')
  assert kernel_facts.sass_counts(sass) == {
      'k': {'HGMMA': 1, 'HMMA': 0, 'LDL': 1, 'STL': 0}}


def test_rows_keep_selfattn_kernels_else_those_with_matrix_instructions():
  facts = kernel_facts.parse_ptxas(PTXAS)
  sass = kernel_facts.sass_counts(SASS)
  rows = kernel_facts.kernel_rows(PTX, facts, sass)
  # No selfattn name in this module: the kernels with an MMA are kept.
  assert [r['kernel'] for r in rows] == ['tile_mma', 'tile_wgmma']
  assert rows[1]['registers'] == 30 and rows[1]['sass']['HGMMA'] == 4
  renamed = PTX.replace('pressure', 'selfattn_flash_dkdv')
  facts = kernel_facts.parse_ptxas(PTXAS.replace('pressure',
                                                 'selfattn_flash_dkdv'))
  rows = kernel_facts.kernel_rows(renamed, facts, {})
  assert [(r['kernel'], r['spill_stores']) for r in rows] == [
      ('selfattn_flash_dkdv', 128)]


def test_markdown_table_row():
  row = {'family': 'hopper', 'encoding': 'shaw_bidirectional',
         **kernel_facts.kernel_rows(PTX, kernel_facts.parse_ptxas(PTXAS),
                                    kernel_facts.sass_counts(SASS))[1]}
  result = {'device': 'NVIDIA H200', 'jax': '0.11.2', 'batch': 2,
            'heads': 16, 'length': 8192, 'head_dim': 64,
            'ptxas': ['/x/ptxas'], 'nvdisasm': [], 'rows': [row],
            'children': [{'kind': 'hopper', 'exit': 0, 'seconds': 1.0,
                          'status': []}], 'notes': []}
  text = kernel_facts.markdown(result)
  assert ('| hopper | shaw_bidirectional | tile_wgmma | 30 |  | 0 | 0 | 0 | 4 '
          '| 0 | 4 | 0 | 0/0 |') in text


def test_tools_are_found_in_a_cuda_wheel_and_on_path(tmp_path, monkeypatch):
  wheel = tmp_path / 'site' / 'nvidia' / 'cu13' / 'bin' / 'ptxas'
  on_path = tmp_path / 'bin' / 'ptxas'
  for tool in (wheel, on_path):
    tool.parent.mkdir(parents=True)
    tool.write_text('#!/bin/sh\n')
  monkeypatch.delenv('MOSAIC_GPU_CUDA_ROOT', raising=False)
  monkeypatch.setattr(kernel_facts, 'jax_cuda_path', lambda: None)
  monkeypatch.setattr('sys.path', [str(tmp_path / 'site')])
  monkeypatch.setenv('PATH', str(tmp_path / 'bin'))
  monkeypatch.setattr(kernel_facts, 'SYSTEM_CUDA', str(tmp_path / 'cuda'))
  assert kernel_facts.find_cuda_tools('ptxas') == []      # not executable
  on_path.chmod(0o755)
  wheel.chmod(0o755)
  # The wheel's first, as Mosaic GPU looks for its CUDA root.
  assert kernel_facts.find_cuda_tools('ptxas') == [str(wheel), str(on_path)]
  assert kernel_facts.find_cuda_tools('nvdisasm') == []


def test_a_ptxas_that_refuses_the_module_gives_way_to_the_next(tmp_path):
  """An older ptxas refuses a newer PTX ISA (as CUDA 13.0's refused this
  fixture's 9.5): the next one found assembles it. Fakes stand in for
  both: they print what a real ptxas printed."""
  old = tmp_path / 'old_ptxas'
  old.write_text("#!/bin/sh\necho \"fatal   : Unsupported .version 9.5\" >&2"
                 "\nexit 255\n")
  new = tmp_path / 'new_ptxas'
  report = os.path.join(HERE, 'mma_kernels.ptxas.txt')
  new.write_text(f'#!/bin/sh\ncat {report}\n')
  for tool in (old, new):
    tool.chmod(0o755)
  facts, sass, error = kernel_facts.assemble(PTX, [str(old), str(new)], [],
                                             str(tmp_path))
  assert facts['pressure']['spill_stores'] == 128 and sass == {}
  assert error == 'no nvdisasm found: no SASS counts'
  facts, _, error = kernel_facts.assemble(PTX, [str(old)], [], str(tmp_path))
  assert facts == {} and 'Unsupported .version 9.5' in error


@pytest.mark.parametrize('flag', ['--kernels=cuda', '--encodings=rope',
                                  '--causal=maybe'])
def test_unknown_names_are_refused_by_flag(flag):
  from absl import app
  from absl import flags
  argv = ['kernel_facts', flag]
  flags.FLAGS(argv)
  try:
    with pytest.raises(app.UsageError,
                       match=flag.replace('=', r": \W*") + r".*(valid|give)"):
      kernel_facts.main(argv)
  finally:
    flags.FLAGS.unparse_flags()


def test_an_interrupt_keeps_what_was_read(tmp_path, monkeypatch):
  """gpu_session.sh stops the script with SIGINT at its time limit: the
  table written then holds the families read before it."""
  from absl import flags
  row = {'family': 'hopper', 'encoding': 'shaw_bidirectional',
         **kernel_facts.kernel_rows(PTX, kernel_facts.parse_ptxas(PTXAS),
                                    {})[1]}

  def fake_read(kind, result, *args, **kwargs):
    if kind == 'triton':
      raise KeyboardInterrupt
    result['rows'].append(row)

  monkeypatch.setattr(kernel_facts, 'read_family', fake_read)
  flags.FLAGS(['kernel_facts', f'--out={tmp_path}', '--json=false'])
  try:
    with pytest.raises(KeyboardInterrupt):
      kernel_facts.main(['kernel_facts'])
  finally:
    flags.FLAGS.unparse_flags()
  text = (tmp_path / 'kernel_facts.md').read_text()
  assert '| hopper | shaw_bidirectional | tile_wgmma | 30 |' in text
  assert 'interrupted: the table holds what was read' in text
  assert not (tmp_path / 'kernel_facts.json').exists()


def test_sass_loops_place_the_spills_in_the_loop_that_has_them():
  """`pressure`'s loop over i (its 32 accumulators spill at 32 registers)
  holds its LDL/STL; the unrolled loops of the other two kernels and the
  self-branch that ends each kernel are no loops."""
  loops = kernel_facts.sass_loops(SASS)
  assert loops['tile_mma'] == [] and loops['tile_wgmma'] == []
  (loop,) = loops['pressure']
  assert loop['LDL'] >= 32 and loop['STL'] >= 32 and loop['HGMMA'] == 0
  assert loop['start'] < loop['end'] and loop['instructions'] > 32
  assert loop['LDL'] <= kernel_facts.sass_counts(SASS)['pressure']['LDL']


def test_sass_loops_by_function_and_backward_branches_only():
  """Addresses restart in each function; a forward branch closes nothing;
  a loop's counts are of its own body."""
  sass = (
      '.text.a:\n'
      '        /*0000*/                   MOV R1, c[0x0][0x28] ;\n'
      '.L_x_0:\n'
      '        /*0010*/                   LDL R2, [R1] ;\n'
      '        /*0020*/                   HGMMA.64x8x16.F32.BF16 R24, gdesc[UR4], RZ ;\n'
      '        /*0030*/              @P0 BRA `(.L_x_0) ;\n'
      '        /*0040*/                   BRA `(.L_x_1) ;\n'
      '.L_x_1:\n'
      '        /*0050*/                   EXIT ;\n'
      '.L_x_2:\n'
      '        /*0060*/                   BRA `(.L_x_2);\n'
      '.text.b:\n'
      '        /*0000*/                   STL [R1], R2 ;\n'
      '.L_x_3:\n'
      '        /*0010*/                   STL [R1], R3 ;\n'
      '        /*0020*/                   NOP ;\n'
      '        /*0030*/             @!P1 BRA `(.L_x_3) ;\n')
  loops = kernel_facts.sass_loops(sass)
  assert loops['a'] == [{'start': 0x10, 'end': 0x30, 'instructions': 3,
                         'HGMMA': 1, 'HMMA': 0, 'LDL': 1, 'STL': 0}]
  assert loops['b'] == [{'start': 0x10, 'end': 0x30, 'instructions': 3,
                         'HGMMA': 0, 'HMMA': 0, 'LDL': 0, 'STL': 1}]


def test_markdown_lists_each_loop():
  row = {'family': 'triton', 'encoding': 't5_bidirectional',
         **kernel_facts.kernel_rows(PTX, kernel_facts.parse_ptxas(PTXAS),
                                    kernel_facts.sass_counts(SASS))[1]}
  row['sass'] = {**row['sass'], 'loops': [
      {'start': 0, 'end': 16, 'instructions': 967, 'HGMMA': 24, 'HMMA': 0,
       'LDL': 0, 'STL': 0},
      {'start': 32, 'end': 64, 'instructions': 1808, 'HGMMA': 24, 'HMMA': 0,
       'LDL': 3, 'STL': 2}]}
  result = {'device': 'offline', 'jax': '0.12', 'batch': 2, 'heads': 16,
            'length': 8192, 'head_dim': 64, 'ptxas': [], 'nvdisasm': [],
            'rows': [row], 'children': [], 'notes': []}
  assert '| 0/0 | 967 (0/0), 1808 (3/2) |' in kernel_facts.markdown(result)
