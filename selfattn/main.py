"""Command-line entry point: flags in, train_and_evaluate out.

  python -m selfattn.main --config=configs/default.py --workdir=runs/default \
      [--config.model.position=shaw ...]

The config file is loaded once, here, before absl parses the flags (so a
missing file, a syntax error or a misspelled override is one line, not a
traceback from inside flag parsing; the checks are training/cli_checks.py);
absl then applies the --config.* overrides to that config.

Multi-host: pass --coordinator_address, --num_processes and --process_id (or
--distributed on a managed cluster, where JAX finds them itself).
"""

import sys

import jax
from absl import app
from absl import flags
from ml_collections import config_flags

from selfattn.training.cli_checks import config_from_argv
from selfattn.training.cli_checks import parse_flags
from selfattn.training.cli_checks import workdir_problem
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


def main(argv):
  del argv      # parse_flags refused anything that is not a flag
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
  config, rest, problem = config_from_argv(argv[1:])
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
  app.run(main, argv=_define_config(sys.argv), flags_parser=parse_flags)
