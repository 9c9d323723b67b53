"""The 15 tasks of the length-generalization suite (Deletang et al. 2023;
Ruoss et al. 2023), as their reference code computes them.

The reference code (google-deepmind/randomized_positional_encodings, tasks/)
produced the published numbers, so where its docstrings disagree with it the
code is followed; each such place is marked "reference docstring differs".
Token ids are the reference's (the argmax of its one-hot inputs and outputs);
`length` is the reference's length argument: what it counts differs by task
(see `input_length` / `output_length` of each spec, and docs/training.md's task table).

Nine tasks are generated in JAX. Six need integers of up to `length` bits or a
recursive grammar (binary_addition, binary_multiplication, compute_sqrt,
modular_arithmetic_brackets, solve_equation, and stack_manipulation's stack);
they run on the host through `jax.pure_callback`, seeded from the example's
JAX key, so they stay a pure function of (seed, step, example index, length).
"""

from __future__ import annotations

import math
import random

import jax
import jax.numpy as jnp
import numpy as np

from selfattn.tasks.synthetic.order import _reverse
from selfattn.tasks.synthetic.order import _sort
from selfattn.tasks.spec import Example
from selfattn.tasks.spec import TaskSpec

MODULUS = 5
END = 2     # end-of-output token of stack_manipulation and the binary tasks
# How a vmapped batch reaches the host samplers: 'expand_dims' sends the whole
# batch in one callback; 'sequential' (one callback per example) is the peer
# scripts/host_tasks_speed.py measures it against. Read when tracing.
HOST_VMAP_METHOD = 'expand_dims'


def _bits(key, max_length):
  return jax.random.randint(key, (max_length,), 0, 2, dtype=jnp.int32)


def _classification(fn):
  """A JAX task with one label: fn(key, length, N) -> (inputs (N,), n_in, label)."""
  def make_sampler(V, options):
    def sample(key, length, max_length):
      x, n, label = fn(key, length, max_length)
      return Example(x, n, jnp.asarray(label, jnp.int32)[None], jnp.int32(1),
                     jnp.ones((1,), bool))
    return sample
  return make_sampler


# --------------------------------------------------------------------------
# Regular.
# --------------------------------------------------------------------------

@_classification
def _even_pairs(key, length, N):
  # Label 1 when the number of unequal adjacent pairs is ODD (= first symbol
  # differs from the last). Reference docstring differs: it says "even".
  x = _bits(key, N)
  i = jnp.arange(N - 1)
  unequal = (x[:-1] != x[1:]) & (i < length - 1)
  return x, length, jnp.sum(unequal) % 2


@_classification
def _parity_check(key, length, N):
  x = _bits(key, N)
  return x, length, jnp.sum((x == 1) & (jnp.arange(N) < length)) % 2


@_classification
def _cycle_navigation(key, length, N):
  # 0 = step left, 1 = stay, 2 = step right, on a cycle of 5 starting at 0.
  x = jax.random.randint(key, (N,), 0, 3, dtype=jnp.int32)
  moves = jnp.where(jnp.arange(N) < length, x - 1, 0)
  return x, length, jnp.mod(jnp.sum(moves), MODULUS)


def _odd_down(length):
  # modular_arithmetic: an even length loses one token (d op d ... op d).
  return length - 1 + length % 2


@_classification
def _modular_arithmetic(key, length, N):
  """Digits 0-4 at even positions, operators 5 '+', 6 '-', 7 '*' at odd ones;
  value with * before + and -, in int32 as the reference (which wraps past
  2^31), then mod 5."""
  key_d, key_o = jax.random.split(key)
  n = _odd_down(length)
  digits = jax.random.randint(key_d, (N,), 0, MODULUS, dtype=jnp.int32)
  ops = jax.random.randint(key_o, (N,), MODULUS, MODULUS + 3, dtype=jnp.int32)
  i = jnp.arange(N)
  x = jnp.where(i % 2 == 0, digits, ops)

  def step(carry, t):
    total, term = carry
    op, digit = x[2 * t - 1], x[2 * t]
    active = 2 * t < n
    times = op == MODULUS + 2
    new_total = jnp.where(times, total, total + term)
    new_term = jnp.where(times, term * digit,
                         jnp.where(op == MODULUS + 1, -digit, digit))
    return (jnp.where(active, new_total, total),
            jnp.where(active, new_term, term)), None

  (total, term), _ = jax.lax.scan(step, (jnp.int32(0), x[0]),
                                  jnp.arange(1, (N + 1) // 2))
  return x, n, jnp.mod(total + term, MODULUS)


# --------------------------------------------------------------------------
# Context-sensitive (JAX).
# --------------------------------------------------------------------------

def _sequence(fn, output_length):
  """A JAX token task: fn(key, length, N) -> (inputs (N,), outputs (M,))."""
  def make_sampler(V, options):
    def sample(key, length, max_length):
      x, y = fn(key, length, max_length)
      m = output_length(length)
      return Example(x, length, y, m, jnp.ones(y.shape, bool))
    return sample
  return make_sampler


def _duplicate(key, length, N):
  x = _bits(key, N)
  j = jnp.arange(2 * N)
  return x, x[jnp.mod(j, jnp.maximum(length, 1))]


def _odds_first(key, length, N):
  # Symbols at 0-based odd indices first, then at even ones:
  # concat(x[1::2], x[0::2]). Reference docstring differs: it puts the
  # 1-based odd positions (0-based even) first.
  x = _bits(key, N)
  j = jnp.arange(N)
  half = length // 2
  source = jnp.where(j < half, 2 * j + 1, 2 * (j - half))
  return x, x[jnp.clip(source, 0, N - 1)]


@_classification
def _missing_duplicate(key, length, N):
  """`length` counts every input token: s has length // 2 symbols, the input
  is ss with one symbol replaced by 2, then a 3 when length is odd; the label
  is the replaced symbol. Length 1 is the reference's fixed input [1], label 1."""
  key_s, key_m = jax.random.split(key)
  half = length // 2
  s = _bits(key_s, max(N // 2, 1))
  i = jnp.arange(N)
  doubled = s[jnp.clip(jnp.mod(i, jnp.maximum(half, 1)), 0, s.shape[0] - 1)]
  hidden = jax.random.randint(key_m, (), 0, jnp.maximum(2 * half, 1))
  label = doubled[hidden]
  x = jnp.where(i == hidden, 2, doubled)
  x = jnp.where(i == 2 * half, 3, x)                # pad token, odd lengths
  x = jnp.where(length == 1, jnp.where(i == 0, 1, x), x)
  return x, length, jnp.where(length == 1, 1, label)


# --------------------------------------------------------------------------
# Host tasks: exact integers and grammars.
# --------------------------------------------------------------------------

def _host_rng(key_data: np.ndarray) -> random.Random:
  return random.Random(int.from_bytes(np.asarray(key_data, np.uint32).tobytes(),
                                      'little'))


def _little_endian(n: int) -> list[int]:
  return [int(c) for c in f'{n:b}'[::-1]]


def _two_numbers(rng: random.Random, length: int):
  """binary_addition/multiplication input for length >= 3: n (U[1, L-2] bits,
  value uniform in [1, 2^bits - 1], little-endian, zero-filled), 2, then m
  with the remaining bits."""
  len_n = rng.randint(1, length - 2)
  len_m = length - 1 - len_n
  a, b = rng.randint(1, 2 ** len_n - 1), rng.randint(1, 2 ** len_m - 1)
  bits = (_little_endian(a) + [0] * len_n)[:len_n]
  bits_m = (_little_endian(b) + [0] * len_m)[:len_m]
  return a, b, bits + [END] + bits_m


def _short_number(rng: random.Random, length: int):
  # Lengths 1-2 have no operator: one number in [0, 2^length - 2].
  num = rng.randint(0, 2 ** length - 2)
  return num, (_little_endian(num) + [0] * length)[:length]


def _binary_addition(rng, length):
  """Output: the sum little-endian without high zeros, the end token 2, zeros
  to length + 1. Reference docstring differs (one token shorter)."""
  if length <= 2:
    total, x = _short_number(rng, length)
  else:
    a, b, x = _two_numbers(rng, length)
    total = a + b
  y = _little_endian(total) + [END]
  return x, y + [0] * (length + 1 - len(y))


def _binary_multiplication(rng, length):
  """Output: the product little-endian, 2, zeros to length. Lengths 1-2 give
  [2] and [0, 2] whatever the input (as the reference)."""
  if length <= 2:
    _, x = _short_number(rng, length)
    y = [0] * (length - 1) + [END]
  else:
    a, b, x = _two_numbers(rng, length)
    y = _little_endian(a * b) + [END]
  return x, y + [0] * (length - len(y))


def _compute_sqrt(rng, length):
  """n uniform in [1, 2^length - 1] big-endian on length bits; output isqrt(n)
  big-endian on ceil(length / 2) bits."""
  n = rng.randint(1, 2 ** length - 1)
  width = math.ceil(length / 2)
  return ([int(c) for c in f'{n:b}'.zfill(length)],
          [int(c) for c in f'{math.isqrt(n):b}'.zfill(width)])


def _stack_manipulation(rng, length):
  """A stack of U[1, L-1] bits (bottom to top), then actions 2 POP, 3 PUSH 0,
  4 PUSH 1 (POP on an empty stack does nothing); output the final stack top
  first, 2, zeros to length + 1."""
  size = rng.randint(1, max(length - 1, 1))
  stack = [rng.randint(0, 1) for _ in range(size)]
  actions = [rng.randint(2, 4) for _ in range(length - size)]
  final = list(stack)
  for a in actions:
    if a == 2:
      if final:
        final.pop()
    else:
      final.append(a - 3)
  y = final[::-1] + [END]
  return stack + actions, y + [0] * (length + 1 - len(y))


_BRACKETS = {'+': 5, '-': 6, '*': 7, '(': 8, ')': 9}
_EQUATION = {'+': 5, '-': 6, '(': 7, ')': 8, 'x': 9, '=': 10}


def _expression(rng: random.Random, length: int, mult: bool):
  """A bracketed expression of exactly `length` characters and its value mod 5:
  d, -d, (d), (-d) for lengths 1-4, else (E op E) with the left operand
  U[1, L-4] long."""
  if length <= 4:
    d = rng.randint(0, MODULUS - 1)
    return {1: (str(d), d), 2: (f'-{d}', -d % MODULUS), 3: (f'({d})', d),
            4: (f'(-{d})', -d % MODULUS)}[length]
  left = rng.randint(1, length - 4)
  ls, lv = _expression(rng, left, mult)
  rs, rv = _expression(rng, length - left - 3, mult)
  op = rng.choice('+-*' if mult else '+-')
  value = {'+': lv + rv, '-': lv - rv, '*': lv * rv}[op]
  return f'({ls}{op}{rs})', value % MODULUS


def _encode(text: str, ids: dict[str, int]) -> list[int]:
  return [int(c) if c.isdigit() else ids[c] for c in text]


def _modular_arithmetic_brackets(rng, length):
  text, value = _expression(rng, length, mult=True)
  return _encode(text, _BRACKETS), [value]


def _solve_equation(rng, length):
  """expr(x) = value, expr of length L-2 without '*', one digit replaced by x
  (found from a uniform position scanning right to a digit, as the
  reference); the label is that digit. Lengths < 3: all-0 input, label 0."""
  if length < 3:
    return [0] * length, [0]
  text, value = _expression(rng, length - 2, mult=False)
  at = rng.randrange(len(text))
  while not text[at].isdigit():
    at = (at + 1) % len(text)
  digit = int(text[at])
  return _encode(text[:at] + 'x' + text[at + 1:] + f'={value}', _EQUATION), [digit]


def _host(fn, input_length, output_length, masked=False):
  """A task sampled on the host by fn(random.Random, length) -> (x, y).

  masked: the accuracy mask of stack_manipulation and the binary tasks,
  every output position up to and including the end token 2.
  """
  def make_sampler(V, options):
    def sample(key, length, max_length):
      N, M = input_length(max_length), output_length(max_length)

      def one(key_data, length):
        x, y = fn(_host_rng(key_data), int(length))
        inputs = np.zeros(N, np.int32)
        inputs[:len(x)] = x
        outputs = np.zeros(M, np.int32)
        outputs[:len(y)] = y
        mask = np.arange(M) < len(y)
        if masked:
          mask &= np.arange(M) <= y.index(END)
        return (inputs, np.int32(len(x)), outputs, np.int32(len(y)), mask)

      def host(key_data, length):
        # Under vmap ('expand_dims') a whole batch arrives in one call, with
        # any leading axes (size 1 where an argument is not batched): one
        # host round trip per batch instead of per example, whose round trips
        # cost far more than the sampling (scripts/host_tasks_speed.py). Each
        # example still draws from its own key: the same data either way.
        key_data, length = np.asarray(key_data), np.asarray(length)
        lead = np.broadcast_shapes(key_data.shape[:-1], length.shape)
        keys = np.broadcast_to(key_data, lead + key_data.shape[-1:])
        keys = keys.reshape(-1, key_data.shape[-1])
        lengths = np.broadcast_to(length, lead).reshape(-1)
        examples = [one(k, n) for k, n in zip(keys, lengths)]
        return tuple(np.stack(field).reshape(lead + field[0].shape)
                     for field in zip(*examples))

      shapes = (jax.ShapeDtypeStruct((N,), jnp.int32),
                jax.ShapeDtypeStruct((), jnp.int32),
                jax.ShapeDtypeStruct((M,), jnp.int32),
                jax.ShapeDtypeStruct((), jnp.int32),
                jax.ShapeDtypeStruct((M,), jnp.bool_))
      return Example(*jax.pure_callback(
          host, shapes, jax.random.key_data(key), length,
          vmap_method=HOST_VMAP_METHOD))
    return sample
  return make_sampler


def _plus_one(length):
  return length + 1


def _double(length):
  return 2 * length


def _half_up(length):
  return (length + 1) // 2


def _fixed(size):
  return lambda V: size


def _spec(level, description, make_sampler, inputs, outputs, **kw):
  return TaskSpec(description=description, make_sampler=make_sampler,
                  level=level, fixed_vocab=inputs, input_symbols=_fixed(inputs),
                  num_classes=_fixed(outputs), **kw)


CHOMSKY_TASKS: dict[str, TaskSpec] = {
    # Regular.
    'even_pairs': _spec(
        'regular', 'label 1 when the number of 01 and 10 pairs is odd '
        '(first bit != last)', _even_pairs, 2, 2, classification=True,
        chance=lambda V: 0.5),
    'modular_arithmetic': _spec(
        'regular', 'value mod 5 of d op d ... op d (ops + - *, * first)',
        _modular_arithmetic, 9, 5, classification=True,
        input_length=_odd_down),
    'parity_check': _spec(
        'regular', 'parity of the number of 1s', _parity_check, 2, 2,
        classification=True, order_sensitive=False, chance=lambda V: 0.5),
    'cycle_navigation': _spec(
        'regular', 'final position on a 5-cycle after moves -1/0/+1',
        _cycle_navigation, 3, 5, classification=True, order_sensitive=False),
    # Deterministic context-free.
    'stack_manipulation': _spec(
        'dcf', 'the final stack (top first) after push/pop actions',
        _host(_stack_manipulation, lambda n: n, _plus_one, masked=True), 5, 3,
        output_length=_plus_one),
    'reverse_string': _spec(
        'dcf', 'the binary string reversed', _reverse, 2, 2, aligned=True),
    'modular_arithmetic_brackets': _spec(
        'dcf', 'value mod 5 of a bracketed expression (+ - *)',
        _host(_modular_arithmetic_brackets, lambda n: n, lambda n: 1), 11, 5,
        classification=True),
    'solve_equation': _spec(
        'dcf', 'the digit x of a bracketed linear equation mod 5',
        _host(_solve_equation, lambda n: n, lambda n: 1), 11, 5,
        classification=True),
    # Context-sensitive.
    'duplicate_string': _spec(
        'cs', 'the binary string twice (ss)', _sequence(_duplicate, _double),
        2, 2, output_length=_double),
    'missing_duplicate_string': _spec(
        'cs', 'ss with one symbol hidden (2): the hidden symbol',
        _missing_duplicate, 4, 2, classification=True, order_sensitive=False,
        chance=lambda V: 0.5),
    'odds_first': _spec(
        'cs', 'symbols at odd (0-based) indices, then at even ones',
        _sequence(_odds_first, lambda n: n), 2, 2),
    'binary_addition': _spec(
        'cs', 'n + m in binary (little-endian), then 2',
        _host(_binary_addition, lambda n: n, _plus_one, masked=True), 3, 3,
        output_length=_plus_one),
    'binary_multiplication': _spec(
        'cs', 'n * m in binary (little-endian), then 2',
        _host(_binary_multiplication, lambda n: n, lambda n: n, masked=True),
        3, 3),
    'compute_sqrt': _spec(
        'cs', 'floor(sqrt(n)) of a big-endian binary n',
        _host(_compute_sqrt, lambda n: n, _half_up), 2, 2,
        output_length=_half_up),
    'bucket_sort': _spec(
        'cs', 'the string over 5 symbols sorted', _sort, 5, 5, aligned=True),
}
