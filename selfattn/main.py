"""Command-line entry point: flags in, train_and_evaluate out.

  python -m selfattn.main --config=configs/default.py --workdir=runs/default \
      [--config.model.position=shaw ...]

The config file is loaded once, here, before absl parses the flags (so a
missing file, a syntax error or a misspelled override is one line, not a
traceback from inside flag parsing); absl then applies the --config.*
overrides to that config.

Multi-host: pass --coordinator_address, --num_processes and --process_id (or
--distributed on a managed cluster, where JAX finds them itself).
"""

import ast
import os
import sys

import jax
from absl import app
from absl import flags
from ml_collections import config_flags

from selfattn.training.list_flag import ListParser
from selfattn.training.log_setup import configure_logging

config_flags.register_flag_parser_for_type(list, ListParser())

# --config: defined in __main__ once its file is loaded (_define_config).
_CONFIG = None
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints, '
                               'TensorBoard events and summary.json.')
_COORDINATOR = flags.DEFINE_string(
    'coordinator_address', None, 'host:port of process 0 (multi-host runs).')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None,
                                      'Number of processes (multi-host runs).')
_PROCESS_ID = flags.DEFINE_integer('process_id', None,
                                   'Index of this process (multi-host runs).')
_DISTRIBUTED = flags.DEFINE_bool(
    'distributed', False, 'Call jax.distributed.initialize() with no arguments '
    '(TPU pods, SLURM and other managed clusters).')
flags.mark_flags_as_required(['workdir'])


def config_argument(argv: list[str]) -> tuple[str | None, list[str]]:
  """(the --config value, argv without it): `--config=PATH[:ARG]` or
  `--config PATH[:ARG]` (absl takes both); the last one wins."""
  spec, rest, i = None, [], 0
  while i < len(argv):
    arg = argv[i]
    if arg.startswith('--config='):
      spec = arg.split('=', 1)[1]
    elif arg == '--config' and i + 1 < len(argv):
      spec = argv[i + 1]
      i += 1
    else:
      rest.append(arg)
    i += 1
  return spec, rest


def config_file_problem(spec: str) -> str | None:
  """What is wrong with the --config file, checked before it is run."""
  path = spec.split(':', 1)[0]
  if not os.path.isfile(path):
    return f'--config={path}: no such file'
  try:
    with open(path) as f:
      tree = ast.parse(f.read(), filename=path)
  except SyntaxError as e:
    return f'--config={path}: syntax error on line {e.lineno}: {e.msg}'
  if not any(isinstance(node, ast.FunctionDef) and node.name == 'get_config'
             for node in tree.body):
    return f'--config={path}: defines no get_config() function'
  return None


def _load_config(spec: str):
  """Runs the config file's get_config(arg) as absl will, outside absl, so a
  failure is one line rather than a traceback from inside flag parsing.
  Returns (config, None) or (None, problem)."""
  path, _, arg = spec.partition(':')
  import importlib.util
  sys.path.insert(0, os.getcwd())      # config files import `configs.*`
  try:
    module_spec = importlib.util.spec_from_file_location('_selfattn_config',
                                                         path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    config = module.get_config(arg) if arg else module.get_config()
  except Exception as e:  # noqa: BLE001 - any failure of user code, one line
    return None, (f'--config={spec}: get_config raised '
                  f'{type(e).__name__}: {_one_line(e)}')
  finally:
    sys.path.pop(0)
  return config, None


def _one_line(error: BaseException) -> str:
  text = error.args[0] if len(error.args) == 1 and isinstance(
      error.args[0], str) else str(error)
  return ' '.join(str(text).split())


def override_problem(argv: list[str], config) -> str | None:
  """A `--config.a.b=value` (or `--config.a.b value`) naming a field or
  section the config does not have, said in one line with the fields that
  exist there (absl would raise a KeyError or AttributeError traceback from
  inside flag parsing)."""
  for arg in argv:
    if not arg.startswith('--config.'):
      continue
    dotted = arg[len('--config.'):].split('=', 1)[0]
    node, walked = config, 'config'
    for name in dotted.split('.'):
      fields = list(node.keys()) if hasattr(node, 'keys') else None
      if fields is None:
        return (f'--config.{dotted}: {walked} is a value, not a section')
      if name not in fields:
        import difflib
        close = difflib.get_close_matches(name, fields, n=1)
        hint = f'; did you mean {walked}.{close[0]}?' if close else ''
        return (f'--config.{dotted}: {walked} has no field {name!r}{hint} '
                f'(its fields: {", ".join(sorted(fields))})')
      node, walked = node[name], f'{walked}.{name}'
  return None


def workdir_problem(workdir: str) -> str | None:
  """A workdir that cannot hold a run, said in one line."""
  if not workdir:
    return '--workdir is empty'
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    return f'--workdir={workdir} is a file, not a directory'
  parent = workdir
  while not os.path.exists(parent):
    parent = os.path.dirname(os.path.abspath(parent))
  if not os.access(parent, os.W_OK | os.X_OK):
    return f'--workdir={workdir}: {parent} is not writable'
  return None


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  problem = workdir_problem(_WORKDIR.value)
  if problem:
    print(f'error: {problem}', file=sys.stderr)
    sys.exit(2)
  configure_logging()
  if _COORDINATOR.value is not None:
    jax.distributed.initialize(coordinator_address=_COORDINATOR.value,
                               num_processes=_NUM_PROCESSES.value,
                               process_id=_PROCESS_ID.value)
  elif _DISTRIBUTED.value:
    jax.distributed.initialize()
  from selfattn.training.exits import train_reporting_errors
  status = train_reporting_errors(_CONFIG.value, _WORKDIR.value)
  if status:
    sys.exit(status)


def _define_config(argv: list[str]) -> list[str]:
  """Loads the --config file once and defines the `config` flag holding it
  (absl applies the --config.* overrides); returns argv without --config.
  Exits with one line when the file or an override is wrong."""
  global _CONFIG
  spec, rest = config_argument(argv[1:])
  problem = None
  if spec is None:
    problem = '--config is required (e.g. --config=configs/default.py)'
  else:
    problem = config_file_problem(spec)
  config = None
  if problem is None:
    config, problem = _load_config(spec)
  if problem is None:
    problem = override_problem(rest, config)
  if problem:
    print(f'error: {problem}', file=sys.stderr)
    sys.exit(2)
  # The flag reads its --config.* overrides from sys.argv when defined, and
  # would wait for a --config value if it saw one there.
  sys.argv = argv[:1] + rest
  _CONFIG = config_flags.DEFINE_config_dict('config', config,
                                            lock_config=True)
  return sys.argv


if __name__ == '__main__':
  app.run(main, argv=_define_config(sys.argv))
