"""The ``math`` verifier: each extraction path, each normalisation, hedging, options, hostile input."""

from __future__ import annotations

import threading
import time
from fractions import Fraction

import pytest

from rlvr.verifiers import get_verifier
from rlvr.verifiers.math.answer import Choice, Interval, Matrix, Relation, Scalar, Seq, Text, Union_, parse_answer
from rlvr.verifiers.math.equivalence import compare
from rlvr.verifiers.math.evaluate import evaluate
from rlvr.verifiers.math.expr import TooLarge, parse_expr
from rlvr.verifiers.math.extract import choice_letters, extract
from rlvr.verifiers.math.normalize import normalize


@pytest.fixture(scope="module")
def math():
    return get_verifier("math")


def score(verifier, completion, answer):
    return verifier.score(completion, {"answer": answer})


# ----------------------------------------------------------------------------- extraction paths
@pytest.mark.parametrize("text, answers, source", [
    (r"so $x = \boxed{12}$.", ["12"], "boxed"),
    (r"\boxed{\frac{3}{4}} is the probability", [r"\frac{3}{4}"], "boxed"),
    (r"\fbox{7}", ["7"], "boxed"),
    (r"the remainder is \boxed 5.", ["5"], "boxed"),
    (r"\boxed{\boxed{3}}", [r"\boxed{3}"], "boxed"),
    (r"\boxed{3 unclosed", [], "truncated"),
    ("The answer is 12.", ["12"], "statement"),
    ("So the final answer is $\\frac{1}{2}$, as required.", ["\\frac{1}{2}"], "statement"),
    ("The answer to the question is 9 apples.", ["9 apples"], "statement"),
    ("The correct option is (B).", ["(B)"], "statement"),
    ("We get 9 eggs.\n#### 18", ["18"], "statement"),
    ("Steps.\nAnswer: 17", ["17"], "statement"),
    ("**Final Answer:** $\\dfrac{9}{4}$", ["\\dfrac{9}{4}"], "statement"),
    ("### Final Answer\n\n64", ["64"], "statement"),
    ("<think>12 + 30</think><answer>42</answer>", ["42"], "answer_tag"),
    ("<answer>so \\boxed{7}</answer>", ["7"], "answer_tag"),
    ("Thus the total is **73**.", ["73"], "bold"),
    ("She has 12 apples left.", ["12"], "last_number"),
    ("Candidates: 1, 2, 3, 4, 5", [], "enumeration"),
    ("Let me think. " * 20 + "So 6 * 7 = 4", [], "truncated"),
    ("no numbers at all", [], None),
])
def test_extraction_paths(text, answers, source):
    found = extract(text)
    assert found.answers == answers
    assert found.source == source


def test_think_block_is_skipped_once_closed():
    assert extract("<think>maybe \\boxed{3}</think> The answer is 5.").answers == ["5"]
    assert extract("<think>still thinking \\boxed{3}").answers == ["3"]  # never closed: read it all
    assert extract("<think>x \\boxed{3}</think>", think_tag="think").answers == ["3"]  # nothing after it


def test_statement_after_the_last_box_is_part_of_the_answer():
    assert extract("\\boxed{5}. The answer is 6.").answers == ["5", "6"]
    assert extract("The answer is 5. \\boxed{5}").answers == ["5"]


def test_prose_after_answer_is_is_not_an_answer():
    assert extract("\\boxed{20}. We can check that our answer is correct by plugging in $x=2$.").answers == ["20"]
    assert extract("The answer is not 5, since 5 fails. The answer is 6.").answers == ["6"]


def test_fallback_none_disables_the_last_number(math):
    strict = get_verifier("math", fallback="none")
    assert score(math, "She has 12 apples left.", "12").score == 1.0
    assert score(strict, "She has 12 apples left.", "12").score == 0.0
    assert score(strict, "She has 12 apples left.", "12").info["extracted"] is None


def test_giant_input_reads_only_the_tail():
    found = extract("x " * 200_000 + "\\boxed{42}", max_chars=1000)
    assert found.answers == ["42"]


@pytest.mark.parametrize("answer, letters", [
    ("(D)", {"D"}), ("**Answer: B**", {"B"}), (r"\textbf{(A)}", {"A"}), ("C) 42", {"C"}),
    ("B because C is wrong", {"B"}), ("A or B", {"A", "B"}), ("B/D", {"B", "D"}), ("(A) or (C)", {"A", "C"}),
    ("Option E", {"E"}), ("no letter here", set()),
])
def test_choice_letters(answer, letters):
    assert choice_letters(answer, "ABCDE") == letters


# ----------------------------------------------------------------------------- normalisation
@pytest.mark.parametrize("raw, clean, percent", [
    ("$\\dfrac{1}{2}$", "\\frac{1}{2}", False),
    ("1{,}234", "1,234", False),
    ("10,\\!080", "10,080", False),
    ("1\\,234", "1234", False),
    ("\\$18.90", "18.90", False),
    ("50\\%", "50", True),
    ("90^\\circ", "90", False),
    ("90°", "90", False),
    ("15\\mbox{ cm}^2", "15", False),
    ("5.4 \\text{ cents}", "5.4", False),
    ("\\text{Evelyn}", "Evelyn", False),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "( 3, \\frac{\\pi}{2} )", False),
    ("52_8", "52", False),
    ("2 \\times 3", "2 * 3", False),
    ("x \\leq 3", "x <= 3", False),
])
def test_normalize(raw, clean, percent):
    n = normalize(raw)
    assert n.text == clean
    assert n.percent is percent


@pytest.mark.parametrize("completion, gold", [
    (r"\boxed{1,234}", "1234"),                      # thousands separators
    (r"\boxed{1\,234}", "1234"),
    (r"\boxed{10080}", r"10,\!080"),
    (r"\boxed{+7}", "7"),                            # explicit sign
    (r"\boxed{\$18.90}", "18.9"),                    # dollars
    (r"\boxed{36 \text{ dollars}}", r"\$36"),
    (r"\boxed{25\%}", "25"),                         # percent either way round
    (r"\boxed{0.25}", r"25\%"),
    (r"\boxed{15 \text{ cm}^2}", "15"),              # units
    ("The answer is 12 apples.", "12"),
    ("The speed is 5 m/s.", "5"),
    (r"\boxed{90^\circ}", "90"),                     # degrees
    ("The angle is 30°.", r"30^\circ"),
    (r"\boxed{\text{13}}", "13"),                    # \text{}
    (r"\boxed{\text{Evelyn}}", r"\text{Evelyn}"),
    (r"\boxed{\dfrac{3}{4}}", r"\frac34"),           # \dfrac, short \frac
    (r"\boxed{1\frac{4}{5}}", r"\frac{9}{5}"),       # mixed number
    ("The answer is sqrt(3).", r"\sqrt{3}"),         # plain-text math
    ("The answer is pi/2.", r"\frac{\pi}{2}"),
    ("The answer is (x+1)/(x-1).", r"\frac{x+1}{x-1}"),
    ("The answer is 2√3.", r"2\sqrt{3}"),
    (r"\boxed{6.02e23}", r"6.02 \times 10^{23}"),    # scientific notation
    ("The answer is 2.5 million.", "2500000"),
    (r"\boxed{1.5 \cdot 10^{-3}}", "0.0015"),
    ("The answer is (D).", "D"),                     # multiple choice in any dressing
    ("**Answer: B**", r"\text{(B)}"),
    (r"\boxed{\textbf{(A)}}", "A"),
    (r"\boxed{(-\infty, 3]}", r"(-\infty,3]"),       # intervals
    (r"\boxed{-2 \le x \le 7}", r"x \in [-2,7]"),
    (r"\boxed{(-\infty, 2) \cup (3, \infty)}", r"(3,\infty) \cup (-\infty,2)"),
    (r"\boxed{\{1, 2\}}", r"\{2, 1\}"),             # sets ignore order
    (r"\boxed{1, -2}", "-2,1"),
    (r"\boxed{x = 3}", "3"),                         # equations
    (r"\boxed{3}", "x=3"),
    (r"\boxed{y = -\frac{1}{2}x + \frac{3}{4}}", "2x+4y-3=0"),
    (r"\boxed{\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}}", r"\begin{bmatrix} 1 & 2 \\ 3 & 4 \end{bmatrix}"),
    (r"\boxed{\begin{pmatrix} -2 \\ -14 \\ -7 \end{pmatrix}}", "(-2, -14, -7)"),
    (r"\boxed{(a+5)(b+2)}", "ab+2a+5b+10"),          # formulas: same function of the variables
    (r"\boxed{2^{-100}}", r"\frac{1}{2^{100}}"),
    (r"\boxed{1 + \sqrt{19}, 1 - \sqrt{19}}", r"1 \pm \sqrt{19}"),
])
def test_normalisations_match(math, completion, gold):
    reward = score(math, completion, gold)
    assert reward.status == "ok"
    assert reward.score == 1.0, reward.info


@pytest.mark.parametrize("completion, gold", [
    (r"\boxed{1,235}", "1234"),
    (r"\boxed{(1, 2)}", "(2,1)"),                     # ordered pairs keep their order
    (r"\boxed{[3,4)}", "(3,4]"),                      # interval ends differ
    (r"\boxed{2^{-98}}", "2^{-99}"),                  # tiny values: relative tolerance
    (r"\boxed{\frac{1}{2004!}}", r"\frac{1}{2006!}"),
    (r"\boxed{0.0000001}", "0.0000002"),
    (r"\boxed{3.14}", r"\pi"),                        # an approximation is not the exact value
    (r"\boxed{x+1}", "t+1"),                          # different variables
    (r"\boxed{5x - 7y + 11z - 4 = 0}", "5x - 7y + 11z + 4 = 0"),
    (r"\boxed{1728}", r"1331 \text{ and } 1728"),     # part of a multi-part gold
    ("The answer is (C).", "D"),
    (r"\boxed{12:00}", "1:00"),
])
def test_wrong_answers_score_zero(math, completion, gold):
    reward = score(math, completion, gold)
    assert (reward.status, reward.score) == ("ok", 0.0), reward.info


def test_tolerance_option():
    assert score(get_verifier("math"), r"\boxed{3.1416}", "3.14159").score == 0.0
    # a decimal gold is exact to its written digits unless exact_decimals is switched off
    assert score(get_verifier("math", tolerance=1e-4), r"\boxed{3.1416}", "3.14159").score == 0.0
    assert score(get_verifier("math", tolerance=1e-4, exact_decimals=False), r"\boxed{3.1416}", "3.14159").score == 1.0
    assert score(get_verifier("math", tolerance=1e-4), r"\boxed{3.1416}", r"\pi").score == 1.0
    # exact rationals are exact whatever the tolerance
    assert score(get_verifier("math", tolerance=0.1), r"\boxed{\frac{1}{3}}", r"\frac{1}{3}").score == 1.0
    with pytest.raises(ValueError):
        get_verifier("math", tolerance=2)


def test_gold_answer_forms(math):
    assert score(math, "\\boxed{18}", "She makes 9 * 2 = $18.\n#### 18").score == 1.0  # a GSM8K solution
    assert score(math, "\\boxed{5}", "so the answer is $\\boxed{5}$").score == 1.0  # a MATH solution
    assert score(math, "\\boxed{27}", 27.0).score == 1.0  # AMC golds are floats
    assert score(math, "\\boxed{4}", ["2", "4"]).score == 1.0  # a list is a set of acceptable answers


# ----------------------------------------------------------------------------- hedging
@pytest.mark.parametrize("completion, gold", [
    (r"It could be \boxed{3} or maybe \boxed{4}.", "3"),
    (r"It could be \boxed{3} or maybe \boxed{4}.", "4"),
    (r"\boxed{4}. Wait, that's wrong: \boxed{5}", "4"),  # a self-correction: the last answer counts
    (r"The answer is \boxed{3 \text{ or } 4}.", "3"),
    ("The answer is 3 or 4.", "4"),
    ("The answer is either 5 or 6.", "5"),
    ("The answer is A or B.", "A"),
    ("**Answer: B/D**", "D"),
    (r"\boxed{A, C}", "A"),
    ("Possible values: 1, 2, 3, 4, 5", "5"),
    (r"The answer is \boxed{2, 3, 5, 7}.", "7"),
    ("Let me compute step by step. " * 10 + "First 12 + 30 = 4", "4"),
    (r"\boxed{5}" + "\n\nAnswer: 6", "6"),
    ("#### 10\n#### 12", "12"),
    ("<answer>3</answer><answer>4</answer>", "4"),
    (r"\boxed{1} \boxed{2} \boxed{3} \boxed{4} \boxed{5} \boxed{6} \boxed{7}", "7"),
    (r"\boxed{\pm 3}", "3"),
])
def test_hedging_scores_zero(math, completion, gold):
    reward = score(math, completion, gold)
    assert reward.score == 0.0, reward.info


@pytest.mark.parametrize("completion, gold", [
    (r"The roots are \boxed{3} and \boxed{5}.", "3, 5"),
    (r"The roots are \boxed{5} and \boxed{3}.", "3, 5"),
    (r"The answer is x = 2 or x = -2.", r"\pm 2"),
    (r"The solutions are $\boxed{-1}$ or $\boxed{4}$.", r"\{-1, 4\}"),
    (r"\boxed{(1, 2)} and \boxed{(3, 4)}", r"(1,2), (3,4)"),
    (r"\boxed{42}. The answer is 42.", "42"),  # the same answer twice is one answer
    (r"\boxed{\frac12}. Answer: 0.5", "0.5"),
])
def test_multi_part_answers_and_repeats_score_one(math, completion, gold):
    assert score(math, completion, gold).score == 1.0


def test_hedging_penalty_can_be_switched_off():
    lenient = get_verifier("math", penalize_hedging=False)
    assert score(lenient, r"\boxed{3} or \boxed{4}", "4").score == 1.0  # the last answer counts
    assert score(lenient, "The answer is A or B.", "B").score == 1.0


# ----------------------------------------------------------------------------- statuses and info
def test_missing_gold_is_an_error_not_a_zero(math):
    reward = math.score(r"\boxed{1}", {})
    assert reward.status == "error" and reward.failed
    assert "answer" in reward.info["error"]


def test_info_extracted_convention(math):
    assert score(math, r"\boxed{42}", "42").info["extracted"] == "42"
    assert score(math, "no answer here", "42").info["extracted"] is None


def test_answer_key_option():
    v = get_verifier("math", answer_key="solution")
    assert v.score(r"\boxed{7}", {"solution": "7"}).score == 1.0


def test_sympy_fallback_decides_what_the_fast_path_cannot(math):
    reward = score(math, r"\boxed{\sum_{k=1}^{10} k}", "55")
    assert reward.score == 1.0 and reward.info["method"] == "sympy"


# ----------------------------------------------------------------------------- the fast parser
def test_expression_parser_exact_and_guarded():
    assert evaluate(parse_expr(r"\frac{1}{2} + \frac13").tree) == __import__("fractions").Fraction(5, 6)
    assert evaluate(parse_expr(r"\sqrt[3]{-8}").tree) == -2
    assert evaluate(parse_expr(r"\binom{10}{3}").tree) == 120
    with pytest.raises(TooLarge):
        evaluate(parse_expr(r"2^{2^{2^{2^{2^{2}}}}}").tree)
    with pytest.raises(TooLarge):
        evaluate(parse_expr(r"(10^{10})!").tree)


@pytest.mark.parametrize("raw, kind", [
    ("3", Scalar), ("(1, 2)", Seq), ("(3, 4]", Interval), (r"\begin{pmatrix}1\\2\end{pmatrix}", Matrix),
    ("y = 2x", Relation), (r"\text{(C)}", Choice), (r"\text{east}", Text), ("x > 3", Interval),
])
def test_answer_shapes(raw, kind):
    assert isinstance(parse_answer(raw), kind)


def test_compare_is_relative_for_tiny_values():
    tiny_a, tiny_b = parse_answer("1.0e-30"), parse_answer("1.5e-30")
    assert compare(tiny_a, tiny_b, 1e-6) is False
    assert compare(parse_answer("1.0e-30"), parse_answer("10^{-30}"), 1e-6) is True


# ----------------------------------------------------------------------------- hostile input
HOSTILE = [
    r"\boxed{2^{2^{2^{2^{2^{2^{2^{2}}}}}}}}",
    r"\boxed{9^{9^{9^{9}}}}",
    r"\boxed{" + "(" * 5000 + "1" + ")" * 5000 + "}",
    r"\boxed{(10^{10})!}",
    r"\boxed{" + r"\frac{1}{" * 500 + "2" + "}" * 500 + "}",
    r"\boxed{\begin{pmatrix}" + r" \\ ".join(" & ".join(["1"] * 200) for _ in range(200)) + r"\end{pmatrix}}",
    r"\boxed{\sum_{k=1}^{10^{12}} k^{k}}",
    r"\boxed{" + "9" * 200_000 + "}",
    "junk " * 400_000,
    "The answer is " + "1e|" * 1000,
    r"\boxed{" + r"1 \pm " * 200 + "1}",
]


def test_hostile_input_fails_fast_in_process_from_a_worker_thread(math):
    """Without any process around it, the verifier itself refuses what would run away."""
    results = {}

    def work():
        for i, text in enumerate(HOSTILE):
            start = time.perf_counter()
            reward = score(math, text, "42")
            results[i] = (reward.score, reward.status, time.perf_counter() - start)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the verifier hung on hostile input"
    for i, (value, status, seconds) in results.items():
        assert value == 0.0, (i, status)
        assert status in ("ok", "error")
        assert seconds < 5, (i, seconds)


def test_no_super_linear_patterns_on_long_repetitive_input(math):
    """Every regular expression and parser step must stay near-linear: repeated fragments found by
    fuzzing once took 20-60 s (a backtracking number pattern, ANTLR on |-bars, \\pm expansion)."""
    fragments = ["9", "\\", "1e|", "\\pm", "(", "{", "answer is ", "$", "**", "<answer>", "1,", "1.", "or maybe 1 ",
                 "\\overline{", "x 10^", "\\frac{", "=", " U ", "Answers: ", "\n", "\\boxed{"]
    for fragment in fragments:
        for text in (fragment * (20_000 // len(fragment)), "The answer is " + fragment * (3_000 // len(fragment)),
                     "\\boxed{" + fragment * (3_000 // len(fragment)) + "}"):
            start = time.perf_counter()
            reward = score(math, text, "42")
            assert time.perf_counter() - start < 2.0, (fragment, len(text))
            assert reward.score == 0.0


# ----------------------------------------------------------------------------- Math-Verify's suite
# The failure groups found by scoring the verifier on Math-Verify's own unit tests
# (tests/test_math_verify_suite.py); each fix at its own layer, with our own examples.
@pytest.mark.parametrize("gold, pred, expected", [
    ("|PQ| = 12", "12", 1), ("|PQ| = 12", "13", 0),            # a label on the left: the value is the gold
    ("g(t) = 7", "7", 1), ("(m, n) = (4, 9)", "(4, 9)", 1), ("(m, n) = (4, 9)", "(9, 4)", 0),
    ("A_1:A_2 = 2:5", "2:5", 1), (r"\frac{PM}{MQ} = \frac{1}{\sqrt3}", r"\frac{\sqrt3}{3}", 1),
    ("x + y = 5", "5", 0), ("2x = 6", "6", 0), ("2x = 6", "3", 0),  # a sum or a coefficient is no label
    ("a=3, b=1; a=5, b=1", "(3,1),(5,1)", 1), ("a=3, b=1; a=5, b=1", "(1,3),(1,5)", 0),
    ("x=1, y=2", "(1, 2)", 1), ("x=1, y=2", "(2, 1)", 0),
])
def test_named_left_side_states_the_value(gold, pred, expected):
    assert compare(parse_answer(gold), parse_answer(pred), 1e-6) is bool(expected)


def test_relation_label_flag():
    from rlvr.verifiers.math.answer import is_label

    assert parse_answer("f(x) = 1").named and parse_answer("|AB| = 1").named and parse_answer("x = 1").named
    assert not parse_answer("x + y = 1").named and not parse_answer("2x = 1").named
    assert is_label(r"S_{ABC}:S") and is_label(r"V_{1}") and not is_label("x^2") and not is_label(r"\sqrt{x}")


@pytest.mark.parametrize("text, value", [
    ("x = 3 + 4 + 1 = 8", 8), ("x = 3 + 4 + 1 = 7 = 8", 8),        # a chain: the named unknown is the last member
    (r"x = \frac13 \approx 0.33", Fraction(1, 3)),                # the exact value before \approx
    (r"x \approx 2.5", Fraction(5, 2)), (r"\frac13 \approx 0.33", Fraction(1, 3)),
])
def test_chains_and_approximations(text, value):
    answer = parse_answer(text)
    if isinstance(answer, Relation):
        answer = answer.rhs
    assert isinstance(answer, Scalar) and evaluate(answer.expr.tree) == value


def test_chained_inequalities_are_intervals():
    two = parse_answer(r"2 \le |w| \le 5")
    assert isinstance(two, Union_) and len(two.items) == 2
    assert compare(two, parse_answer(r"[-5, -2] \cup [2, 5]"), 1e-6) is True
    assert compare(two, parse_answer("[2, 5]"), 1e-6) is False
    assert compare(parse_answer(r"0 \le |w| < 5"), parse_answer("(-5, 5)"), 1e-6) is True
    assert isinstance(parse_answer("0 < g(x) < 4"), Interval)
    assert not isinstance(parse_answer("0 < 2x + y < 4"), Interval)


def test_gold_lists_with_or_and_semicolons():
    assert compare(parse_answer("2, 7 or 9"), parse_answer("9, 2, 7"), 1e-6) is True
    assert compare(parse_answer("x < -1 or x > 3"), parse_answer(r"(-\infty, -1) \cup (3, \infty)"), 1e-6) is True
    assert isinstance(parse_answer("a=3, b=1; a=5, b=1"), Seq) and len(parse_answer("a=3, b=1; a=5, b=1").items) == 2
    assert len(parse_answer("-4; -3; 1").items) == 3  # a plain ";" list stays flat


def test_unescaped_braces_are_a_list_and_repeats_count_once():
    assert parse_answer("{2, 6}") == Seq(parse_answer("2, 6").items, "list")
    assert compare(parse_answer("(2, 6)"), parse_answer("{2, 6}"), 1e-6) is True
    assert compare(parse_answer("(6, 2)"), parse_answer("{2, 6}"), 1e-6) is False
    assert compare(parse_answer(r"\{6, 2\}"), parse_answer("{2, 6}"), 1e-6) is True
    assert compare(parse_answer("(1,2),(3,4)"), parse_answer("(1,2), (3,4), (1,2)"), 1e-6) is True
    assert compare(parse_answer("(1, 2, 2)"), parse_answer("(1, 2)"), 1e-6) is False  # a tuple keeps its entries


@pytest.mark.parametrize("text, numeric_gold, value", [
    ("1000,99", True, Fraction(100099, 100)), ("0,111", True, Fraction(111, 1000)), ("12,500", True, 12500),
    ("12 500", True, 12500), ("0,111", False, None), ("48, 120", True, None),  # a comma and a space: a list
])
def test_digit_grouping_and_decimal_commas(text, numeric_gold, value):
    answer = parse_answer(text, numeric_gold=numeric_gold)
    if value is None:
        assert isinstance(answer, Seq)
    else:
        assert isinstance(answer, Scalar) and evaluate(answer.expr.tree) == value


def test_gold_decimal_comma_only_when_the_answer_writes_the_decimal(math):
    assert score(math, "1.22", "1,22").score == 1.0
    assert score(math, r"\boxed{1, 22}", "1,22").score == 1.0  # MATH writes lists this way ("0,1", "27,93")
    assert score(math, "1.23", "1,22").score == 0.0


def test_doubled_backslashes_are_read_once(math):
    assert normalize(r"-2 \\le x \\le 7").text == "-2 <= x <= 7"
    assert normalize(r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}").text.count("\\\\") == 1  # a row break stays
    assert score(math, r"The answer is $\\frac{1}{4}$.", "0.25").score == 1.0
    assert score(math, r"\boxed{0.25}", r"$\\frac{1}{4}$").score == 1.0


@pytest.mark.parametrize("text, answers, source", [
    (r"$\frac25$", [r"\frac25"], "bare"), (r"$$\text{composite}$$", [r"\text{composite}"], "bare"),
    (r"\frac{7}{4}", [r"\frac{7}{4}"], "bare"), ("12 500", ["12 500"], "bare"), ("x = 5", ["x = 5"], "bare"),
    ("3 5", ["5"], "last_number"),                     # two numbers are not the product 15
    ("It costs 4,75 €.", ["4,75"], "last_number"), ("The plot measures 2,500.5m².", ["2,500.5"], "last_number"),
    ("The points are (2,74).", [], "enumeration"), ("so it is 2x", [], None),
])
def test_bare_answers_and_number_forms(text, answers, source):
    found = extract(text)
    assert (found.answers, found.source) == (answers, source)


def test_unclosed_think_block_has_no_fallback_answer():
    assert extract("<think>\nEach of the 6 bags holds 7 marbles, so 6 * 7 = 42").answers == []
    assert extract("<think>\nSo there are **42** marbles.").answers == []
    assert extract("<think>\nSo there are 42 marbles.").source == "unclosed_think"
    assert extract("<think>a</think>\n<think>\nso 6 * 7 = 42").answers == []  # the last block is the open one
    assert extract("<think>6 * 7 = 42</think> There are 42 marbles.").answers == ["42"]
    assert extract("<think>\nThe answer is 42").answers == ["42"]  # an explicit marker still counts


def test_large_matrix_is_not_its_entries(math):
    matrix = r"\begin{pmatrix} " + r" \\ ".join(" & ".join(["3"] * 30) for _ in range(30)) + r" \end{pmatrix}"
    for text in (f"The matrix is ${matrix}$.", matrix, f"\\[{matrix}\\]"):
        reward = score(math, text, "3")
        assert reward.score == 0.0, reward.info
    assert extract(matrix).source == "environment"


def test_gold_with_several_boxes_or_a_worked_solution():
    from rlvr.verifiers.math.verifier import parse_gold

    assert parse_gold(r"\boxed{3} and \boxed{8}")[1] == parse_answer("3, 8")
    assert parse_gold(r"$\boxed{3}, \boxed{8}$")[1] == parse_answer("3, 8")
    assert parse_gold(r"\boxed{4} and then \boxed{4}")[1] == parse_answer("4")
    # boxes apart in prose without a connector: the last one is the gold
    assert parse_gold(r"First \boxed{3}, which fails the check on the second condition; so \boxed{8}")[1] \
        == parse_answer("8")
    solution = ("There are $4 \\cdot 6 = 24$ apples and 7 are eaten, which leaves $24 - 7 = 17$. Final Answer: The "
                "final answer is $17$. I hope it is correct. Note: the count assumes no apple was counted twice.")
    assert parse_gold(solution)[1] == parse_answer("17")


def test_intermediate_boxes_before_a_final_answer(math):
    worked = (r"First half: $0.03 \cdot 5,000 = \boxed{150}$ So the balance is 5,150 dollars. Second half: "
              r"$0.03 \cdot 5,150 = \boxed{154.5}$ So it becomes 5,304.5 dollars. Final Answer: The final answer "
              r"is $5,304.50$.")
    assert set(extract(worked).answers) == {"5,304.50"}
    assert score(math, worked, "5304.5").score == 1.0
    # a box that is not a computation step, or a final statement right after it: two answers (hedging)
    assert score(math, r"\boxed{150} Then the balance grows again over the second half of the year. Final "
                       r"Answer: The final answer is $5,304.50$.", "5304.5").score == 0.0
    assert score(math, r"So $0.03 \cdot 5,000 = \boxed{150}$. Final Answer: 5,304.50", "5304.5").score == 0.0
