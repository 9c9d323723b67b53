"""Synthetic order-sensitive tasks: selfattn's own (`order`), the
length-generalization suite of Deletang et al. (`chomsky`) and the PoPE
paper's indirect indexing (`indirect_indexing`). Each module defines its
TaskSpecs; tasks/registry.py lists them."""

from selfattn.tasks.synthetic.chomsky import CHOMSKY_TASKS
from selfattn.tasks.synthetic.indirect_indexing import INDIRECT_TASKS
from selfattn.tasks.synthetic.order import ORDER_TASKS
