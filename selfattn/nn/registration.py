"""The checks shared by the registries a researcher extends from outside
the package (nn.positions.register_position, tasks.register_task), in the
library's layer so that the tasks can use it too; imports nothing of selfattn."""

from __future__ import annotations

from typing import Any, Collection


def check_entry(what: str, name: str, options: dict[str, Any],
                built_in: Collection[str], reserved: Collection[str]) -> None:
  """ValueError, with the reason, for an entry named like one of selfattn's
  own (`built_in`), a name that is not a Python identifier (it is a config
  value and part of a study's run names), or an option that is not one or
  is `reserved` (a keyword the option would be passed beside, or a config
  field it would overwrite). `what`: 'position encoding' or 'task'."""
  if name in built_in:
    raise ValueError(f'{what} {name!r} is one of selfattn\'s own; choose '
                     f'another name')
  if not isinstance(name, str) or not name.isidentifier():
    raise ValueError(f'{what} name {name!r} must be a Python identifier (it '
                     f'is a config value and part of run names)')
  for option in options:
    if not isinstance(option, str) or not option.isidentifier():
      raise ValueError(f'option {option!r} of {what} {name!r} must be a '
                       f'Python identifier (it becomes a config field)')
    if option in reserved:
      raise ValueError(f'option {option!r} of {what} {name!r} is taken by '
                       f'a config field or argument of that name; choose '
                       f'another')
