"""The command line's checks before absl parses a flag: the --config
argument found, its file checked and run, each --config.* override matched
against the config's fields, the workdir checked. Each problem is one line.

Kept apart from selfattn.main, which defines absl flags at import, so that
tests and other entry points can call the checks without registering main's
flags (as list_flag.py is).
"""

import ast
import difflib
import importlib.util
import os
import re
import sys
from typing import Any

from selfattn.training import list_flag


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
  if not any(_defines_get_config(node) for node in tree.body):
    return f'--config={path}: defines no get_config() function'
  return None


def _defines_get_config(node: ast.stmt) -> bool:
  """Whether a top-level statement binds the name get_config: a def, an
  import of it (configs/default.py takes selfattn's) or an assignment."""
  if isinstance(node, ast.FunctionDef):
    return node.name == 'get_config'
  if isinstance(node, (ast.Import, ast.ImportFrom)):
    # `from m import *` may bring it: loading the file says whether it did.
    return any((alias.asname or alias.name) in ('get_config', '*')
               for alias in node.names)
  if isinstance(node, ast.Assign):
    return any(isinstance(t, ast.Name) and t.id == 'get_config'
               for t in node.targets)
  return False


def load_config(spec: str) -> tuple[Any, str | None]:
  """Runs the config file's get_config(arg) as absl will, outside absl, so a
  failure is one line rather than a traceback from inside flag parsing.
  Returns (config, None) or (None, problem)."""
  path, _, arg = spec.partition(':')
  sys.path.insert(0, os.getcwd())      # config files import `configs.*`
  try:
    module_spec = importlib.util.spec_from_file_location('_selfattn_config',
                                                         path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    config = module.get_config(arg) if arg else module.get_config()
  except Exception as e:  # noqa: BLE001 - any failure of user code, one line
    return None, (f'--config={spec}: get_config raised '
                  f'{type(e).__name__}: {one_line(e)}')
  finally:
    sys.path.pop(0)
  return config, None


def one_line(error: BaseException) -> str:
  """The error's message with its whitespace, newlines included, collapsed."""
  text = error.args[0] if len(error.args) == 1 and isinstance(
      error.args[0], str) else str(error)
  return ' '.join(str(text).split())


def override_problem(argv: list[str], config: Any) -> str | None:
  """A `--config.a.b=value` (or `--config.a.b value`) naming a field or
  section the config does not have, said in one line with the fields that
  exist there (absl would raise a KeyError or AttributeError traceback from
  inside flag parsing)."""
  for arg in argv:
    if not arg.startswith('--config.'):
      continue
    dotted = arg[len('--config.'):].split('=', 1)[0]
    node, walked, parent = config, 'config', None
    for name in dotted.split('.'):
      fields = list(node.keys()) if hasattr(node, 'keys') else None
      if fields is None:
        return (f'--config.{dotted}: {walked} is a value, not a section')
      if name not in fields:
        close = difflib.get_close_matches(name, fields, n=1)
        hint = f'; did you mean {walked}.{close[0]}?' if close else ''
        return (f'--config.{dotted}: {walked} has no field {name!r}{hint} '
                f'(its fields: {", ".join(sorted(fields))})')
      parent, node, walked = node, node[name], f'{walked}.{name}'
    if '=' in arg:
      problem = _value_problem(walked, _field_type(parent, name, node),
                               arg.split('=', 1)[1])
      if problem:
        return problem
  return None


def _field_type(parent: Any, name: str, value: Any) -> type:
  """The type a field takes: its value's, or for an unset one (None, an
  ml_collections placeholder) the type it was declared with."""
  if value is None and hasattr(parent, 'get_ref'):
    try:
      return parent.get_ref(name).get_type()
    except (AttributeError, KeyError, TypeError):
      return type(None)
  return type(value)


# What absl's parsers take for a boolean field of a config.
_BOOLEANS = ('true', 't', '1', 'false', 'f', '0')


def _value_problem(field: str, kind: type, text: str) -> str | None:
  """An override whose value cannot become the field's type `kind` (absl
  would print a FATAL flags-parsing error and its help line, exit 1)."""
  if issubclass(kind, bool):
    if text.lower() not in _BOOLEANS:
      return f'--{field}={text}: {field} is True or False; got {text!r}'
  elif issubclass(kind, int):
    try:
      int(text)
    except ValueError:
      return f'--{field}={text}: {field} is an integer; got {text!r}'
  elif issubclass(kind, float):
    try:
      float(text)
    except ValueError:
      return f'--{field}={text}: {field} is a number; got {text!r}'
  elif issubclass(kind, (list, tuple)):
    try:
      list_flag.ListParser().parse(text)
    except ValueError as e:
      return f'--{field}={text}: {e}'
  return None


def config_from_argv(argv: list[str]
                     ) -> tuple[Any, list[str], str | None]:
  """(config, argv without --config, None), or (None, argv without
  --config, problem) when the --config argument, its file or one of the
  --config.* overrides in `argv` (the arguments after the program name) is
  wrong: the checks selfattn.main makes before absl parses a flag."""
  spec, rest = config_argument(argv)
  if spec is None:
    return None, rest, ('--config is required '
                        '(e.g. --config=configs/default.py)')
  problem = config_file_problem(spec)
  if problem:
    return None, rest, problem
  config, problem = load_config(spec)
  if problem is None:
    problem = override_problem(rest, config)
  return (None if problem else config), rest, problem


def workdir_problem(workdir: str) -> str | None:
  """A workdir that cannot hold a run, said in one line."""
  if not workdir:
    return '--workdir is empty'
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    return f'--workdir={workdir} is a file, not a directory'
  parent = workdir
  while not os.path.exists(parent):
    parent = os.path.dirname(os.path.abspath(parent))
  if not os.path.isdir(parent):
    return (f'--workdir={workdir}: {parent} is a file, so no directory can '
            f'be made under it')
  if not os.access(parent, os.W_OK | os.X_OK):
    return f'--workdir={workdir}: {parent} is not writable'
  return None


def parse_flags(argv: list[str], flag_values: Any = None) -> list[str]:
  """absl's flag parsing for `app.run(main, flags_parser=parse_flags)`, with
  its errors (a required flag missing, an unknown flag, a value of the wrong
  type) as one line on stderr, `error: ...`, exit status 2, as every other
  bad input is: absl's own prints a FATAL line and a hint and exits 1. A
  word that is not a flag (`--config.eval.lengths=8 16`) is refused too:
  selfattn's programs take none, and one ignored would change the run.
  flag_values: absl's FlagValues to parse into (default: flags.FLAGS)."""
  from absl import flags
  flag_values = flags.FLAGS if flag_values is None else flag_values
  try:
    rest = flag_values(argv)
  except flags.Error as e:
    print(f'error: {_flag_error(e, flag_values)} (--helpfull lists the flags)',
          file=sys.stderr)
    sys.exit(2)
  problem = stray_arguments_problem(rest)
  if problem:
    print(f'error: {problem}', file=sys.stderr)
    sys.exit(2)
  return rest


def _flag_error(error: Exception, flag_values: Any) -> str:
  """absl's message, except for a required flag left out, which absl words
  as a flag set to None ("flag --workdir=None: Flag --workdir must have a
  value other than None."): that one names the flag and what it is for."""
  match = re.search(r'Flag --(\w+) must have a value other than None',
                    str(error))
  if match and match.group(1) in flag_values:
    name = match.group(1)
    return f'--{name} is required ({flag_values[name].help})'
  return str(error)


def stray_arguments_problem(argv: list[str]) -> str | None:
  """What is wrong with the words absl left in argv (after the program's
  name), in one line; None when there are none."""
  if len(argv) <= 1:
    return None
  return (f'unexpected arguments {" ".join(argv[1:])}: every setting is a '
          f'--name=value flag, and a list has no spaces (8,16)')
