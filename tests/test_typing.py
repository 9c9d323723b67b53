"""Typing for users (issue 25): the package ships py.typed, so a user's
type checker reads its public names and annotations. A README-style user
file must type-check under `mypy --no-implicit-reexport` (what pyright's
standard mode also enforces): every public name listed in `__all__`, and
`TransformerEncoder.__call__` typed by overloads (an array, or a tuple with
return_hidden=True), so `enc(tokens).mean(axis=1)` type-checks.

mypy is pinned in requirements.txt (2.4.1); the test is skipped where it
is not installed (a library-only install)."""

import os
import pathlib
import subprocess
import sys

import pytest

import selfattn

ROOT = pathlib.Path(__file__).resolve().parents[1]

USER_FILE = '''\
from typing import assert_type

import jax
import jax.numpy as jnp
from flax import nnx

from selfattn import MultiHeadAttention, TransformerDecoder, TransformerEncoder
from selfattn import greedy_decode, make_padding_mask

enc = TransformerEncoder(vocab_size=10, num_hiddens=16, ffn_num_hiddens=32,
                         num_heads=2, num_layers=1, position='shaw',
                         clip_distance=8, rngs=nnx.Rngs(0))
tokens = jnp.zeros((2, 12), jnp.int32)
pooled = enc(tokens).mean(axis=1)
assert_type(enc(tokens, valid_lens=jnp.array([12, 7])), jax.Array)
out, hidden = enc(tokens, return_hidden=True)
assert_type(out, jax.Array)
assert_type(hidden, list[jax.Array])
attn = MultiHeadAttention(16, 2, rngs=nnx.Rngs(0))
assert_type(attn(jnp.ones((1, 3, 16))), jax.Array)
mask = make_padding_mask(tokens > 0)
dec = TransformerDecoder(11, 16, 32, 2, 1, rngs=nnx.Rngs(0))
assert_type(dec(tokens), jax.Array)
assert_type(greedy_decode(dec, tokens, 2), jax.Array)
'''


def test_all_lists_every_public_name_and_nothing_missing():
  assert sorted(set(selfattn.__all__)) == sorted(selfattn.__all__)
  for name in selfattn.__all__:
    assert hasattr(selfattn, name), name
  # Every class or function imported into the package is public.
  imported = {name for name, value in vars(selfattn).items()
              if not name.startswith('_') and getattr(
                  value, '__module__', '').startswith('selfattn.')}
  assert imported <= set(selfattn.__all__), imported - set(selfattn.__all__)
  assert 'PolarEncoding' in selfattn.__all__


def test_a_readme_style_user_file_type_checks_with_mypy(tmp_path):
  pytest.importorskip('mypy')
  user = tmp_path / 'user.py'
  user.write_text(USER_FILE)
  # The editable install is an import hook, which mypy cannot follow:
  # point it at the source tree. follow-imports=silent checks the library's
  # annotations as the user sees them without reporting its own internals.
  env = dict(os.environ, MYPYPATH=str(ROOT))
  result = subprocess.run(
      [sys.executable, '-m', 'mypy', '--no-implicit-reexport',
       '--follow-imports=silent', '--cache-dir', str(tmp_path / 'cache'),
       '--python-version', f'{sys.version_info[0]}.{sys.version_info[1]}',
       str(user)],
      capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
  assert result.returncode == 0, result.stdout + result.stderr
  assert 'Success' in result.stdout
