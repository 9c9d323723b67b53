"""An xdist worker ignores SIGINT once its session is over.

When the controller ends a worker, execnet
(`WorkerGateway._terminate_execution`) sends the worker a SIGINT if its
session has not returned within 5 s. A worker still tearing down (its last
fixtures, JAX freeing thousands of compiled programs) then prints
`Exception ignored in: <function _xla_gc_callback ...> KeyboardInterrupt`
after the run's 100% (issue 50). Every result has been reported by then,
so the signal can only interrupt cleanup: ignored, the worker finishes its
teardown, and execnet's own os._exit ends it 10 s later if it hangs.
"""

import signal

import pytest


def pytest_sessionfinish(session: pytest.Session) -> None:
  # xdist reports "workerfinished" after every sessionfinish hook, so the
  # controller's terminate (and execnet's signal) can only come later.
  if hasattr(session.config, 'workerinput'):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
