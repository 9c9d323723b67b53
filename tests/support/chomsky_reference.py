"""NumPy-only transcription of the DeepMind length-generalization benchmark.

Independent re-statement (written from reading the public reference code, not
copied) of what the reference computes, for use as a test oracle:

  * google-deepmind/randomized_positional_encodings  (the newer repository,
    Ruoss et al. 2023; called "RPE" below; commit 57bc5d01 as stored)
  * google-deepmind/neural_networks_chomsky_hierarchy (the older repository,
    Deletang et al. 2023; called "NNCH" below)

Where the two differ, RPE is followed and the difference is noted.  Where a
docstring and the code disagree, the CODE is followed.

Contents
  1. per-task `output_<task>(x)`: target ids computed from input ids alone
  2. `TASK_FACTS`, `accuracy_mask_<task>(target)`
  3. per-task `sample_<task>(rng, length)`: draws like the reference sampler
  4. model pieces: sinusoids, ALiBi (plain and randomized), Transformer-XL
     relative logits (plain and randomized), rotary, random positions
  5. the model-input layout (`reference_layout`) and accuracy
  6. the scoring (`score`)

Token ids are the argmax of the reference one-hot vectors.  Only numpy and
the standard library are used.  Run `python tests/support/chomsky_reference.py` for a
self-check (it checks output functions against this file's own samplers and a
few internal identities; it is not a test of selfattn).
"""

import math
import random as _pyrandom

import numpy as np


MODULUS = 5  # RPE experiments/constants.py: modulus=5 for all modular tasks.


def _ids(x):
  x = np.asarray(x)
  if x.ndim != 1:
    raise ValueError(f'expected a 1-D array of token ids, got shape {x.shape}')
  return x.astype(np.int64)


def _wrap_int32(v):
  """Two's-complement int32 wrap of a Python int (JAX default int is int32)."""
  return ((int(v) + 2**31) % 2**32) - 2**31


# =============================================================================
# 1. Output functions (target computed from the input alone)
# =============================================================================

# ---------------------------------------------------------------- regular ---


def output_even_pairs(x):
  """Label of even_pairs: 1 iff the number of unequal adjacent pairs is ODD.

  reference: randomized_positional_encodings/tasks/regular/even_pairs.py
  Input ids {0, 1}; output ids {0, 1}.  (The module docstring says "whether the
  number of 01's and 10's is even", but the code outputs
  sum(xor(x[:-1], x[1:])) % 2, i.e. 1 when the count is odd.  This equals
  int(x[0] != x[-1]).)  Length-1 input -> 0.
  """
  x = _ids(x)
  return np.array([int(np.sum(x[:-1] != x[1:]) % 2)], dtype=np.int64)


def output_parity_check(x):
  """Label of parity_check: (number of 1s) % 2.

  reference: randomized_positional_encodings/tasks/regular/parity_check.py
  """
  x = _ids(x)
  return np.array([int(np.sum(x) % 2)], dtype=np.int64)


def output_cycle_navigation(x):
  """Label of cycle_navigation: sum(token - 1) mod 5.

  reference: randomized_positional_encodings/tasks/regular/cycle_navigation.py
  Token ids: 0 = move LEFT (-1), 1 = STAY (0), 2 = move RIGHT (+1).  (The
  docstring talks about actions 0/1/-1; the code samples ids 0..2 and uses
  id - 1.)  Start at state 0, cycle length 5, result in 0..4.
  """
  x = _ids(x)
  return np.array([int(np.sum(x - 1)) % 5], dtype=np.int64)


def output_modular_arithmetic(x, modulus=MODULUS, int32_wrap=True):
  """Value of a flat modular expression `d op d op ... d` (no brackets).

  reference: randomized_positional_encodings/tasks/regular/modular_arithmetic.py
  Ids: 0..4 digits, 5 '+', 6 '-', 7 '*', 8 '_' (blank; never sampled).
  Usual precedence: '*' binds tighter than '+'/'-'; 'a - b * c' = a - (b*c).
  The reference evaluates in JAX int32: each product term and the final sum
  wrap modulo 2**32 before `% modulus` (Python-style, non-negative).  With
  int32_wrap=True this wrap is reproduced exactly; it only matters for a run
  of ~16+ nonzero factors joined by '*' (practically never).
  A blank is replaced by '+' at an operator (odd) position and by 0 at a
  number (even) position, as the reference does.
  """
  e = [int(t) for t in _ids(x)]
  if len(e) % 2 != 1:
    raise ValueError('modular_arithmetic inputs always have odd length')
  plus, minus, times, blank = modulus, modulus + 1, modulus + 2, modulus + 3
  e = [(plus if i % 2 else 0) if t == blank else t for i, t in enumerate(e)]
  terms, cur = [], e[0]
  for i in range(1, len(e), 2):
    op, num = e[i], e[i + 1]
    if op == plus:
      terms.append(cur)
      cur = num
    elif op == minus:
      terms.append(cur)
      cur = -num
    elif op == times:
      cur = cur * num
    else:
      raise ValueError(f'bad operator id {op} at {i}')
  terms.append(cur)
  if int32_wrap:
    total = _wrap_int32(sum(_wrap_int32(t) for t in terms))
  else:
    total = sum(terms)
  return np.array([total % modulus], dtype=np.int64)


# -------------------------------------------------------------------- dcf ---

STACK_POP, STACK_PUSH0, STACK_PUSH1, STACK_END = 2, 3, 4, 2


def output_stack_manipulation(x):
  """Final stack, top first, then termination 2, then 0-padding.

  reference: randomized_positional_encodings/tasks/dcf/stack_manipulation.py
  Input ids: 0/1 = initial stack symbols (given bottom-to-top, a prefix of
  the input), 2 = POP (ignored on an empty stack), 3 = PUSH 0, 4 = PUSH 1.
  Output ids: 0/1 stack symbols, 2 = termination; length len(x) + 1.
  Length-1 inputs are a single stack symbol and no action.
  """
  x = [int(t) for t in _ids(x)]
  n_stack = 0
  while n_stack < len(x) and x[n_stack] in (0, 1):
    n_stack += 1
  stack = list(x[:n_stack])
  for a in x[n_stack:]:
    if a == STACK_POP:
      if stack:
        stack.pop()
    elif a in (STACK_PUSH0, STACK_PUSH1):
      stack.append(a - 3)
    else:
      raise ValueError(f'stack symbol {a} after the first action')
  out = stack[::-1] + [STACK_END]
  out += [0] * (len(x) + 1 - len(out))
  return np.array(out, dtype=np.int64)


def output_reverse_string(x):
  """reverse_string: x[::-1] (binary, vocab 2).

  reference: randomized_positional_encodings/tasks/dcf/reverse_string.py
  (samples like duplicate_string with vocab_size=2, output = flip(input)).
  """
  return _ids(x)[::-1].copy()


# Token ids of modular_arithmetic_brackets (RPE tasks/dcf/modular_arithmetic_brackets.py)
MAB_IDS = {'+': MODULUS, '-': MODULUS + 1, '*': MODULUS + 2, '(': MODULUS + 3,
           ')': MODULUS + 4, 'x': MODULUS + 5, '=': MODULUS + 6}
# Token ids of solve_equation (RPE tasks/dcf/solve_equation.py) -- DIFFERENT
# from the brackets task: no '*', so '(' is 7 here but 8 there.
SE_IDS = {'+': MODULUS, '-': MODULUS + 1, '(': MODULUS + 2, ')': MODULUS + 3,
          'x': MODULUS + 4, '=': MODULUS + 5}


def _parse_bracket_expression(toks, ids, modulus, x_value=None):
  """Evaluates a full token list of the reference bracket grammar.

  Grammar produced by generate_one_expression_and_result (lengths 1..4 are
  'd', '-d', '(d)', '(-d)'; length >= 5 is '(' E op E ')').  A unary '-' is
  only ever followed by a digit.  Returns an exact Python int (reduce later).
  """
  digit_of = {}
  for d in range(modulus):
    digit_of[d] = d

  def term(i):
    t = toks[i]
    if x_value is not None and t == ids['x']:
      return x_value, i + 1
    if t in digit_of:
      return digit_of[t], i + 1
    if t == ids['-']:
      v, j = term(i + 1)
      return -v, j
    if t == ids['(']:
      left, j = term(i + 1)
      if toks[j] == ids[')']:
        return left, j + 1
      op = toks[j]
      right, k = term(j + 1)
      if toks[k] != ids[')']:
        raise ValueError(f'expected ) at {k}')
      if op == ids['+']:
        return left + right, k + 1
      if op == ids['-']:
        return left - right, k + 1
      if '*' in ids and op == ids['*']:
        return left * right, k + 1
      raise ValueError(f'bad operator id {op} at {j}')
    raise ValueError(f'unexpected id {t} at {i}')

  value, end = term(0)
  if end != len(toks):
    raise ValueError(f'trailing tokens after position {end}')
  return value


def output_modular_arithmetic_brackets(x, modulus=MODULUS):
  """Value mod 5 of a bracketed expression with +, -, * (mult=True).

  reference: randomized_positional_encodings/tasks/dcf/modular_arithmetic_brackets.py
  and experiments/constants.py (modulus=5, mult=True).
  Ids: 0..4 digits, 5 '+', 6 '-', 7 '*', 8 '(', 9 ')'  (10 'x', 11 '=' exist in
  the alphabet but never occur; input_size is 11).
  """
  toks = [int(t) for t in _ids(x)]
  v = _parse_bracket_expression(toks, MAB_IDS, modulus)
  return np.array([v % modulus], dtype=np.int64)


def output_solve_equation(x, modulus=MODULUS):
  """The digit replaced by 'x' in `expr(x) = value` (all mod 5, no '*').

  reference: randomized_positional_encodings/tasks/dcf/solve_equation.py
  Ids: 0..4 digits, 5 '+', 6 '-', 7 '(', 8 ')', 9 'x', 10 '='.  The input is
  expr + '=' + one digit (the value); expr has length len(x) - 2 and contains
  exactly one 'x'.  Without '*', x has coefficient +-1 so the solution is
  unique.  For len(x) < 3 the reference emits all-zero inputs (id 0) and
  label 0; this function returns 0 for those.
  """
  toks = [int(t) for t in _ids(x)]
  if len(toks) < 3:
    return np.array([0], dtype=np.int64)
  if toks[-2] != SE_IDS['='] or toks.count(SE_IDS['x']) != 1:
    raise ValueError('not a solve_equation input')
  target = toks[-1]
  expr = toks[:-2]
  sols = [c for c in range(modulus)
          if _parse_bracket_expression(expr, SE_IDS, modulus, x_value=c)
          % modulus == target]
  if len(sols) != 1:
    raise ValueError(f'expected a unique solution, got {sols}')
  return np.array(sols, dtype=np.int64)


# --------------------------------------------------------------------- cs ---


def output_duplicate_string(x):
  """duplicate_string: concat(x, x) (binary, vocab 2).

  reference: randomized_positional_encodings/tasks/cs/duplicate_string.py
  """
  x = _ids(x)
  return np.concatenate([x, x])


def output_missing_duplicate_string(x):
  """The bit hidden by token 2 in `s s` (+ pad 3 when the length is odd).

  reference: randomized_positional_encodings/tasks/cs/missing_duplicate_string.py
  Input ids: 0/1 bits, 2 = the missing symbol, 3 = pad (one, at the end, iff
  the length n is odd).  |s| = n // 2.  Special case n == 1: input [1],
  output 1 (fixed by the reference).
  """
  x = [int(t) for t in _ids(x)]
  n = len(x)
  if n == 1:
    return np.array([1], dtype=np.int64)
  m = n // 2
  body = x[:2 * m]
  if n % 2 == 1 and x[-1] != 3:
    raise ValueError('odd-length input must end with pad 3')
  idx = body.index(2)
  partner = idx + m if idx < m else idx - m
  return np.array([body[partner]], dtype=np.int64)


def output_odds_first(x):
  """odds_first as CODED: concat(x[1::2], x[0::2]) (0-based odd indices first).

  reference: randomized_positional_encodings/tasks/cs/odds_first.py
  The docstring/example ("s_1 s_3 s_5 ... s_2 s_4", "00110101 -> 0100 0111")
  describe concat(x[0::2], x[1::2]); the code does the opposite.
  """
  x = _ids(x)
  return np.concatenate([x[1::2], x[0::2]])


def _little_endian_bits(n):
  """Bits of n, least significant first, no trailing zeros; 0 -> [0]."""
  return [int(c) for c in f'{n:b}'[::-1]]


def _from_little_endian(bits):
  return sum(int(b) << i for i, b in enumerate(bits))


def output_binary_addition(x):
  """Little-endian sum + termination 2 + zero padding to len(x) + 1.

  reference: randomized_positional_encodings/tasks/cs/binary_addition.py
  Input ids: 0/1 bits (little-endian, numbers may have high zero bits),
  2 = '+'.  For len(x) <= 2 the reference samples ONE number with no '+'
  (len 1: always [0]; len 2: 0, 1 or 2) and the output is that number.
  Output ids: 0/1, 2 = end.  The sum has no high zero bits (0 -> [0]).
  """
  x = [int(t) for t in _ids(x)]
  if 2 in x:
    p = x.index(2)
    total = _from_little_endian(x[:p]) + _from_little_endian(x[p + 1:])
  else:
    total = _from_little_endian(x)
  res = _little_endian_bits(total)
  out = res + [2] + [0] * (len(x) - len(res))
  return np.array(out, dtype=np.int64)


def output_binary_multiplication(x):
  """Little-endian product + termination 2 + zero padding to len(x).

  reference: randomized_positional_encodings/tasks/cs/binary_multiplication.py
  Output length == input length (NOT +1 as in binary_addition).  For
  len(x) <= 2 the reference ignores the input: output is [2] (len 1) or
  [0, 2] (len 2).
  """
  x = [int(t) for t in _ids(x)]
  if len(x) <= 2:
    return np.array([0] * (len(x) - 1) + [2], dtype=np.int64)
  p = x.index(2)
  prod = _from_little_endian(x[:p]) * _from_little_endian(x[p + 1:])
  res = _little_endian_bits(prod)
  out = res + [2] + [0] * (len(x) - 1 - len(res))
  return np.array(out, dtype=np.int64)


def output_compute_sqrt(x):
  """floor(sqrt(n)) in BIG-endian, zero-padded to ceil(len(x) / 2) bits.

  reference: randomized_positional_encodings/tasks/cs/compute_sqrt.py
  Input: n (>= 1) in big-endian with exactly len(x) bits (leading zeros).
  """
  x = [int(t) for t in _ids(x)]
  n = int(''.join(map(str, x)), 2)
  width = math.ceil(len(x) / 2)
  s = f'{math.isqrt(n):b}'.zfill(width)
  return np.array([int(c) for c in s], dtype=np.int64)


def output_bucket_sort(x):
  """bucket_sort: sorted(x), alphabet 0..4.

  reference: randomized_positional_encodings/tasks/cs/bucket_sort.py
  """
  return np.sort(_ids(x))


# =============================================================================
# 2. Accuracy masks and task facts
# =============================================================================


def accuracy_mask_termination(target):
  """Mask keeping positions up to AND INCLUDING the first termination token.

  reference: accuracy_mask of tasks/cs/binary_addition.py,
  tasks/cs/binary_multiplication.py, tasks/dcf/stack_manipulation.py.
  The reference takes argmax over the target ids (first occurrence of the
  largest id, which is the termination id 2 since it is always present) and
  keeps indices <= that position.  `target`: target ids, (T,) or (B, T)
  (take argmax first if you hold one-hot targets).
  """
  target = np.asarray(target)
  idx = np.argmax(target, axis=-1)
  return np.arange(target.shape[-1]) <= np.expand_dims(idx, -1)


accuracy_mask_binary_addition = accuracy_mask_termination
accuracy_mask_binary_multiplication = accuracy_mask_termination
accuracy_mask_stack_manipulation = accuracy_mask_termination


def accuracy_mask_all(target):
  """Default mask of the reference base class: all positions count.

  reference: randomized_positional_encodings/tasks/task.py accuracy_mask
  """
  target = np.asarray(target)
  return np.ones(target.shape, dtype=bool)


def _odd_down(length):
  return length if length % 2 == 1 else length - 1


TASK_FACTS = {
    'even_pairs': dict(
        level='regular', input_size=2, output_size=2,
        input_length=lambda n: n, output_length=lambda n: 1,
        classification=True, chance=0.5,
        alphabet='in: 0,1 bits; out: 0 = even number of unequal pairs, '
                 '1 = odd (label == x[0] != x[-1])',
        accuracy_mask=None),
    'modular_arithmetic': dict(
        level='regular', input_size=9, output_size=5,
        input_length=_odd_down, output_length=lambda n: 1,
        classification=True, chance=0.2,
        alphabet="in: 0-4 digits, 5:'+', 6:'-', 7:'*', 8:'_' blank (never "
                 "sampled); operators drawn uniformly from {+,*,-}; even "
                 "`length` is reduced by one; out: 0-4",
        accuracy_mask=None),
    'parity_check': dict(
        level='regular', input_size=2, output_size=2,
        input_length=lambda n: n, output_length=lambda n: 1,
        classification=True, chance=0.5,
        alphabet='in: 0,1; out: number of 1s mod 2', accuracy_mask=None),
    'cycle_navigation': dict(
        level='regular', input_size=3, output_size=5,
        input_length=lambda n: n, output_length=lambda n: 1,
        classification=True, chance=0.2,
        alphabet='in: 0 = left (-1), 1 = stay, 2 = right (+1); out: 0-4 final '
                 'state (start 0, cycle of 5)',
        accuracy_mask=None),
    'stack_manipulation': dict(
        level='dcf', input_size=5, output_size=3,
        input_length=lambda n: n, output_length=lambda n: n + 1,
        classification=False, chance=None,
        alphabet='in: 0,1 initial stack (bottom->top, prefix of length '
                 'U[1, n-1]), 2 POP, 3 PUSH 0, 4 PUSH 1; out: final stack '
                 'top->bottom, 2 = end, then 0 padding',
        accuracy_mask=accuracy_mask_termination),
    'reverse_string': dict(
        level='dcf', input_size=2, output_size=2,
        input_length=lambda n: n, output_length=lambda n: n,
        classification=False, chance=0.5,
        alphabet='in/out: 0,1', accuracy_mask=None),
    'modular_arithmetic_brackets': dict(
        level='dcf', input_size=11, output_size=5,
        input_length=lambda n: n, output_length=lambda n: 1,
        classification=True, chance=0.2,
        alphabet="in: 0-4 digits, 5:'+', 6:'-', 7:'*', 8:'(', 9:')' "
                 "(10:'x', 11:'=' unused); mult=True; out: 0-4",
        accuracy_mask=None),
    'solve_equation': dict(
        level='dcf', input_size=11, output_size=5,
        input_length=lambda n: n, output_length=lambda n: 1,
        classification=True, chance=0.2,
        alphabet="in: 0-4 digits, 5:'+', 6:'-', 7:'(', 8:')', 9:'x', 10:'='; "
                 "no '*'; n<3 gives all-0 input and label 0; out: 0-4",
        accuracy_mask=None),
    'duplicate_string': dict(
        level='cs', input_size=2, output_size=2,
        input_length=lambda n: n, output_length=lambda n: 2 * n,
        classification=False, chance=0.5,
        alphabet='in/out: 0,1', accuracy_mask=None),
    'missing_duplicate_string': dict(
        level='cs', input_size=4, output_size=2,
        input_length=lambda n: n, output_length=lambda n: 1,
        classification=True, chance=0.5,
        alphabet='in: 0,1 bits, 2 = missing symbol, 3 = pad (appended iff n '
                 'odd); |s| = n // 2; n == 1 -> input [1], label 1; out: 0,1',
        accuracy_mask=None),
    'odds_first': dict(
        level='cs', input_size=2, output_size=2,
        input_length=lambda n: n, output_length=lambda n: n,
        classification=False, chance=0.5,
        alphabet='in/out: 0,1; out = x[1::2] + x[0::2]', accuracy_mask=None),
    'binary_addition': dict(
        level='cs', input_size=3, output_size=3,
        input_length=lambda n: n, output_length=lambda n: n + 1,
        classification=False, chance=None,
        alphabet="in: 0,1 little-endian bits, 2 = '+' (absent when n <= 2); "
                 'out: 0,1 little-endian sum, 2 = end, then 0 padding',
        accuracy_mask=accuracy_mask_termination),
    'binary_multiplication': dict(
        level='cs', input_size=3, output_size=3,
        input_length=lambda n: n, output_length=lambda n: n,
        classification=False, chance=None,
        alphabet="in: 0,1 little-endian bits, 2 = '*' (absent when n <= 2); "
                 'out: 0,1 little-endian product, 2 = end, then 0 padding',
        accuracy_mask=accuracy_mask_termination),
    'compute_sqrt': dict(
        level='cs', input_size=2, output_size=2,
        input_length=lambda n: n, output_length=lambda n: math.ceil(n / 2),
        classification=False, chance=0.5,
        alphabet='in: big-endian n in [1, 2^n - 1] with n bits; out: '
                 'big-endian isqrt, ceil(n/2) bits',
        accuracy_mask=None),
    'bucket_sort': dict(
        level='cs', input_size=5, output_size=5,
        input_length=lambda n: n, output_length=lambda n: n,
        classification=False, chance=0.2,
        alphabet='in/out: 0-4 (vocab_size=5); out = sorted input',
        accuracy_mask=None),
}
# `chance`: the reference code states none.  The values above are 1/#classes
# of the label alphabet (binary tasks 0.5, five-way tasks 0.2); None where the
# output has an end token (3 ids) and a trivial per-token guess is undefined.
# The papers' captions could not be retrieved to confirm (see notes).


# =============================================================================
# 3. Samplers (same distribution and ids as the reference sampler)
# =============================================================================


def _py_rng(rng):
  """A Python `random.Random` seeded from a numpy Generator (for bignums)."""
  return _pyrandom.Random(int(rng.integers(0, 2**63 - 1)))


def sample_even_pairs(rng, length):
  """reference: tasks/regular/even_pairs.py (uniform bits; jax randint)."""
  x = rng.integers(0, 2, size=length)
  y = np.array([int(np.logical_xor(x[:-1], x[1:]).sum() % 2)])
  return x, y


def sample_parity_check(rng, length):
  """reference: tasks/regular/parity_check.py."""
  x = rng.integers(0, 2, size=length)
  return x, np.array([int(x.sum() % 2)])


def sample_cycle_navigation(rng, length):
  """reference: tasks/regular/cycle_navigation.py (ids 0..2 uniform)."""
  x = rng.integers(0, 3, size=length)
  return x, np.array([int((x - 1).sum()) % 5])


def _reference_flat_evaluate(expr, modulus):
  """The reference's own evaluation path (blanks, minus->negation, segments)."""
  e = np.array(expr, dtype=np.int64)
  blank = modulus + 3
  mask = e == blank
  op_mask = mask.copy()
  op_mask[::2] = False
  num_mask = mask.copy()
  num_mask[1::2] = False
  e = np.where(op_mask, modulus, e)
  e = np.where(num_mask, 0, e)
  if e.size >= 2:
    minus = e == modulus + 1
    e = np.where(minus, modulus, e)
    e[2:] = e[2:] * (1 - 2 * minus[1:-1].astype(int))
  term_ids = np.cumsum(e == modulus)[::2]
  products = {}
  for tid, v in zip(term_ids, e[::2]):
    products[tid] = products.get(tid, 1) * int(v)
  total = _wrap_int32(sum(_wrap_int32(p) for p in products.values()))
  return total % modulus


def sample_modular_arithmetic(rng, length, modulus=MODULUS):
  """reference: tasks/regular/modular_arithmetic.py.

  Even `length` -> length - 1 tokens.  Digits uniform 0..4 at even positions,
  operators uniform over ids {5 '+', 7 '*', 6 '-'} at odd positions.
  """
  n = _odd_down(length)
  x = np.empty(n, dtype=np.int64)
  x[::2] = rng.integers(0, modulus, size=n // 2 + 1)
  x[1::2] = rng.choice(modulus + np.array([0, 2, 1]), size=n // 2)
  return x, np.array([_reference_flat_evaluate(list(x), modulus)])


def sample_stack_manipulation(rng, length):
  """reference: tasks/dcf/stack_manipulation.py."""
  if length == 1:
    v = int(rng.integers(0, 2))
    return np.array([v]), np.array([v, 2])
  stack_length = int(rng.integers(1, length))
  stack = rng.integers(0, 2, size=stack_length)
  actions = rng.integers(2, 5, size=length - stack_length)
  cur = list(stack)
  for a in actions:
    if a == 2:
      if cur:
        cur.pop()
    else:
      cur.append(int(a) - 3)
  res = cur[::-1] + [2]
  res += [0] * (length + 1 - len(res))
  return np.concatenate([stack, actions]), np.array(res)


def sample_reverse_string(rng, length):
  """reference: tasks/dcf/reverse_string.py (vocab 2)."""
  x = rng.integers(0, 2, size=length)
  return x, x[::-1].copy()


def _generate_bracket_expression(rng, modulus, length, mult):
  """Mirror of generate_one_expression_and_result: (string, value mod m)."""
  if length < 1:
    raise ValueError('length < 1')
  if length <= 4:
    d = int(rng.integers(0, modulus))
    return {1: (str(d), d), 2: ('-' + str(d), -d % modulus),
            3: ('(' + str(d) + ')', d),
            4: ('(-' + str(d) + ')', -d % modulus)}[length]
  left_length = int(rng.integers(1, length - 3))
  right_length = length - (left_length + 3)
  ls, lv = _generate_bracket_expression(rng, modulus, left_length, mult)
  rs, rv = _generate_bracket_expression(rng, modulus, right_length, mult)
  op = int(rng.integers(0, 3 if mult else 2))
  if op == 0:
    return '(' + ls + '+' + rs + ')', (lv + rv) % modulus
  if op == 1:
    return '(' + ls + '-' + rs + ')', (lv - rv) % modulus
  return '(' + ls + '*' + rs + ')', (lv * rv) % modulus


def _encode(s, ids):
  return np.array([int(c) if c.isdigit() else ids[c] for c in s])


def sample_modular_arithmetic_brackets(rng, length, modulus=MODULUS):
  """reference: tasks/dcf/modular_arithmetic_brackets.py (mult=True)."""
  s, v = _generate_bracket_expression(rng, modulus, length, mult=True)
  return _encode(s, MAB_IDS), np.array([v])


def sample_solve_equation(rng, length, modulus=MODULUS):
  """reference: tasks/dcf/solve_equation.py (mult=False always).

  The replaced digit is found by drawing a uniform position in expr and
  scanning right (cyclically) to the first digit, so digits right after
  long runs of brackets/operators are more likely to be chosen.
  """
  if length < 3:
    return np.zeros(length, dtype=np.int64), np.array([0])
  expr, val = _generate_bracket_expression(rng, modulus, length - 2,
                                           mult=False)
  idx = int(rng.integers(0, len(expr)))
  while not expr[idx].isdigit():
    idx = (idx + 1) % (length - 2)
  solution = int(expr[idx])
  eq = expr[:idx] + 'x' + expr[idx + 1:] + '=' + str(val)
  return _encode(eq, SE_IDS), np.array([solution])


def sample_duplicate_string(rng, length):
  """reference: tasks/cs/duplicate_string.py (vocab 2, duplication 2)."""
  x = rng.integers(0, 2, size=length)
  return x, np.concatenate([x, x])


def sample_missing_duplicate_string(rng, length):
  """reference: tasks/cs/missing_duplicate_string.py."""
  if length == 1:
    return np.array([1]), np.array([1])
  s = rng.integers(0, 2, size=length // 2)
  dup = np.concatenate([s, s])
  idx = int(rng.integers(0, dup.shape[0]))
  y = np.array([dup[idx]])
  dup[idx] = 2
  x = np.concatenate([dup, np.full(length % 2, 3)])
  return x, y


def sample_odds_first(rng, length):
  """reference: tasks/cs/odds_first.py (vocab 2)."""
  x = rng.integers(0, 2, size=length)
  return x, np.concatenate([x[1::2], x[::2]])


def _sample_two_numbers(rng, length):
  """Shared by binary_addition / binary_multiplication for length >= 3."""
  pr = _py_rng(rng)
  len_n = int(rng.integers(1, length - 1))
  len_m = length - 1 - len_n
  a = pr.randint(1, 2**len_n - 1)
  b = pr.randint(1, 2**len_m - 1)
  bits_a = [int(c) for c in f'{a:b}'.zfill(len_n)[::-1]]
  bits_b = [int(c) for c in f'{b:b}'.zfill(len_m)[::-1]]
  return a, b, bits_a + [2] + bits_b


def sample_binary_addition(rng, length):
  """reference: tasks/cs/binary_addition.py."""
  if length <= 2:
    num = int(rng.integers(0, 2**length - 1))  # len 1 -> 0; len 2 -> 0..2
    x = [int(c) for c in f'{num:b}'.zfill(length)[::-1]]
    res = [int(c) for c in f'{num:b}'[::-1]]
  else:
    a, b, x = _sample_two_numbers(rng, length)
    res = [int(c) for c in f'{a + b:b}'[::-1]]
  y = res + [2] + [0] * (length - len(res))
  return np.array(x), np.array(y)


def sample_binary_multiplication(rng, length):
  """reference: tasks/cs/binary_multiplication.py."""
  if length <= 2:
    num = int(rng.integers(0, 2**length - 1))
    x = [int(c) for c in f'{num:b}'.zfill(length)[::-1]]
    res = [0] * (length - 1)
  else:
    a, b, x = _sample_two_numbers(rng, length)
    res = [int(c) for c in f'{a * b:b}'[::-1]]
  y = res + [2] + [0] * (length - 1 - len(res))
  return np.array(x), np.array(y)


def sample_compute_sqrt(rng, length):
  """reference: tasks/cs/compute_sqrt.py (n uniform in [1, 2^length - 1])."""
  n = _py_rng(rng).randint(1, 2**length - 1)
  x = [int(c) for c in f'{n:b}'.zfill(length)]
  y = [int(c) for c in f'{math.isqrt(n):b}'.zfill(math.ceil(length / 2))]
  return np.array(x), np.array(y)


def sample_bucket_sort(rng, length):
  """reference: tasks/cs/bucket_sort.py (vocab 5)."""
  x = rng.integers(0, 5, size=length)
  return x, np.sort(x)


TASKS = tuple(TASK_FACTS)
OUTPUT_FNS = {t: globals()['output_' + t] for t in TASKS}
SAMPLE_FNS = {t: globals()['sample_' + t] for t in TASKS}


# =============================================================================
# 4. Model-side pieces
# =============================================================================


def sinusoid_position_encoding(sequence_length, hidden_size,
                               max_timescale=1e4, add_negative_side=False):
  """Sin/cos table, sin half then cos half (CONCATENATED, not interleaved).

  reference: randomized_positional_encodings/models/positional_encodings.py
  sinusoid_position_encoding.  Row r is position p = r (or r - L with
  add_negative_side, rows for p = -L .. L-1); for i < D/2:
    table[r, i]       = sin(p * max_timescale ** (-2i / D))
    table[r, D/2 + i] = cos(p * max_timescale ** (-2i / D))
  Absolute SIN_COS uses D = embedding_dim (64), max_timescale 10000, p = 0..T-1,
  added to the token embedding after the sqrt(D) scaling.
  (NNCH differs: its table lists positions in DESCENDING order -- L..1 for the
  absolute encoding, L..-L+1 for relative -- see `nnch_sinusoid`.)
  """
  if hidden_size % 2:
    raise ValueError('hidden_size must be even')
  inv_freq = max_timescale ** (-np.arange(0, hidden_size, 2) / hidden_size)
  pos = np.arange(-sequence_length if add_negative_side else 0,
                  sequence_length)
  ang = np.einsum('i,j->ij', pos, inv_freq)
  return np.concatenate([np.sin(ang), np.cos(ang)], axis=-1)


def nnch_sinusoid(sequence_length, hidden_size, max_timescale=1e4,
                  causal=False):
  """The OLDER repository's table (for reference only; RPE is preferred).

  reference: neural_networks_chomsky_hierarchy/models/positional_encodings.py
  Positions are L, L-1, ..., 1 (causal=True, used for the ABSOLUTE encoding)
  or L, L-1, ..., -L+1 (causal=False, used by relative attention).
  """
  inv_freq = max_timescale ** (-np.arange(0, hidden_size, 2.0) / hidden_size)
  if causal:
    pos = np.arange(sequence_length, 0, -1.0)
  else:
    pos = np.arange(sequence_length, -sequence_length, -1.0)
  ang = np.einsum('i,j->ij', pos, inv_freq)
  return np.concatenate([np.sin(ang), np.cos(ang)], axis=-1)


def sample_random_positions(rng, seq_len, max_random_len):
  """Sorted draw of `seq_len` DISTINCT positions from range(max_random_len).

  reference: models/positional_encodings.py noisy_fixed_positional_encodings
  (jrandom.choice(arange(L), shape=(T,), replace=False) then sort).  One draw
  per forward call, SHARED by every example in the batch; used by NOISY_SIN_COS
  and NOISY_LEARNT (once, at the embedding) and by NOISY_ROTARY (a fresh draw
  in EVERY layer, the same draw for q and k).  Also drawn at evaluation (the
  reference has no deterministic eval path).  T is the full model length
  (input + placeholder tokens); T > max_random_len is an error.
  """
  if seq_len > max_random_len:
    raise ValueError('seq_len > max_random_len')
  return np.sort(rng.choice(max_random_len, size=seq_len, replace=False))


def sample_relative_offsets(rng, seq_len, noise_max_length):
  """Sorted draw of seq_len - 1 distinct distances from [1, L - 1].

  reference: compute_attention_with_noisy_relative_encodings (right_indexes)
  and compute_noisy_alibi_encodings_biases (symmetric_positions, drawn with
  size max(q, k) - 1).  Distance m (|key - query| = m >= 1) is then encoded
  as r_m (the m-th smallest draw), on both sides.  These are NOT differences
  of sampled positions.  One draw per layer per forward call, shared by the
  batch; also at evaluation.
  """
  return np.sort(rng.choice(np.arange(1, noise_max_length), size=seq_len - 1,
                            replace=False))


def alibi_slopes(num_heads):
  """Head slopes as in the official ALiBi code (and the reference).

  reference: models/positional_encodings.py _get_alibi_slopes.
  Power of two n: start = 2 ** (-(2 ** -(log2(n) - 3))), slopes start**(i+1);
  8 heads -> 1/2, 1/4, ..., 1/256.  Otherwise the closest lower power of two,
  then every other slope of the 2x problem.
  """
  def pow2(n):
    start = 2 ** (-(2 ** -(math.log2(n) - 3)))
    return [start * start**i for i in range(n)]

  if math.log2(num_heads).is_integer():
    return np.array(pow2(num_heads))
  c = 2 ** math.floor(math.log2(num_heads))
  return np.array(pow2(c) + list(alibi_slopes(2 * c)[0::2][:num_heads - c]))


def _alibi_literal(q_len, k_len):
  """The reference's np.tri construction, literally (slow; for checks)."""
  a = np.zeros((q_len, k_len))
  a -= sum(np.tri(q_len, k_len, k=-i) for i in range(1, q_len))
  a -= sum(np.tri(k_len, q_len, k=-i).T for i in range(1, k_len))
  a += 0.5 * np.tri(q_len, k_len, k=-1)
  return a


def alibi_bias(num_heads, q_len, k_len):
  """Bidirectional (non-causal) ALiBi bias, shape (H, Lq, Lk).

  reference: models/positional_encodings.py compute_alibi_encodings_biases.
  For query t and key s:
      bias[h, t, s] = slope_h * (-(t - s) + 0.5)   if s < t  (key on the LEFT)
      bias[h, t, s] = slope_h * (-(s - t))         if s >= t (self / RIGHT)
  i.e. -|t - s| * slope with a +0.5 * slope bonus for keys strictly to the
  left, which is what breaks the left/right symmetry.  The bias is added AFTER
  the 1/sqrt(d) scaling of q.k (not scaled), identically in every layer.
  """
  t = np.arange(q_len)[:, None]
  s = np.arange(k_len)[None, :]
  a = -np.abs(t - s) + 0.5 * (s < t)
  return a[None] * alibi_slopes(num_heads)[:, None, None]


def rel_shift_noncausal(logits, attention_length):
  """The reference's reshape trick for non-causal relative logits.

  reference: models/positional_encodings.py _rel_shift_inner.
  logits (..., Tq, Tq + Tk) -> (..., Tq, Tk) with
      out[..., t, s] = logits[..., t, Tq + s - t].
  """
  *lead, tq, total = logits.shape
  if total != tq + attention_length:
    raise ValueError('last dim must be Tq + Tk')
  x = np.reshape(logits, tuple(lead) + (total, tq))[..., 1:, :]
  x = np.reshape(x, tuple(lead) + (tq, total - 1))
  return x[..., :attention_length]


def noisy_alibi_bias(num_heads, q_len, k_len, distances,
                     left_distances=None):
  """Randomized ALiBi bias (H, Lq, Lk) given sampled distances.

  reference: models/positional_encodings.py compute_noisy_alibi_encodings_biases.
  `distances`: sorted distinct draws from [1, L-1] of size max(Lq, Lk) - 1
  (`sample_relative_offsets(rng, max(Lq, Lk), L)`), default
  randomize_both_sides=False.  For Lq == Lk == T and m = |t - s| >= 1:
      bias = slope * (-r_m + 0.5)  for key left of query (s < t)
      bias = slope * (-r_m)        for key right of query (s > t)
      bias = 0                     on the diagonal
  which is `alibi_bias` with the distance m replaced by r_m.  With
  randomize_both_sides=True pass `left_distances` (size Lq - 1, drawn
  separately); then `distances` has size Lk - 1.
  """
  r = np.sort(np.asarray(distances, dtype=np.float64))
  if left_distances is None:
    sym = -r
    right = sym[:k_len - 1]
    left = np.flip(sym)[:q_len - 1]
  else:
    right = -r[:k_len - 1]
    left = np.sort(-np.asarray(left_distances, dtype=np.float64))
  left = left + 0.5
  positions = np.concatenate([[0.0], left, [0.0], right])
  tiled = np.tile(positions, (q_len, 1))
  bias = rel_shift_noncausal(tiled, k_len)
  return bias[None] * alibi_slopes(num_heads)[:, None, None]


def xl_logits(q, k, w_r, u, v, max_time=10_000, scale=True):
  """Transformer-XL style relative attention logits, non-causal, as coded.

  reference: models/positional_encodings.py
  compute_attention_with_relative_encodings (+ transformer.py, which then
  multiplies by 1/sqrt(d)).

  Shapes: q, k: (..., T, H, d) (already projected by the bias-free W_q, W_k);
  w_r: (H*d, H*d) haiku Linear weight (y = x @ w_r, no bias), one per layer;
  u = 'relpos_contentbias', v = 'relpos_relativebias': (H, d), one pair per
  layer, init N(0, 0.02).  Returns (..., H, T, T) logits (query t, key s).

      logit[h, t, s] = ( (q_t + u_h) . k_s  +  (q_t + v_h) . R_h(s - t) ) / sqrt(d)

  where R(p) = (phi(p) @ w_r) split into heads (head h = output columns
  h*d:(h+1)*d) and phi(p) is the concatenated sin/cos vector of width H*d
  (NOT per head) with max_time 10000.  Note the offset is KEY MINUS QUERY
  (s - t): the table has rows p = -T .. T-1 and the reshape trick maps
  column s of row t to row T + s - t (row 0, p = -T, is never used).  (NNCH
  lists the table in descending order, which yields phi(t - s) instead; the
  two differ only by the sign of the sin half, absorbable into w_r.)  Both u
  and v are added to the query before the dot products; the single 1/sqrt(d)
  scale (d = per-head width, 8) applies to the sum.
  """
  q = np.asarray(q, dtype=np.float64)
  k = np.asarray(k, dtype=np.float64)
  t_len, h, d = q.shape[-3:]
  content = np.einsum('...thd,...shd->...hts', q + u, k)
  table = sinusoid_position_encoding(t_len, h * d, max_time,
                                     add_negative_side=True)
  rel_keys = (table @ w_r).reshape(2 * t_len, h, d)
  rel = np.einsum('...thd,jhd->...htj', q + v, rel_keys)
  rel = rel_shift_noncausal(rel, t_len)
  out = content + rel
  return out / np.sqrt(d) if scale else out


def xl_logits_randomized(q, k, w_r, u, v, right_offsets, noise_max_length,
                         max_time=10_000, scale=True, reference_clamp=True,
                         left_offsets=None):
  """Randomized ('NOISY_RELATIVE') Transformer-XL logits, as coded.

  reference: models/positional_encodings.py
  compute_attention_with_noisy_relative_encodings.

  `right_offsets` = sorted draws r_1 < ... < r_{T-1} from [1, L-1]
  (`sample_relative_offsets(rng, T, L)`), L = noise_max_length (2048).  The
  reference builds the index vector
      [0 (dummy), -r_{T-1}, ..., -r_1, 0, r_1, ..., r_{T-1}] + L
  and gathers rows of `sinusoid_position_encoding(L, H*d)` -- a table with
  only L rows (positions 0..L-1; add_negative_side is NOT set).  The offset 0
  (index L) and every positive offset (index L + r_m) are therefore OUT OF
  BOUNDS; JAX gathers CLAMP them to row L-1.  So, as coded:
      key right of query or itself (s >= t):  phi(L - 1)  (all identical)
      key left of query by m:                 phi(L - r_m)
  reference_clamp=True reproduces this (the code as written).
  reference_clamp=False gives what the code comment intends: a 2L-row table
  (positions -L..L-1) so that offset s - t = +-m maps to phi(+-r_m), 0 to
  phi(0).  Everything else (w_r, u, v, scaling, shift) is as in `xl_logits`.
  `left_offsets`: only for randomize_both_sides=True (T sorted draws from
  [-(L-1), -1], the first one sits in the unused dummy slot).
  """
  q = np.asarray(q, dtype=np.float64)
  k = np.asarray(k, dtype=np.float64)
  t_len, h, d = q.shape[-3:]
  n = noise_max_length
  right = np.sort(np.asarray(right_offsets, dtype=np.int64))
  if right.shape != (t_len - 1,):
    raise ValueError('need T - 1 right offsets')
  if left_offsets is None:
    left = np.concatenate([[0], -right[::-1]])
  else:
    left = np.sort(np.asarray(left_offsets, dtype=np.int64))
  idx = np.concatenate([left, [0], right]) + n
  if reference_clamp:
    table = sinusoid_position_encoding(n, h * d, max_time)
    rows = table[np.clip(idx, 0, n - 1)]
  else:
    table = sinusoid_position_encoding(n, h * d, max_time,
                                       add_negative_side=True)
    rows = table[idx]
  content = np.einsum('...thd,...shd->...hts', q + u, k)
  rel_keys = (rows @ w_r).reshape(2 * t_len, h, d)
  rel = np.einsum('...thd,jhd->...htj', q + v, rel_keys)
  rel = rel_shift_noncausal(rel, t_len)
  out = content + rel
  return out / np.sqrt(d) if scale else out


def apply_rotary(x, positions, max_time=10_000):
  """RoPE as coded: INTERLEAVED pairs (2j, 2j+1), per-head width d.

  reference: models/positional_encodings.py apply_rotary_encoding/_rope_kernel.
  x: (..., T, H, d); positions: (T,) (arange(T), or sorted random positions
  for NOISY_ROTARY).  theta_j = max_time ** (-j / (d/2)) = 10000 ** (-2j/d);
      out[2j]   = x[2j] cos(p theta_j) - x[2j+1] sin(p theta_j)
      out[2j+1] = x[2j+1] cos(p theta_j) + x[2j] sin(p theta_j)
  Applied to q and k (same positions) in every layer before q.k; then the
  usual 1/sqrt(d).  max_time is always the default 10000 here.
  """
  x = np.asarray(x, dtype=np.float64)
  d = x.shape[-1]
  inv = max_time ** (-(np.arange(d // 2) / (d // 2)))
  inv = np.repeat(inv, 2)
  ang = np.asarray(positions, dtype=np.float64)[:, None, None] * inv
  x_rot = np.empty_like(x)
  x_rot[..., 0::2] = -x[..., 1::2]
  x_rot[..., 1::2] = x[..., 0::2]
  return x * np.cos(ang) + x_rot * np.sin(ang)


def embed_inputs(onehot, w_emb, pos_encoding=None):
  """Input embedding: (onehot @ w_emb) * sqrt(D) (+ absolute PE).

  reference: models/transformer.py TransformerEmbedder.  w_emb: (V+1, D), no
  bias, TruncatedNormal(0.02) init.  Absolute encodings (SIN_COS, LEARNT and
  their NOISY_ versions) are added here and followed by dropout; ALiBi,
  RELATIVE, ROTARY (and NONE) add nothing here and apply NO input dropout.
  """
  h = np.asarray(onehot) @ w_emb * np.sqrt(w_emb.shape[1])
  return h if pos_encoding is None else h + pos_encoding


# =============================================================================
# 5. Input layout and accuracy
# =============================================================================


def reference_layout(x_ids, output_length, input_size):
  """Model input built from one example (non-autoregressive, no compute tape).

  reference: randomized_positional_encodings/experiments/utils.py
  make_model_with_empty_targets (computation_steps_mult=0).
  The input one-hots get one extra zero column (size input_size + 1), and
  `output_length` placeholder tokens are appended, each the one-hot of id
  `input_size` (the new last dimension).  Classification tasks get ONE
  placeholder.  The model produces logits at every position; the prediction
  is taken from the LAST `output_length` positions (squeezed for
  classification).  output_length is task.output_length(len(x_ids)).
  Returns (ids, onehot, read) with ids of length len(x) + output_length,
  onehot (len, input_size + 1) and `read` a slice selecting output positions.
  """
  x_ids = _ids(x_ids)
  ids = np.concatenate([x_ids, np.full(output_length, input_size)])
  onehot = np.eye(input_size + 1)[ids]
  return ids, onehot, slice(len(x_ids), len(ids))


def batch_accuracy(pred_ids, target_ids, mask=None):
  """Accuracy of ONE evaluation (sub-)batch, as the reference computes it.

  reference: experiments/example.py accuracy_fn:
      sum(mask * (argmax(out) == argmax(target))) / sum(mask)
  i.e. total correct over total counted tokens in the sub-batch (not a mean
  of per-sequence accuracies).  pred/target ids: (B,) or (B, T).
  """
  pred_ids, target_ids = np.asarray(pred_ids), np.asarray(target_ids)
  if mask is None:
    mask = np.ones(target_ids.shape, dtype=bool)
  return float(np.sum(mask * (pred_ids == target_ids)) / np.sum(mask))


def length_accuracy(pred_ids, target_ids, mask=None, sub_batch_size=64):
  """Accuracy at one test length: mean over sub-batches of `batch_accuracy`.

  reference: experiments/range_evaluation.py (512 examples per length in
  sub-batches of 64 -> mean of 8 sub-batch accuracies).  Identical to the
  token accuracy when every sub-batch counts the same number of tokens
  (always, except for the masked tasks).
  """
  pred_ids, target_ids = np.asarray(pred_ids), np.asarray(target_ids)
  if mask is None:
    mask = np.ones(target_ids.shape, dtype=bool)
  n = target_ids.shape[0]
  if n % sub_batch_size:
    raise ValueError('batch must be a multiple of sub_batch_size')
  accs = [batch_accuracy(pred_ids[i:i + sub_batch_size],
                         target_ids[i:i + sub_batch_size],
                         mask[i:i + sub_batch_size])
          for i in range(0, n, sub_batch_size)]
  return float(np.mean(accs))


def reference_loss(logits, target_ids):
  """Training loss: mean over batch AND positions of the cross-entropy.

  reference: experiments/example.py loss_fn =
  mean(sum(-target * log_softmax(output), -1)).  NOT masked: the padding after
  the end token of binary_addition etc. is trained on.  logits (B, [T,] C).
  """
  logits = np.asarray(logits, dtype=np.float64)
  z = logits - logits.max(-1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  picked = np.take_along_axis(logp, np.asarray(target_ids)[..., None], -1)
  return float(-picked.mean())


# =============================================================================
# 6. Scoring
# =============================================================================


def score(accuracies_by_length, max_train_length, max_test_length=None,
          convention='paper'):
  """Mean accuracy over the unseen test lengths.

  accuracies_by_length: dict {length: acc} or a sequence whose item i is the
  accuracy at length i + 1 (the reference evaluates lengths 1..M, step 1).
  convention='paper': mean over lengths N+1 .. M inclusive (what the papers
  describe: train on 1..N, test on N+1..M).
  convention='example_py': what experiments/example.py literally computes,
  np.mean(accuracies[N + 1:]) on the list that starts at length 1, i.e.
  lengths N+2 .. M (length N+1 is skipped by an off-by-one).
  Across runs the papers report the MAX over seeds (and learning rates) of
  this per-run score (see `aggregate_runs`).
  """
  if isinstance(accuracies_by_length, dict):
    acc = dict(accuracies_by_length)
  else:
    acc = {i + 1: a for i, a in enumerate(accuracies_by_length)}
  if max_test_length is None:
    max_test_length = max(acc)
  first = max_train_length + (1 if convention == 'paper' else 2)
  if convention not in ('paper', 'example_py'):
    raise ValueError(convention)
  return float(np.mean([acc[n] for n in range(first, max_test_length + 1)]))


def aggregate_runs(scores):
  """Paper aggregation across seeds / learning rates: the maximum score."""
  return float(np.max(np.asarray(scores)))


# Defaults of the reference code (RPE experiments/example.py, models/*.py).
TRANSFORMER_DEFAULTS = dict(
    num_layers=5, embedding_dim=64, num_heads=8, num_hiddens_per_head=8,
    widening_factor=4, activation='relu', dropout_prob=0.1,
    emb_init_scale=0.02, embedding_scale='sqrt(embedding_dim)', norm='post',
    layer_norm_eps=1e-5, causal=False, attention_biases=False,
    ffn_biases=True, output_head_bias=True,
    positional_encodings='NOISY_RELATIVE',
    positional_encodings_params={'noise_max_length': 2048,
                                 'randomize_both_sides': False,
                                 'max_time': 10_000})
TRAINING_DEFAULTS = dict(
    training_steps=10_000, loop_iterations=10_001, batch_size=128,
    learning_rate=1e-3, optimizer='adam (optax.adam defaults)',
    schedule='constant', max_grad_norm=1.0, l2_weight=0.0,
    curriculum='uniform over lengths 1..40, one length per batch',
    seed=0, model_init_seed=0)
EVAL_DEFAULTS = dict(
    max_range_test_length=100, lengths='1..100 step 1',
    examples_per_length=512, sub_batch_size=64,
    randomness_at_eval='dropout AND random positions stay on',
    eval_seeds='random.seed(1), np.random.seed(1), hk.PRNGSequence(1)')


# =============================================================================
# Self-check
# =============================================================================


def _self_check(n_per=200, lengths=(1, 2, 3, 7, 40, 101), seed=0):
  rng = np.random.default_rng(seed)
  for task in TASKS:
    facts = TASK_FACTS[task]
    for length in lengths:
      for _ in range(n_per):
        x, y = SAMPLE_FNS[task](rng, length)
        got = OUTPUT_FNS[task](x)
        assert np.array_equal(got, y), (task, length, x, y, got)
        assert len(x) == facts['input_length'](length), (task, length)
        assert len(y) == facts['output_length'](length), (task, length)
        assert x.min() >= 0 and x.max() < facts['input_size'], (task, x)
        assert y.min() >= 0 and y.max() < facts['output_size'], (task, y)
    print(f'{task:28s} ok')

  # Docstring examples of the reference that agree with the code.
  assert output_modular_arithmetic([1, 5, 2, 7, 3])[0] == 2
  assert output_modular_arithmetic([1, 6, 1, 6, 1])[0] == 4
  assert output_modular_arithmetic([0, 7, 1, 5, 4, 7, 3, 6, 2])[0] == 0
  assert list(output_stack_manipulation([0, 1, 1, 0, 4, 2, 2])) == \
      [1, 1, 0, 2, 0, 0, 0, 0]
  assert list(output_stack_manipulation([1, 1, 0, 2, 2, 2])) == \
      [2, 0, 0, 0, 0, 0, 0]
  assert output_missing_duplicate_string([0, 1, 1, 0, 0, 2, 1, 0])[0] == 1
  assert output_missing_duplicate_string([1, 0, 1, 1, 2, 1, 3])[0] == 0
  assert list(output_binary_multiplication([0, 0, 1, 2, 0, 1, 1, 0, 1])) == \
      [0, 0, 0, 1, 1, 0, 1, 2, 0]
  # binary_addition: 4 + 22 = 26 -> code pads to len + 1 = 10 (doc shows 9).
  assert list(output_binary_addition([0, 0, 1, 2, 0, 1, 1, 0, 1])) == \
      [0, 1, 0, 1, 1, 2, 0, 0, 0, 0]
  # odds_first: code gives x[1::2] first (doc example says the opposite).
  assert list(output_odds_first([0, 0, 1, 1, 0, 1, 0, 1])) == \
      [0, 1, 1, 1, 0, 1, 0, 0]
  assert list(output_compute_sqrt([1, 0, 0, 1, 0, 1])) == [1, 1, 0]

  # Model pieces: closed forms versus the reference's literal constructions.
  for q_len, k_len in [(1, 1), (5, 5), (4, 7), (7, 4)]:
    lit = _alibi_literal(q_len, k_len)[None] * alibi_slopes(8)[:, None, None]
    assert np.allclose(lit, alibi_bias(8, q_len, k_len))
  assert np.allclose(alibi_slopes(8), [2.0**-i for i in range(1, 9)])
  z = np.tile(np.arange(-3, 3), (3, 1))
  assert np.array_equal(rel_shift_noncausal(z, 3),
                        [[0, 1, 2], [-1, 0, 1], [-2, -1, 0]])
  t_len, h, d = 6, 2, 4
  q = rng.normal(size=(t_len, h, d))
  k = rng.normal(size=(t_len, h, d))
  w_r = rng.normal(size=(h * d, h * d))
  u, v = rng.normal(size=(h, d)), rng.normal(size=(h, d))
  got = xl_logits(q, k, w_r, u, v)
  want = np.zeros((h, t_len, t_len))
  for t in range(t_len):
    for s in range(t_len):
      p = s - t
      inv = 10_000 ** (-np.arange(0, h * d, 2) / (h * d))
      phi = np.concatenate([np.sin(p * inv), np.cos(p * inv)])
      rr = (phi @ w_r).reshape(h, d)
      for hh in range(h):
        want[hh, t, s] = ((q[t, hh] + u[hh]) @ k[s, hh]
                          + (q[t, hh] + v[hh]) @ rr[hh]) / np.sqrt(d)
  assert np.allclose(got, want)
  # Randomized relative with identity offsets r_m = m (intended table)
  # reproduces the plain relative logits.
  same = xl_logits_randomized(q, k, w_r, u, v, np.arange(1, t_len), 64,
                              reference_clamp=False)
  assert np.allclose(same, got)
  # Randomized ALiBi with r_m = m reproduces plain ALiBi.
  assert np.allclose(noisy_alibi_bias(8, 6, 6, np.arange(1, 6)),
                     alibi_bias(8, 6, 6))
  # RoPE: q.k after rotation depends only on the position difference.
  qq, kk = rng.normal(size=(1, 1, 8)), rng.normal(size=(1, 1, 8))
  a = np.sum(apply_rotary(qq, [7]) * apply_rotary(kk, [3]))
  b = np.sum(apply_rotary(qq, [104]) * apply_rotary(kk, [100]))
  assert np.isclose(a, b)
  ids, onehot, read = reference_layout([0, 1, 2], 4, 3)
  assert list(ids) == [0, 1, 2, 3, 3, 3, 3] and onehot.shape == (7, 4)
  assert list(ids[read]) == [3, 3, 3, 3]
  assert score(list(np.arange(1, 101) / 100), 40) == np.mean(
      np.arange(41, 101) / 100)
  assert score(list(np.arange(1, 101) / 100), 40,
               convention='example_py') == np.mean(np.arange(42, 101) / 100)
  print('model pieces ok')


if __name__ == '__main__':
  _self_check()
