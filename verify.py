"""Tasks and verifiable rewards for the ES-versus-GRPO experiments.

Four tasks share one small interface (see `Task`): `countdown` (TinyZero), `gsm8k`, `math` (MATH-500 style) and
`toy`, a compact Countdown for the embedded character-level model built by toy.py.

The cardinal rule: model text is never executed. There is no eval/exec/compile and no sympy parsing (sympify,
parse_expr and parse_latex all call eval). Answers are read by two small parsers written here: an iterative
(shunting-yard) one for Countdown arithmetic, with exact `Fraction` arithmetic, and a recursive-descent one for
LaTeX-ish math, evaluated numerically at fixed pseudo-random points. Both bound input length, nesting depth and
number size, so that no input can hang them, overflow the stack or blow up big-integer arithmetic, and every public
function returns normally on any string.

Defects of earlier Countdown code that this module avoids on purpose: rewards are computed on the completion only
(a prompt's example tags earn nothing), and targets are parsed as numbers (isdigit() rejects '-3' and '0.5', and
accepts unicode digits such as '３').
"""
from __future__ import annotations

import cmath
import hashlib
import itertools
import json
import math
import os
import random
import re
from fractions import Fraction

MAX_CHARS = 1000           # longest expression or answer that is parsed at all
MAX_DEPTH = 100            # Countdown: nesting of parentheses
MAX_LATEX_DEPTH = 50       # LaTeX parser: each level costs several Python frames
MAX_DIGITS = 30            # digits in one Countdown literal
MAX_MAGNITUDE = 10 ** 60   # cap on numerator and denominator of any Countdown intermediate value
TOLERANCE = Fraction(1, 10 ** 5)
DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data')  # the bundled real problems


class UsageError(Exception):
    """Bad user input (task name, data file, ...). Callers print `error: <msg>` and exit 2."""


class _Reject(Exception):
    """Internal: the text does not parse or breaks a bound. Never escapes a public function."""


_NUMBER = re.compile(r'[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?')


def to_fraction(value) -> Fraction | None:
    """Exact value of an int, float, Fraction or numeric string such as '-3.5'; None if it is not a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, Fraction)):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(value) if math.isfinite(value) else None
    if isinstance(value, str) and len(value) <= 100 and _NUMBER.fullmatch(value.strip()):
        return Fraction(value.strip())  # the ASCII regex above guards Fraction's own string parser
    return None


# ---- Countdown arithmetic -------------------------------------------------------------------------------------------
_ARITH_CHARS = frozenset('0123456789+-*/(). \t\r\n')  # explicit ASCII set: str.isdigit() would accept '٣'
_ARITH_TOKEN = re.compile(r'[0-9]+(?:\.[0-9]+)?|[-+*/()]')
_BINARY_PREC = {'+': 1, '-': 1, '*': 2, '/': 2, 'neg': 3}


def _parse_arith(expr: str) -> list | None:
    """Postfix code of a well-formed Countdown expression, or None.

    Grammar: binary + - * / (usual precedence, left associative), unary + and -, parentheses, literals
    [0-9]+(.[0-9]+)?.  An iterative shunting-yard parser: no recursion, so no input and no caller's stack depth
    can raise RecursionError.  It alternates between expecting an operand and expecting an operator, which is
    what rejects '**', '//', '1 2' and '()'."""
    text = expr.strip() if isinstance(expr, str) else ''
    if not text or len(text) > MAX_CHARS or not set(text) <= _ARITH_CHARS:
        return None
    code, stack, depth, want_operand, pos = [], [], 0, True, 0
    while pos < len(text):
        if text[pos] in ' \t\r\n':
            pos += 1
            continue
        m = _ARITH_TOKEN.match(text, pos)
        if not m or len(m.group().replace('.', '')) > MAX_DIGITS:
            return None
        tok, pos = m.group(), m.end()
        if want_operand:
            if tok[0] in '0123456789':
                code.append(Fraction(tok))
                want_operand = False
            elif tok == '-':
                stack.append('neg')
            elif tok == '(':
                depth += 1
                if depth > MAX_DEPTH:
                    return None
                stack.append(tok)
            elif tok != '+':  # unary plus changes nothing
                return None
        elif tok == ')':
            while stack and stack[-1] != '(':
                code.append(stack.pop())
            if not stack:
                return None
            stack.pop()
            depth -= 1
        elif tok in '+-*/':
            while stack and stack[-1] != '(' and _BINARY_PREC[stack[-1]] >= _BINARY_PREC[tok]:
                code.append(stack.pop())
            stack.append(tok)
            want_operand = True
        else:
            return None
    if want_operand or '(' in stack:
        return None
    return code + stack[::-1]


def _run_postfix(code: list) -> Fraction | None:
    """Exact value of postfix code; None on division by zero or when a value outgrows MAX_MAGNITUDE."""
    stack = []
    for item in code:
        if isinstance(item, Fraction):
            stack.append(item)
            continue
        if item == 'neg':
            stack.append(-stack.pop())
            continue
        b, a = stack.pop(), stack.pop()
        if item == '/' and b == 0:
            return None
        value = a + b if item == '+' else a - b if item == '-' else a * b if item == '*' else a / b
        if abs(value.numerator) > MAX_MAGNITUDE or value.denominator > MAX_MAGNITUDE:
            return None
        stack.append(value)
    return stack[0]


def check_expression(expr: str, numbers: list[int], target) -> tuple[bool, bool]:
    """(well_formed, correct) of a Countdown answer: each given number used exactly once and value == target."""
    code = _parse_arith(expr)
    if code is None:
        return False, False
    given = [to_fraction(n) for n in numbers] if isinstance(numbers, (list, tuple)) else [None]
    goal = to_fraction(target)
    if goal is None or None in given:
        return True, False
    # The multiset test comes first: an expression over the wrong numbers is wrong whatever its value.
    if sorted(x for x in code if isinstance(x, Fraction)) != sorted(given):
        return True, False
    value = _run_postfix(code)
    return True, value is not None and abs(value - goal) < TOLERANCE


def extract_answer_tag(completion: str) -> str | None:
    """Content of the last complete <answer>...</answer>: the last opening tag that has a closing tag after it.
    Plain string search, linear in the length (a lazy regex is quadratic on many unclosed tags)."""
    if not isinstance(completion, str):
        return None
    close = completion.rfind('</answer>')
    start = completion.rfind('<answer>', 0, close) if close >= 0 else -1
    if start < 0:
        return None
    return completion[start + len('<answer>'):completion.find('</answer>', start)]


def countdown_reward(completion: str, numbers: list[int], target) -> float:
    """TinyZero rule on the last answer tag: none 0.0, present but not correct 0.1, correct 1.0."""
    answer = extract_answer_tag(completion)
    if answer is None:
        return 0.0
    return 1.0 if check_expression(answer, numbers, target)[1] else 0.1


# ---- Expression trees (problem generation, canonical printing) -----------------------------------------------------
_PREC = {'+': 1, '-': 1, '*': 2, '/': 2}


def _tree_value(tree) -> Fraction | None:
    """Exact value of a tree `int | (op, left, right)`; None on division by zero."""
    if isinstance(tree, int):
        return Fraction(tree)
    op, left, right = tree
    a, b = _tree_value(left), _tree_value(right)
    if a is None or b is None or (op == '/' and b == 0):
        return None
    return a + b if op == '+' else a - b if op == '-' else a * b if op == '*' else a / b


def _show(tree) -> str:
    """Print a tree with only the parentheses that change the value."""
    if isinstance(tree, int):
        return str(tree)
    op, left, right = tree
    text_l, text_r = _show(left), _show(right)
    if not isinstance(left, int) and _PREC[left[0]] < _PREC[op]:
        text_l = f'({text_l})'
    if not isinstance(right, int) and (_PREC[right[0]] < _PREC[op] or (_PREC[right[0]] == _PREC[op] and op in '-/')):
        text_r = f'({text_r})'
    return f'{text_l}{op}{text_r}'


def _trees(leaves, ops):
    """Every binary tree with these leaves in this order and operators from ops."""
    if len(leaves) == 1:
        yield leaves[0]
        return
    for cut in range(1, len(leaves)):
        for left in _trees(leaves[:cut], ops):
            for right in _trees(leaves[cut:], ops):
                for op in ops:
                    yield op, left, right


def _stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), 'big')


# ---- \boxed{} and MATH answer equivalence -------------------------------------------------------------------------
_BOX = re.compile(r'\\(?:boxed|fbox)(?![a-zA-Z])')


def extract_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} or \\fbox{...} (braces matched), or the token after `\\boxed `."""
    if not isinstance(text, str):
        return None
    last = None
    for last in _BOX.finditer(text):
        pass
    if last is None:
        return None
    pos = last.end()
    while pos < len(text) and text[pos] in ' \t\n':
        pos += 1
    if pos < len(text) and text[pos] == '{':
        depth, i = 0, pos
        while i < len(text):
            if text[i] == '\\':  # \{ and \} are literal braces; skipping the escape also skips \\ line breaks
                i += 2
                continue
            depth += {'{': 1, '}': -1}.get(text[i], 0)
            if depth == 0:
                return text[pos + 1:i]
            i += 1
        return None  # unbalanced
    token = re.match(r'[^\s$]+', text[pos:pos + MAX_CHARS])
    return token.group() if token else None


_UNITS = ('cm|centimeters?|meters?|km|mm|inches|inch|feet|foot|ft|yards?|miles?|mph|degrees?|dollars?|cents?|'
          'units?|square|sq|hours?|minutes?|seconds?|days?|pounds?|ounces?|grams?|kg|liters?|points?')
_TEXT_UNIT = re.compile(r'(?<=[0-9}])\s*\\(?:text|mbox|textrm|mathrm)\s*\{\s*(?:%s|m|in)\s*\}(?:\^\{?[23]\}?)?' % _UNITS)
_TEXT_CMD = re.compile(r'\\(?:text|textbf|textit|textrm|mbox|mathrm|mathbf)\s*\{([^{}]*)\}')
_TRAILING_UNIT = re.compile(r'(?<=[0-9])(?:%s)(?:\^\{?[23]\}?)?$' % _UNITS)
_SPACE = re.compile(r'(\\[a-zA-Z]+)\s+(?=[a-zA-Z])|\s+')  # keeps one space in `\cot x`, drops all others
_WORD = re.compile(r'(?<![\\a-zA-Z])[a-zA-Z]{3,}')        # a word, not a product of single-letter variables


def _normalize(s: str) -> str:
    """Canonical string of a MATH answer: LaTeX decoration, units, degrees, percent and spacing removed."""
    s = s.strip().replace('\\$', '').replace('$', '')
    s = re.sub(r'\\(?:left|right|displaystyle)(?![a-zA-Z])|(?<!\\)\\[!,;: ]|~', '', s)
    s = _TEXT_UNIT.sub('', s)
    for _ in range(3):  # innermost first; three passes cover any real nesting
        s = _TEXT_CMD.sub(r'\1', s)
    s = re.sub(r'\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|°|\\%|%', '', s)
    s = re.sub(r'\\[dt]frac(?![a-zA-Z])', r'\\frac', s)
    s = _SPACE.sub(lambda m: m.group(1) + ' ' if m.group(1) else '', s).rstrip('.')
    s = re.sub(r'\\frac([0-9a-zA-Z])([0-9a-zA-Z])', r'\\frac{\1}{\2}', s)   # \frac12 -> \frac{1}{2}
    s = re.sub(r'\\frac(\{[^{}]*\})([0-9a-zA-Z])', r'\\frac\1{\2}', s)     # \frac{270}7
    s = re.sub(r'\\frac([0-9a-zA-Z])\{', r'\\frac{\1}{', s)                # \frac9{19}
    s = re.sub(r'\\sqrt([0-9a-zA-Z])', r'\\sqrt{\1}', s)
    s = re.sub(r'^[a-zA-Z]=(?!.*=)|^[a-zA-Z]\\in', '', s)                   # a single assignment `x=5`, `x\in[..]`
    s = _TRAILING_UNIT.sub('', s)
    mixed = re.fullmatch(r'(-?)([0-9]{1,9})\\frac\{([0-9]{1,9})\}\{([1-9][0-9]{0,8})\}', s)
    if mixed:  # MATH writes mixed numbers as 1\frac{4}{5} = 9/5
        value = int(mixed[2]) + Fraction(int(mixed[3]), int(mixed[4]))
        s = f'{mixed[1]}\\frac{{{value.numerator}}}{{{value.denominator}}}'
    if re.fullmatch(r'-?[0-9]{1,3}(,[0-9]{3})+(\.[0-9]+)?', s):             # 1,000 (a tuple has brackets)
        s = s.replace(',', '')
    s = re.sub(r'_\{([0-9a-zA-Z]+)\}', r'_\1', s)                            # 4210_{5} -> 4210_5
    return re.sub(r'^\(([A-Za-z])\)$', r'\1', s)                            # (C) -> C


def _split_top(s: str, sep: str) -> list[str]:
    """Split at occurrences of sep outside all brackets."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        if s[i] in '([{':
            depth += 1
        elif s[i] in ')]}':
            depth -= 1
        elif depth == 0 and s.startswith(sep, i):
            parts.append(s[start:i])
            start = i + len(sep)
            i = start
            continue
        i += 1
    return parts + [s[start:]]


def _as_tuple(s: str):
    """(open, close, elements) when s is one bracketed, comma-separated group like (1,2) or [a,b); else None."""
    if len(s) < 2 or s[0] not in '([' or s[-1] not in ')]':
        return None
    depth = 0
    for i, c in enumerate(s):
        depth += 1 if c in '([{' else -1 if c in ')]}' else 0
        if depth == 0 and i < len(s) - 1:
            return None  # the first bracket closes early, as in (a+5)(b+2)
    items = _split_top(s[1:-1], ',')
    return (s[0], s[-1], items) if len(items) > 1 else None


def _as_matrix(s: str):
    m = re.fullmatch(r'\\begin\{([pbv]?matrix)\}(.*)\\end\{\1\}', s)
    return [row.split('&') for row in m[2].split('\\\\')] if m else None


def _as_collection(s: str):
    """Elements of a set \\{a,b\\} or of a bare list a,b (order does not matter); None otherwise."""
    if s.startswith('\\{') and s.endswith('\\}'):
        return _split_top(s[2:-2], ',')
    items = _split_top(s, ',')
    return items if len(items) > 1 else None


def _equal_normalized(a: str, b: str, level: int = 0) -> bool:
    if not a or not b or level > 3:
        return False
    if a == b:
        return True
    ma, mb = _as_matrix(a), _as_matrix(b)
    if ma or mb:
        return (ma is not None and mb is not None and [len(r) for r in ma] == [len(r) for r in mb]
                and all(_equal_normalized(x, y, level + 1) for ra, rb in zip(ma, mb) for x, y in zip(ra, rb)))
    ua, ub = _split_top(a, '\\cup'), _split_top(b, '\\cup')
    if len(ua) > 1 or len(ub) > 1:
        return len(ua) == len(ub) and all(_equal_normalized(x, y, level + 1) for x, y in zip(ua, ub))
    ta, tb = _as_tuple(a), _as_tuple(b)
    if ta or tb:  # tuples and intervals: same brackets, elementwise in order
        return (ta is not None and tb is not None and ta[:2] == tb[:2] and len(ta[2]) == len(tb[2])
                and all(_equal_normalized(x, y, level + 1) for x, y in zip(ta[2], tb[2])))
    ca, cb = _as_collection(a), _as_collection(b)
    if ca or cb:  # sets and answer lists: a one-to-one matching, in any order
        ca, cb = ca or [a], cb or [b]
        if len(ca) != len(cb) or len(ca) > 20:
            return False
        unused = list(cb)
        for x in ca:
            match = next((y for y in unused if _equal_normalized(x, y, level + 1)), None)
            if match is None:
                return False
            unused.remove(match)
        return True
    if _WORD.search(a) or _WORD.search(b):  # words ('east', 'Evelyn') compare as text, never as products
        return a.lower() == b.lower()
    return _numeric_equal(a, b)


# ---- LaTeX-ish math parser -----------------------------------------------------------------------------------------
_LATEX_TOKEN = re.compile(r'([0-9]+(?:\.[0-9]*)?|\.[0-9]+)|(\\[a-zA-Z]+|\\.)|([a-zA-Z])|(\S)', re.S)
_FUNCS = {'sin': cmath.sin, 'cos': cmath.cos, 'tan': cmath.tan, 'cot': lambda z: 1 / cmath.tan(z),
          'sec': lambda z: 1 / cmath.cos(z), 'csc': lambda z: 1 / cmath.sin(z), 'ln': cmath.log, 'log': cmath.log,
          'exp': cmath.exp, 'arcsin': cmath.asin, 'arccos': cmath.acos, 'arctan': cmath.atan}
_CLOSE = {'(': ')', '{': '}', '[': ']'}


class _LatexParser:
    """expr := [+-] term ([+-] term)*;  term := unary (('*'|'/'|\\cdot|\\times|\\div) unary | implicit power)*;
    unary := [+-] unary | power;  power := atom ['^' unary];  atom := number | letter | \\pi | \\infty | group
    | \\frac arg arg | \\sqrt[n] arg | \\func power.  Sums and products are flat lists, so the tree is only as
    deep as the nesting, which is bounded."""

    def __init__(self, text):
        self.tokens = [(m.lastindex, m.group()) for m in _LATEX_TOKEN.finditer(text)]
        self.pos, self.depth, self.names = 0, 0, set()

    def peek(self):
        return self.tokens[self.pos][1] if self.pos < len(self.tokens) else None

    def take(self):
        if self.pos >= len(self.tokens):
            raise _Reject
        self.pos += 1
        return self.tokens[self.pos - 1]

    def nest(self):
        self.depth += 1
        if self.depth > MAX_LATEX_DEPTH:
            raise _Reject

    def parse(self):
        node = self.expr()
        if self.pos != len(self.tokens):
            raise _Reject
        return node

    def expr(self):
        terms = []
        sign = -1 if self.peek() == '-' else 1
        if self.peek() in ('+', '-'):
            self.take()
        terms.append((sign, self.term()))
        while self.peek() in ('+', '-'):
            terms.append((-1 if self.take()[1] == '-' else 1, self.term()))
        return terms[0][1] if terms == [(1, terms[0][1])] else ('sum', terms)

    def starts_atom(self):
        kind, text = self.tokens[self.pos] if self.pos < len(self.tokens) else (0, '')
        return kind in (1, 3) or text in ('(', '{', '\\frac', '\\sqrt', '\\pi', '\\infty') or text[1:] in _FUNCS

    def term(self):
        factors = [(False, self.unary())]
        while True:
            if self.peek() in ('*', '\\cdot', '\\times', '/', '\\div'):
                factors.append((self.take()[1] in ('/', '\\div'), self.unary()))
            elif self.starts_atom():  # implicit multiplication: 2\sqrt{3}, 3x
                factors.append((False, self.power()))
            else:
                return factors[0][1] if len(factors) == 1 else ('prod', factors)

    def unary(self):
        if self.peek() in ('+', '-'):
            sign = -1 if self.take()[1] == '-' else 1
            self.nest()
            node = ('sum', [(sign, self.unary())])
            self.depth -= 1
            return node
        return self.power()

    def power(self):
        base = self.atom()
        if self.peek() != '^':
            return base
        self.take()
        self.nest()
        node = ('pow', base, self.unary())
        self.depth -= 1
        return node

    def arg(self):
        """A macro argument: a braced group or ONE token, so \\frac12 is 1/2 and \\sqrt2x is sqrt(2)*x."""
        kind, text = self.tokens[self.pos] if self.pos < len(self.tokens) else (0, '')
        if kind == 1 and len(text) > 1 and text[0] != '.':
            self.tokens[self.pos] = (1, text[1:])
            return ('n', complex(int(text[0])))
        return self.atom()

    def atom(self):
        kind, text = self.take()
        if kind == 1:
            if len(text) > 100:
                raise _Reject
            return ('n', complex(float(text)))
        if kind == 3:
            if text == 'i':  # MATH answers use i for the imaginary unit
                return ('n', 1j)
            self.names.add(text)
            return ('v', text)
        if text == '\\pi':
            return ('n', complex(math.pi))
        if text == '\\infty':  # a symbol of its own: equal to itself only
            self.names.add(text)
            return ('v', text)
        self.nest()
        if text in _CLOSE:
            node = self.expr()
            if self.take()[1] != _CLOSE[text]:
                raise _Reject
        elif text == '\\frac':
            node = ('prod', [(False, self.arg()), (True, self.arg())])
        elif text == '\\sqrt':
            index = None
            if self.peek() == '[':
                self.take()
                index = self.expr()
                if self.take()[1] != ']':
                    raise _Reject
            node = ('root', self.arg(), index)
        elif text[1:] in _FUNCS:
            node = ('fn', text[1:], self.power())
        else:
            raise _Reject
        self.depth -= 1
        return node


def _evaluate(node, env) -> complex:
    kind = node[0]
    if kind == 'n':
        return node[1]
    if kind == 'v':
        return env[node[1]]
    if kind == 'sum':
        return sum(sign * _evaluate(child, env) for sign, child in node[1])
    if kind == 'prod':
        value = complex(1)
        for divide, child in node[1]:
            v = _evaluate(child, env)
            value = value / v if divide else value * v
        return value
    if kind == 'pow':
        base, exponent = _evaluate(node[1], env), _evaluate(node[2], env)
        if abs(exponent) > 1e4:  # bounds the cost and the size: 9^{9^{9}} is refused, not computed
            raise OverflowError
        return base ** exponent
    if kind == 'root':
        index = 2 if node[2] is None else _evaluate(node[2], env)
        return cmath.sqrt(_evaluate(node[1], env)) if index == 2 else _evaluate(node[1], env) ** (1 / index)
    return _FUNCS[node[1]](_evaluate(node[2], env))


def _point(k: int, name: str) -> complex:
    """Fixed pseudo-random value of variable `name` at evaluation point k (the same in every process)."""
    return complex(random.Random(f'{k}:{name}').uniform(0.5, 2.5))


def _numeric_equal(a: str, b: str) -> bool:
    """Both sides parse and agree to a relative 1e-6 at every point where either can be evaluated."""
    try:
        pa, pb = _LatexParser(a), _LatexParser(b)
        ta, tb = pa.parse(), pb.parse()
    except (_Reject, ValueError):
        return False
    names = sorted(pa.names | pb.names)
    agreed = 0
    for k in range(5 if names else 1):
        env = {name: _point(k, name) for name in names}
        values = []
        for tree in (ta, tb):
            try:
                v = _evaluate(tree, env)
                values.append(v if cmath.isfinite(v) else None)
            except (ArithmeticError, ValueError):
                values.append(None)
        va, vb = values
        if va is None and vb is None:
            continue
        if va is None or vb is None or abs(va - vb) > 1e-6 * max(abs(va), abs(vb)) + 1e-12:
            return False
        agreed += 1
    return agreed > 0


def math_equal(pred: str, gold: str) -> bool:
    """MATH-style equivalence of a predicted and a gold answer (False on anything unparsable, never raises)."""
    if not isinstance(pred, str) or not isinstance(gold, str):
        return False
    if pred.strip() and pred.strip() == gold.strip():
        return True
    if len(pred) > MAX_CHARS or len(gold) > MAX_CHARS:
        return False
    try:
        return _equal_normalized(_normalize(pred), _normalize(gold))
    except RecursionError:  # defence in depth; the depth bounds should make this unreachable
        return False


# ---- Data files ----------------------------------------------------------------------------------------------------
def _load_rows(path: str) -> list[tuple[str, dict]]:
    """(where, row) for each object in a .jsonl file or a .json list; `where` is 'path:line' for error messages."""
    if not os.path.isfile(path):
        raise UsageError(f'data file not found: {path}')
    try:
        with open(path, encoding='utf-8') as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f'{path}: cannot be read as UTF-8 text ({e.__class__.__name__})') from None
    if path.endswith('.json'):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f'{path}:{e.lineno}: malformed JSON: {e.msg}') from None
        if not isinstance(items, list):
            raise UsageError(f'{path}: expected a JSON list of objects')
        rows = [(f'{path}: item {i}', item) for i, item in enumerate(items, 1)]
    else:
        rows = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append((f'{path}:{lineno}', json.loads(line)))
                except json.JSONDecodeError as e:
                    raise UsageError(f'{path}:{lineno}: malformed JSON: {e.msg}') from None
    if not rows:
        raise UsageError(f'{path}: no rows')
    for where, row in rows:
        if not isinstance(row, dict):
            raise UsageError(f'{where}: expected a JSON object')
    return rows


def _field(row: dict, where: str, *names):
    for name in names:
        if name in row:
            return row[name]
    raise UsageError(f"{where}: missing field '{names[0]}'")


def _chat(text: str, tokenizer, system: str | None = None) -> str | None:
    """The text wrapped in the tokenizer's chat template, or None when there is none. system None leaves the
    template's own default (SmolLM2's adds a 21-token system prompt to every row); a string, even '', is sent as the
    system message."""
    if tokenizer is None or not getattr(tokenizer, 'chat_template', None):
        return None
    system_turn = [] if system is None else [{'role': 'system', 'content': system}]
    return tokenizer.apply_chat_template(system_turn + [{'role': 'user', 'content': text}], tokenize=False,
                                         add_generation_prompt=True)


# ---- Tasks ---------------------------------------------------------------------------------------------------------
class Task:
    """Interface: examples(split, n, seed), prompt(example, tokenizer), reward/parts/answer(completion, example).
    File-backed tasks split rows by their 'split' field when present, else by a stable hash (about 20% test)."""
    name = ''
    needs_data = False
    default_data = None  # the bundled file a file-backed task reads when no --data is given
    format_bonus = 0.0   # reward of a well-formatted but wrong answer
    splits = ('train', 'test')  # toy4 adds 'val': tuning problems disjoint from both
    system = None  # the chat template's system message (None: the template's default); option system=TEXT

    def __init__(self, data: str | None = None):
        data = data or self.default_data
        if self.needs_data and not data:
            raise UsageError(f'task {self.name} needs --data FILE.jsonl')
        self.pool = None
        if data:
            self.pool = []
            for where, row in _load_rows(data):
                split = row.get('split')
                if split not in ('train', 'test'):
                    split = 'test' if _stable_hash(json.dumps(row, sort_keys=True)) % 5 == 0 else 'train'
                self.pool.append((split, self.from_row(row, where)))

    def from_row(self, row: dict, where: str) -> dict:
        raise NotImplementedError

    def generate(self, split: str, n: int, seed: int) -> list[dict]:
        raise UsageError(f'task {self.name} needs --data FILE.jsonl')

    def examples(self, split: str, n: int, seed: int) -> list[dict]:
        """The first n of a seeded shuffle of the split ('all' is accepted for file-backed tasks)."""
        if split not in (*self.splits, 'all'):
            raise UsageError(f"unknown split '{split}' for task {self.name} (choose from: {', '.join(self.splits)})")
        if self.pool is None:
            return self.generate(split, n, seed)
        chosen = [dict(ex) for s, ex in self.pool if split in ('all', s)]
        random.Random(seed).shuffle(chosen)
        return chosen[:max(n, 0)]

    def reward(self, completion: str, example: dict) -> float:
        return self.reward_from(self.parts(completion, example))

    def reward_from(self, parts: dict) -> float:
        """1.0 for a correct answer, format_bonus for a well-formed wrong one, 0.0 otherwise."""
        return 1.0 if parts['answer'] else self.format_bonus * parts['format']

    def judge(self, completion: str, example: dict):
        """(reward, parts, answer) of one completion, each parse done once: what a trainer needs of it."""
        parts = self.parts(completion, example)
        return self.reward_from(parts), parts, self.answer(completion, example)


class CountdownTask(Task):
    name, format_bonus = 'countdown', 0.1  # the TinyZero rule: countdown_reward (tested equal)

    def from_row(self, row, where):
        numbers, target = _field(row, where, 'nums', 'numbers'), _field(row, where, 'target')
        if not isinstance(numbers, list) or None in map(to_fraction, numbers) or to_fraction(target) is None:
            raise UsageError(f'{where}: numbers must be a list of numbers and target a number')
        return {'numbers': numbers, 'target': target}

    def generate(self, split, n, seed):
        """Random trees over all 3 or 4 numbers (1..99); kept when the target is an integer in 1..999."""
        rng, out = random.Random(seed), []
        while len(out) < n:
            numbers = [rng.randint(1, 99) for _ in range(rng.choice((3, 4)))]
            items = rng.sample(numbers, len(numbers))
            while len(items) > 1:  # join two neighbours at a random place: a random tree shape
                i = rng.randrange(len(items) - 1)
                items[i:i + 2] = [(rng.choice('+-*/'), items[i], items[i + 1])]
            value = _tree_value(items[0])
            if value is None or value.denominator != 1 or not 1 <= value <= 999:
                continue
            target = int(value)
            if split in ('all', 'test' if _stable_hash(f'{sorted(numbers)}:{target}') % 5 == 0 else 'train'):
                out.append({'numbers': numbers, 'target': target, 'solution': _show(items[0])})
        return out

    def prompt(self, example, tokenizer=None):
        text = (f"Using the numbers {list(example['numbers'])}, create an equation that equals {example['target']}. "
                'You can use basic arithmetic operations (+, -, *, /) and each number can only be used once. '
                'Show your work in <think> </think> tags. And return the final answer in <answer> </answer> tags, '
                'for example <answer> (1 + 2) / 3 </answer>.')
        chat = _chat(text, tokenizer, self.system)
        if chat is not None:
            return chat + 'Let me solve this step by step.\n<think>'
        return ('A conversation between User and Assistant. The user asks a question, and the Assistant solves it. '
                'The assistant first thinks about the reasoning process in the mind and then provides the user with '
                f'the answer.\nUser: {text}\nAssistant: Let me solve this step by step.\n<think>')

    def parts(self, completion, example):
        answer = extract_answer_tag(completion)
        correct = answer is not None and check_expression(answer, example['numbers'], example['target'])[1]
        return {'format': float(answer is not None), 'answer': float(correct)}

    def answer(self, completion, example):
        text = extract_answer_tag(completion)
        return re.sub(r'\s', '', text) if text is not None and _parse_arith(text) is not None else None

    def judge(self, completion, example):
        """parts and answer from one parse: check_expression's well_formed is _parse_arith(text) is not None."""
        text = extract_answer_tag(completion)
        well_formed, correct = (check_expression(text, example['numbers'], example['target']) if text is not None
                                else (False, False))
        parts = {'format': float(text is not None), 'answer': float(correct)}
        return self.reward_from(parts), parts, re.sub(r'\s', '', text) if well_formed else None


_NUM_IN_TEXT = re.compile(r'(?:(?<![\w.)])-)?(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)(?:/[0-9]+)?')


def _gsm8k_number(text: str) -> Fraction | None:
    """Final number of a GSM8K solution: after the last '####', else in the last \\boxed{}, else the last number."""
    if '####' in text:
        segment, pick = text.rsplit('####', 1)[1], 0
    else:
        boxed = extract_boxed(text)
        segment, pick = (boxed, 0) if boxed is not None else (text, -1)
    segment = re.sub(r'\\d?frac\{([0-9]+)\}\{([0-9]+)\}', r'\1/\2', segment.replace('\\$', '').replace('$', ''))
    segment = re.sub(r'(?<=[0-9]),(?=[0-9]{3}(?![0-9]))', '', segment)  # thousands separators only
    found = [s for s in _NUM_IN_TEXT.findall(segment) if len(s) <= 60]
    if not found:
        return None
    numerator, _, denominator = found[pick].partition('/')  # Fraction('1.5/2') is refused, so divide here
    divisor = Fraction(denominator or 1)
    return Fraction(numerator) / divisor if divisor else None


def _canonical_number(value: Fraction) -> str:
    """'1000', '2.5', '-3'; a non-terminating fraction as '1/3'."""
    for places in range(20):
        scaled = value * 10 ** places
        if scaled.denominator == 1:
            digits = str(abs(scaled.numerator)).rjust(places + 1, '0')
            text = digits if places == 0 else f'{digits[:-places]}.{digits[-places:]}'
            return ('-' if value < 0 else '') + text
    return f'{value.numerator}/{value.denominator}'


_BOXED_INSTRUCTION = '\nPlease reason step by step, and put your final answer within \\boxed{}.'


class Gsm8kTask(Task):
    name, needs_data = 'gsm8k', True
    default_data = os.path.join(DATA_DIR, 'gsm8k_test100.jsonl')

    def from_row(self, row, where):
        question, solution = _field(row, where, 'question'), _field(row, where, 'answer')
        gold = _gsm8k_number(str(solution))
        if gold is None:
            raise UsageError(f"{where}: no final number in field 'answer'")
        return {**row, 'question': question, 'gold': _canonical_number(gold)}

    def prompt(self, example, tokenizer=None):
        text = f"{example['question']}{_BOXED_INSTRUCTION}"
        return _chat(text, tokenizer, self.system) or text

    def parts(self, completion, example):
        value = _gsm8k_number(completion) if isinstance(completion, str) else None
        has_format = isinstance(completion, str) and ('####' in completion or extract_boxed(completion) is not None)
        # 'gold' is set by from_row; a raw row with only its worked 'answer' works too
        gold = Fraction(example['gold']) if 'gold' in example else _gsm8k_number(str(example.get('answer', '')))
        return {'format': float(has_format), 'answer': float(value is not None and value == gold)}

    def answer(self, completion, example):
        value = _gsm8k_number(completion) if isinstance(completion, str) else None
        return None if value is None else _canonical_number(value)


class MathTask(Task):
    name, needs_data = 'math', True
    default_data = os.path.join(DATA_DIR, 'math500.jsonl')

    def from_row(self, row, where):
        return {**row, 'problem': _field(row, where, 'problem'), 'answer': str(_field(row, where, 'answer'))}

    def prompt(self, example, tokenizer=None):
        text = f"{example['problem']}{_BOXED_INSTRUCTION}"
        return _chat(text, tokenizer, self.system) or text

    def parts(self, completion, example):
        boxed = extract_boxed(completion)
        return {'format': float(boxed is not None), 'answer': float(math_equal(boxed, example['answer']))}

    def answer(self, completion, example):
        boxed = extract_boxed(completion)
        return None if boxed is None or len(boxed) > MAX_CHARS else _normalize(boxed)


# ---- reasoning-gym tasks (optional package, Apache-2.0), scored by this module's own verifiers -----------------------
def rg_split(question: str) -> str:
    """'test' for 20% of reasoning-gym questions, 'val' for 10%, 'train' for the rest, by a hash of the question
    (test is the set it always was: hash % 5 == 0; val was taken from train)."""
    h = _stable_hash(question) % 10
    return 'test' if h % 5 == 0 else 'val' if h == 1 else 'train'


class ReasoningGymTask(Task):
    """`rg:NAME` with options after '?' (`rg:chain_sum?min_terms=2,max_terms=2,min_digits=1,max_digits=1`): the
    seeded problem generators of reasoning-gym 0.1.25 (pip install -r requirements-llm.txt). Only its problems and
    reference answers are used; its scorers are not, because some evaluate the text they score (its countdown scorer
    runs sympy's parse_expr, which calls eval). Here: datasets whose reference answer is a number are scored by the
    final number of the completion (after '####', else in the last \\boxed{}, else the last number), compared
    exactly; `rg:countdown` by this module's Countdown checker on the completion's last line. A well-formed answer
    that is wrong earns 0.1, as in the other tasks. Train, val and test are split by a stable hash of the question
    (rg_split)."""
    format_bonus = 0.1
    splits = ('train', 'val', 'test')

    def __init__(self, dataset: str, data: str | None = None, **options):
        try:
            import reasoning_gym
        except ImportError:
            raise UsageError(f'--task rg:{dataset} needs the optional package reasoning-gym: '
                             f'pip install -r requirements-llm.txt') from None
        super().__init__(None)
        self.name, self.dataset, self.settings, self.rg = f'rg:{dataset}', dataset, options, reasoning_gym
        probe = self._entries(seed=0, size=8)
        self.kind = 'countdown' if dataset == 'countdown' else 'number'
        if self.kind == 'number' and any(to_fraction(str(e['answer']).replace(',', '')) is None for e in probe):
            raise UsageError(f'rg:{dataset}: its answers are not numbers, and this project has its own verifier only '
                             f'for numeric answers and for countdown')

    def _entries(self, seed, size):
        try:
            return list(self.rg.create_dataset(self.dataset, seed=seed, size=size, **self.settings))
        except Exception as e:  # unknown dataset, bad option name or value: reasoning-gym's own message, one line
            raise UsageError(f"rg:{self.dataset}: {' '.join(str(e).split())[:200] or type(e).__name__}") from None

    def generate(self, split, n, seed):
        """The first n distinct questions of the split in reasoning-gym's seeded order. A small dataset repeats its
        questions (two-term one-digit chain_sum has 143 train, 16 val, 41 test), and a repeated problem would count
        twice in a Pass@k and in an interval: train returns what there is; val and test refuse to pad."""
        size, found = max(16, 6 * n if split == 'test' else 2 * n), -1
        while True:  # each round from scratch: a dataset whose first entries depend on its size stays consistent
            seen, out = set(), []
            for e in self._entries(seed, size):
                if split in ('all', rg_split(e['question'])) and e['question'] not in seen:
                    seen.add(e['question'])
                    out.append({'question': e['question'], 'answer': str(e['answer']),
                                **{k: e['metadata'][k] for k in ('numbers', 'target') if k in e['metadata']}})
            if len(out) >= n or size > 100 * n + 2000 or (len(out) == found and size > 4 * n):
                break
            size, found = size * 2, len(out)
        if len(out) < n and split != 'train':
            raise UsageError(f'{self.name}: its {split} split has {len(out)} distinct questions, fewer than the '
                             f'{n} asked for (a harder variant has more, e.g. max_digits=2)')
        return out[:n]

    def prompt(self, example, tokenizer=None):
        return _chat(example['question'], tokenizer, self.system) or example['question']

    def _expression(self, completion):
        lines = [x.strip() for x in completion.strip().splitlines() if x.strip()] if isinstance(completion, str) else []
        return lines[-1].split('=')[0].rstrip('. ') if lines else ''

    def parts(self, completion, example):
        if self.kind == 'countdown':
            well_formed, correct = check_expression(self._expression(completion), example['numbers'],
                                                    example['target'])
            return {'format': float(well_formed), 'answer': float(correct)}
        value = _gsm8k_number(completion) if isinstance(completion, str) else None
        gold = to_fraction(example['answer'].replace(',', ''))
        return {'format': float(value is not None), 'answer': float(value is not None and value == gold)}

    def answer(self, completion, example):
        if self.kind == 'countdown':
            text = self._expression(completion)
            return re.sub(r'\s', '', text) if _parse_arith(text) is not None else None
        value = _gsm8k_number(completion) if isinstance(completion, str) else None
        return None if value is None else _canonical_number(value)


DRAWS = 200_000  # draws of a toy problem before its target range is called unreachable


# ---- The toy task (toy.py reproduces this distribution and split; test_all.py checks that) -------------------------
def toy_problem(rng: random.Random, min_target: int = 0, max_target: int = 99) -> dict:
    """Draw one toy problem. Exactly, in this order: numbers = [rng.randint(1, 9) for 3]; a, b, c =
    rng.sample(numbers, 3); o1 = rng.choice('+-*'); o2 = rng.choice('+-*'); left = rng.random() < 0.5 gives
    ((a o1 b) o2 c), else (a o1 (b o2 c)); the whole draw repeats unless min_target <= target <= max_target
    (0..99: the distribution toy.py pretrains on)."""
    for _ in range(DRAWS):  # a range no tree reaches would loop forever
        numbers = [rng.randint(1, 9) for _ in range(3)]
        a, b, c = rng.sample(numbers, 3)
        o1, o2 = rng.choice('+-*'), rng.choice('+-*')
        tree = (o2, (o1, a, b), c) if rng.random() < 0.5 else (o1, a, (o2, b, c))
        target = int(_tree_value(tree))
        if min_target <= target <= max_target:
            return {'numbers': numbers, 'target': target}
    raise UsageError(f'no toy problem has a target in {min_target}..{max_target} ({DRAWS:,} draws)')


def toy_split(numbers, target) -> str:
    """'test' for about a quarter of all problems, by a hash of the problem: train and test never share one."""
    a, b, c = numbers
    return 'test' if _stable_hash(f'{a} {b} {c}:{target}') % 4 == 0 else 'train'


def toy_solutions(numbers, target) -> list[str]:
    """Every distinct correct binary expression over the numbers (+ - * /, minimal parentheses), sorted."""
    goal = to_fraction(target)
    if goal is None:
        return []
    return sorted(text for text, value in _expressions(numbers, '+-*/').items() if value == goal)


def _expressions(numbers, ops) -> dict:
    """{text: exact value} of every binary expression using each number once (minimal parentheses; value None on
    division by zero): distinct trees can print alike, and the text is what a model writes."""
    return {_show(tree): _tree_value(tree) for order in set(itertools.permutations(numbers))
            for tree in _trees(list(order), ops)}


class ToyTask(Task):
    """The embedded model's task. Options (`toy?min_target=100,max_target=729`) draw targets from another range: the
    model was pretrained and is post-trained on 0..99 only, so 100..729 is a problem family it never saw."""
    name, format_bonus = 'toy', 0.1
    options = {'min_target': 0, 'max_target': 99}
    largest = 9 ** 3  # the largest target its numbers reach
    draw, split_of = staticmethod(toy_problem), staticmethod(toy_split)

    def __init__(self, data: str | None = None, **options):
        super().__init__(None)  # procedural only; a data file has no meaning here
        lo, hi = (options.get(k, self.options[k]) for k in ('min_target', 'max_target'))
        if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi <= self.largest):
            raise UsageError(f'{self.name} needs integer targets 0 <= min_target <= max_target <= {self.largest}; '
                             f'got {lo}..{hi}')
        self.min_target, self.max_target = lo, hi

    def generate(self, split, n, seed):
        rng, out = random.Random(seed), []
        while len(out) < n:
            problem = self.draw(rng, self.min_target, self.max_target)
            if split in ('all', self.split_of(problem['numbers'], problem['target'])):
                out.append(problem)
        return out

    def prompt(self, example, tokenizer=None):
        return ' '.join(map(str, example['numbers'])) + f":{example['target']}="

    @staticmethod
    def _expression(completion) -> str:
        return completion.split('\n', 1)[0].strip() if isinstance(completion, str) else ''

    def parts(self, completion, example):
        well_formed, correct = check_expression(self._expression(completion), example['numbers'], example['target'])
        return {'format': float(well_formed), 'answer': float(correct)}

    def answer(self, completion, example):
        text = self._expression(completion)
        return re.sub(r'\s', '', text) if _parse_arith(text) is not None else None

    def judge(self, completion, example):
        """parts and answer from one parse (ES scores every member's completion of every prompt with it)."""
        text = self._expression(completion)
        well_formed, correct = check_expression(text, example['numbers'], example['target'])
        parts = {'format': float(well_formed), 'answer': float(correct)}
        return self.reward_from(parts), parts, re.sub(r'\s', '', text) if well_formed else None


# ---- The toy4 task, the headroom setting (toy.py reproduces its distribution and split; test_all.py checks that) -
def toy4_problem(rng: random.Random, min_target: int = 100, max_target: int = 999) -> dict:
    """Draw one toy4 problem. Exactly, in this order: numbers = [rng.randint(1, 9) for 4]; items =
    rng.sample(numbers, 4); while more than one item: i = rng.randrange(len(items) - 1), items[i:i+2] =
    [(rng.choice('+-*'), items[i], items[i+1])]; the whole draw repeats unless min_target <= value <= max_target."""
    for _ in range(DRAWS):  # a range no tree reaches would loop forever
        numbers = [rng.randint(1, 9) for _ in range(4)]
        items = rng.sample(numbers, 4)
        while len(items) > 1:
            i = rng.randrange(len(items) - 1)
            items[i:i + 2] = [(rng.choice('+-*'), items[i], items[i + 1])]
        target = int(_tree_value(items[0]))
        if min_target <= target <= max_target:
            return {'numbers': numbers, 'target': target}
    raise UsageError(f'no toy4 problem has a target in {min_target}..{max_target} ({DRAWS:,} draws)')


def toy4_split(numbers, target) -> str:
    """'test' for 20% of all problems, 'val' for 10%, 'train' for the rest, by a hash of the problem."""
    h = _stable_hash(' '.join(map(str, numbers)) + f':{target}') % 10
    return 'test' if h < 2 else 'val' if h == 2 else 'train'


def toy4_guess_rate(numbers, target) -> float:
    """The chance that a uniform draw among the well-formed answers (distinct expressions using each number once,
    + - *, minimal parentheses) is correct: the share of problems a blind guesser solves per sample."""
    values = _expressions(numbers, '+-*').values()
    return sum(v == target for v in values) / len(values)


class Toy4Task(ToyTask):
    """The headroom setting: four numbers 1..9, + - * only, targets 100..999, so that a blind guess solves under 1%
    of problems per sample and Pass@64 measures reasoning coverage rather than guessing (models/toy4 is pretrained
    on its train split). Options draw another target range (`toy4?min_target=10,max_target=99` is a family the
    model never saw: the forgetting check). Splits: train, val (for tuning), test (held out)."""
    name = 'toy4'
    options = {'min_target': 100, 'max_target': 999}
    splits = ('train', 'val', 'test')
    largest = 9 ** 4
    draw, split_of = staticmethod(toy4_problem), staticmethod(toy4_split)


TASKS = {'countdown': CountdownTask, 'gsm8k': Gsm8kTask, 'math': MathTask, 'toy': ToyTask, 'toy4': Toy4Task}


def _option_value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {'true': True, 'false': False}.get(text.lower(), text)


def get_task(name: str, data: str | None = None) -> Task:
    """A task by name, options after '?': 'toy', 'toy?min_target=100,max_target=729', 'rg:chain_sum?min_terms=2'.
    Every task takes system=TEXT (the chat template's system message; 'system=' an empty one)."""
    base, _, text = name.partition('?')
    options = {}
    for item in filter(None, (x.strip() for x in text.split(','))):
        key, eq, value = item.partition('=')
        if not eq or not key.strip():
            raise UsageError(f"task options are key=value pairs after '?', joined by commas; got {item!r} in {name!r}")
        options[key.strip()] = _option_value(value.strip())
    system = options.pop('system', None)  # every task: the chat template's system message ('system=' sends '')
    task = _task(base, data, options)
    if system is not None:
        task.system = str(system)
    return task


def _task(base: str, data: str | None, options: dict) -> Task:
    if base.startswith('rg:') and len(base) > 3:
        return ReasoningGymTask(base[3:], data, **options)
    if base not in TASKS:
        raise UsageError(f"unknown task '{base}' (choose from: {', '.join(TASKS)}, rg:NAME)")
    accepted = getattr(TASKS[base], 'options', {})
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise UsageError(f"task {base} has no option {unknown[0]!r} (options: {', '.join(accepted) or 'none'})")
    return TASKS[base](data, **options)
