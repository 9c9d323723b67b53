"""selfattn.training.software: the stack a run records in its summary."""

import importlib.metadata
import platform

import flax
import jax

from selfattn.training import software


def test_versions_name_the_installed_stack():
  record = software.versions()
  assert record['python'] == platform.python_version()
  assert record['jax'] == jax.__version__
  assert record['flax'] == flax.__version__
  assert record['jaxlib'] == importlib.metadata.version('jaxlib')
  assert set(software.PACKAGES) <= set(record)
  assert record['backend'] == jax.default_backend() == 'cpu'


def test_a_package_that_is_not_installed_reads_none(monkeypatch):
  monkeypatch.setattr(software, 'PACKAGES', ('jax', 'no-such-distribution'))
  record = software.versions()
  assert record['no-such-distribution'] is None and record['jax']
