"""A command-line parser for list-valued config fields.

Kept apart from selfattn.main, which defines absl flags at import: tests and
other entry points can use the parser without registering main's flags.
"""

import ast

from absl import flags


class ListParser(flags.ArgumentParser):
  """List fields from the command line: '--config.eval.lengths=[8,16,32]' or
  '--config.eval.lengths=8,16,32' (ml_collections has no list parser)."""

  def parse(self, argument):
    if isinstance(argument, list):
      return argument
    text = argument.strip()
    if not text.startswith('['):
      text = f'[{text}]'
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      raise ValueError(f'{argument!r} is not a list such as [8,16,32]') from None
    if not isinstance(value, list):
      raise ValueError(f'{argument!r} is not a list such as [8,16,32]')
    return value

  def flag_type(self) -> str:
    return 'list'
