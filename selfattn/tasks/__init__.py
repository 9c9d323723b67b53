"""Tasks: deterministic batches from (seed, step), laid out for the model.

The interface and the registry (`Task`, `get_task`, `make_batch`, ...) are
in `registry.py` and re-exported here; one subpackage per family:
`synthetic` (selfattn's order tasks, the Chomsky-hierarchy suite, indirect
indexing), `music` (JSB Chorales) and `translation` (Multi30k). `spec.py`
is what a task is before a layout; `data_files.py` finds and checks the
data files that are never part of this repository.

Imports nothing from selfattn.training (tests/test_imports.py).
"""

from selfattn.tasks.registry import DEFAULT_OPTIONS
from selfattn.tasks.registry import LAYOUTS
from selfattn.tasks.registry import SUITE_NAMES
from selfattn.tasks.registry import TASK_NAMES
from selfattn.tasks.registry import TASKS
from selfattn.tasks.registry import TRAIN_STREAM
from selfattn.tasks.registry import Batch
from selfattn.tasks.registry import Task
from selfattn.tasks.registry import example_keys
from selfattn.tasks.registry import get_task
from selfattn.tasks.registry import make_batch
from selfattn.tasks.registry import make_eval_batch
from selfattn.tasks.registry import random_positions
from selfattn.tasks.registry import register_task
