"""The ``math`` verifier on the categories of issue 12, section 1 (one test class per category).

Each class holds right answers that must score 1 and negative controls that must stay 0 (hedges,
a wrong last digit, a wrong shape, a wrong value in the same dressing). The held-out cases that
found these gaps are private; these are our own, written per category, not per string.
"""

from __future__ import annotations

import pytest

from rlvr.verifiers import get_verifier

MATRIX = r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}"


@pytest.fixture(scope="module")
def math():
    return get_verifier("math")


def assert_score(verifier, completion, gold, expected, **kwargs):
    reward = verifier.score(completion, {"answer": gold}, **kwargs)
    assert reward.status == "ok", reward.info
    assert reward.score == expected, reward.info
    return reward


# ----------------------------------------------------------------------------- false positives
class TestShapeMustMatch:
    """A matrix or tuple of many entries is not a scalar, however its last entry reads."""

    @pytest.mark.parametrize("completion, gold", [
        (f"The matrix is ${MATRIX}$.", "4"),
        (f"So we get\n\\[{MATRIX}\\]", "4"),
        (f"So we get\n\\[{MATRIX}.\\]", "4"),
        ("Therefore $\\mathbf{v} = \\begin{pmatrix} 2 \\\\ -1 \\\\ 7 \\end{pmatrix}$.", "7"),
        ("Thus $(x, y, z) = (3, 5, 9)$.", "9"),
        ("The point is $(1, 4)$.", "4"),
        ("The answer is\n$$\\begin{pmatrix} 1 & 2 \\\\\n 3 & 4 \\end{pmatrix}$$", "4"),
        ("The answer is\n$$\\begin{pmatrix} 1 & 2 \\\\\n 3 & 4 \\end{pmatrix}$$", "2"),
        ("Final Answer:\n\\[\n\\begin{bmatrix}\n4 & 4 \\\\\n4 & 4\n\\end{bmatrix}\n\\]", "4"),
        ("Final Answer: $\\left[\\begin{array}{cc} 1 & 4 \\\\ 2 & 4 \\end{array}\\right]$", "4"),
        (r"\boxed{\begin{pmatrix} 4 & 4 \\ 4 & 4 \end{pmatrix}}", "4"),
        (r"\boxed{\begin{pmatrix} 4 \\ 4 \end{pmatrix}}", "4"),
        (r"\boxed{(4, 4, 4)}", "4"),
        (r"\boxed{\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}}", r"\det \begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}"),
        (r"\boxed{4}", MATRIX),
        (r"\boxed{(1, 2, 3, 4)}", MATRIX),
    ])
    def test_many_entries_against_one_value_score_zero(self, math, completion, gold):
        assert_score(math, completion, gold, 0.0)

    @pytest.mark.parametrize("completion, gold", [
        (f"The matrix is ${MATRIX}$.", MATRIX),
        ("Thus $(x, y, z) = (3, 5, 9)$.", "(3,5,9)"),
        (r"\boxed{\begin{pmatrix} 4 \end{pmatrix}}", "4"),      # a 1x1 matrix is its entry
        (r"\boxed{\begin{pmatrix} 3 \\ 5 \\ 9 \end{pmatrix}}", "(3, 5, 9)"),
    ])
    def test_same_shape_still_scores_one(self, math, completion, gold):
        assert_score(math, completion, gold, 1.0)


class TestDecimalPrecision:
    """The tolerance respects the precision the gold is written with."""

    @pytest.mark.parametrize("completion, gold", [
        (r"\boxed{12345.68}", "12345.67"),
        (r"\boxed{1234567.88}", r"\$1,234,567.89"),
        ("The answer is $98,765.42.", "98765.43"),
        (r"\boxed{0.1234568}", "0.1234567"),
        (r"\boxed{123456.8}", "123456.7"),
        (r"\boxed{1000000.4}", "1000000.5"),
        (r"\boxed{1234.51}", r"\$1,234.50"),
        (r"\boxed{1234567.4}", "1234567"),                 # an integer gold is exact
        (r"\boxed{123456789.5}", "123456789"),
        (r"\boxed{\frac{123456788}{100}}", "1234567.89"),  # an exact answer a cent away
        (r"\boxed{12.6\%}", r"12.5\%"),
        (r"\boxed{45.7}", "45.6"),
    ])
    def test_a_different_last_digit_scores_zero(self, math, completion, gold):
        assert_score(math, completion, gold, 0.0)

    @pytest.mark.parametrize("completion, gold", [
        (r"\boxed{18.9}", "18.90"),
        (r"\boxed{12,345.67}", "12345.67"),
        (r"\boxed{\$1,234,567.89}", "1234567.89"),
        (r"\boxed{2.5}", "2.50"),
        (r"\boxed{1234567.0}", "1234567"),
        (r"\boxed{0.290243}", "0.29"),                     # a full-precision value that rounds to the gold
        (r"\boxed{\frac{100}{3}}", "33.3"),
        (r"\boxed{0.3333333}", r"\frac{1}{3}"),            # a decimal approximation of an exact gold
        (r"\boxed{0.666667}", r"\frac{2}{3}"),
        (r"\boxed{1.414214}", r"\sqrt{2}"),
        (r"\boxed{\pi}", "3.14"),
        (r"\boxed{6.02e23}", r"6.02 \times 10^{23}"),
        (r"\boxed{0.125}", r"12.5\%"),
    ])
    def test_the_same_value_scores_one(self, math, completion, gold):
        assert_score(math, completion, gold, 1.0)


class TestTruncatedCompletions:
    """finish_reason="length" and no explicit final-answer marker: no answer."""

    @pytest.mark.parametrize("completion, gold", [
        ("Natalia sold 48 clips in April. In May she sold half as many, 48/2 = 24 clips. So in total she", "24"),
        ("First, 12 * 3 = 36. Then we add 6 to get 42 and then", "42"),
        ("The train covers 60 miles in the first hour and 72 miles in", "72"),
        ("So far the sum is 15. Next we consider the case where", "15"),
        ("We get $x = 3$. Substituting back into the second equation,", "3"),
        ("**Step 1.** The cost is **18** dollars per box, so for", "18"),
        ("<think>Let me see, the answer is \\boxed{5} probably. But wait, I should check", "5"),
        ("\\boxed{5}. Wait, that is wrong: I forgot the carry. Redoing it: 3 * 4 = 12, carry", "5"),
        ("Adding the two parts, the answer is 12", "12"),   # the marker's value may be cut too: 12 of 125
        ("Step 3 gives the total.\n#### 12", "12"),
    ])
    def test_no_marker_means_no_answer(self, math, completion, gold):
        reward = assert_score(math, completion, gold, 0.0, finish_reason="length")
        assert reward.info["extracted"] is None

    @pytest.mark.parametrize("completion, gold", [
        (r"So the total is \boxed{72}. Let me double-check: 36 * 2", "72"),
        ("The answer is 72. Let me verify this by computing 8 * 9", "72"),
        ("She pays 72 in all.\n#### 72\nNow, let", "72"),
        ("<answer>72</answer> Some more text that was", "72"),
        ("Final Answer: 72\n\nTo verify, 8 * 9 =", "72"),
        ("<think>8 * 9 = 72</think>\nThe answer is $\\boxed{72}$. As a check", "72"),
    ])
    def test_an_explicit_marker_still_counts(self, math, completion, gold):
        assert_score(math, completion, gold, 1.0, finish_reason="length")

    @pytest.mark.parametrize("finish_reason", [None, "stop"])
    def test_unknown_or_stopped_behaves_as_before(self, math, finish_reason):
        text = "Natalia sold 48 clips in April and half as many in May, 24, so 72 in total."
        assert_score(math, text, "72", 1.0, finish_reason=finish_reason)
        assert_score(math, text, "72", 1.0)

    def test_prompt_keyword_is_accepted(self, math):
        assert_score(math, r"\boxed{7}", "7", 1.0, prompt=[{"role": "user", "content": "3+4?"}], finish_reason="stop")


# ----------------------------------------------------------------------------- false negatives
class TestMatrixEnvironments:
    @pytest.mark.parametrize("completion, gold", [
        (r"\boxed{\begin{pmatrix} 1 & 2 \\[3pt] 3 & 4 \end{pmatrix}}", MATRIX),
        (r"\boxed{\begin{pmatrix*}[r] 1 & 2 \\ 3 & 4 \end{pmatrix*}}", MATRIX),
        (r"\boxed{\begin{array}{c|c} 1 & 2 \\ \hline 3 & 4 \end{array}}", MATRIX),
        (r"\boxed{\left(\begin{array}{@{}cc@{}} 1 & 2 \\ 3 & 4 \end{array}\right)}", MATRIX),
        (r"\boxed{\begin{array}{*{2}{c}} 1 & 2 \\ 3 & 4 \end{array}}", MATRIX),
        (r"\boxed{\begin {bmatrix} 1 & 2 \\ 3 & 4 \end {bmatrix}}", MATRIX),
        (r"\boxed{\left(\begin{matrix} 1 & 2 \\ 3 & 4 \end{matrix}\right)}", r"\begin{bmatrix} 1 & 2 \\ 3 & 4 \end{bmatrix}"),
        (r"\boxed{\begin{bmatrix} 1 & 2 \\ 3 & 4 \end{bmatrix}}", r"\left[\begin{array}{rr} 1 & 2 \\ 3 & 4 \\ \end{array}\right]"),
        ("The answer is\n$$\\begin{bmatrix} 1 & 2 \\\\\n 3 & 4 \\end{bmatrix}$$", MATRIX),
        ("Final Answer:\n\\[\n\\begin{bmatrix}\n1 & 2 \\\\\n3 & 4\n\\end{bmatrix}\n\\]", MATRIX),
        ("So the matrix is\n\\[\\begin{bmatrix} 1 & 2 \\\\ 3 & 4 \\end{bmatrix}.\\]", MATRIX),
        ("**Final Answer**\n\n$$\\mathbf{A}^{-1} = \\begin{pmatrix}\n1 & 2 \\\\\n3 & 4\n\\end{pmatrix}$$", MATRIX),
        (r"\boxed{\begin{array}{c} 1 \\ 2 \end{array}}", r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}"),
    ])
    def test_equal_matrices_in_any_environment(self, math, completion, gold):
        assert_score(math, completion, gold, 1.0)

    @pytest.mark.parametrize("completion, gold", [
        (r"\boxed{\begin{array}{c|c} 1 & 2 \\ \hline 3 & 5 \end{array}}", MATRIX),
        (r"\boxed{\begin{pmatrix*}[r] 1 & 3 \\ 2 & 4 \end{pmatrix*}}", MATRIX),            # transposed
        (r"\boxed{\begin{bmatrix} 1 & 2 & 3 & 4 \end{bmatrix}}", MATRIX),                  # another shape
        ("The answer is\n$$\\begin{bmatrix} 1 & 2 \\\\\n 4 & 3 \\end{bmatrix}$$", MATRIX),
    ])
    def test_different_matrices_score_zero(self, math, completion, gold):
        assert_score(math, completion, gold, 0.0)


class TestConcludingSentences:
    """A final answer stated in a plain concluding sentence, without \\boxed."""

    @pytest.mark.parametrize("completion, gold", [
        ("We test n = 35, which fails.\nFinal Answer: The largest n is 34", "34"),
        ("Final Answer: The largest $n$ is $34$.", "34"),
        ("Final Answer: The minimum value is $-\\frac{1}{4}$.", r"-\frac14"),
        ("Therefore x >= 5 is the solution.", r"x \ge 5"),
        ("Therefore $x \\geq 5$ is the solution.", r"[5, \infty)"),
        ("Thus the solution set is $x > 3$.", r"(3,\infty)"),
        ("So the probability is $\\frac{1}{6}$.", r"\frac16"),
        ("Therefore, the value of $k$ is $\\frac{3}{2}$.", r"\frac{3}{2}"),
        ("Hence the maximum occurs at $x = \\frac{\\pi}{4}$.", r"\frac{\pi}{4}"),
        ("Combining both cases, $-2 < x < 3$ is the solution set.", r"(-2, 3)"),
    ])
    def test_the_concluded_value_counts(self, math, completion, gold):
        assert_score(math, completion, gold, 1.0)

    @pytest.mark.parametrize("completion, gold", [
        ("Therefore x >= 5 is the solution.", r"x \le 5"),
        ("Therefore x >= 5 is the solution.", "5"),
        ("Final Answer: The largest $n$ is $34$.", "35"),
        ("So the probability is $\\frac{1}{6}$.", "6"),
        ("Therefore, the value of $k$ is $\\frac{3}{2}$.", "2"),
        ("Therefore the answer is 3 or 4 is the solution.", "4"),
        ("Thus $x = 3$ or $x = 4$ is the solution.", "4"),
    ])
    def test_controls_score_zero(self, math, completion, gold):
        assert_score(math, completion, gold, 0.0)


class TestLabelledAnswers:
    """``name = value`` against a gold that is only the value."""

    @pytest.mark.parametrize("completion, gold", [
        ("Therefore, $(p, q) = (3, 2)$.", "(3,2)"),
        ("So $NO/BO = 1/\\sqrt6$.", r"\frac{1}{\sqrt{6}}"),
        ("Hence $\\frac{NO}{BO} = \\frac{\\sqrt{6}}{6}$.", r"1/\sqrt{6}"),
        ("Thus $|AB| = \\sqrt{3}$.", r"\sqrt3"),
        ("So $a_{10} = 2^{10}$.", "1024"),
        ("In the end $|AB| = 1$.", "1"),
        (r"\boxed{|AB| = 1}", "1"),
        (r"\boxed{(p, q) = (3, 2)}", "(3, 2)"),
        (r"\boxed{NO/BO = 1/\sqrt6}", r"\frac{\sqrt6}{6}"),
        ("Final Answer: $\\overline{AB} = 2\\sqrt{3}$", r"2\sqrt3"),
    ])
    def test_label_is_ignored(self, math, completion, gold):
        assert_score(math, completion, gold, 1.0)

    @pytest.mark.parametrize("completion, gold", [
        ("Therefore, $(p, q) = (3, 2)$.", "(2,3)"),
        ("So $NO/BO = 1/\\sqrt6$.", "6"),
        ("Thus $|AB| = \\sqrt{3}$.", "3"),
        ("So $a_{10} = 2^{10}$.", "10"),
        (r"\boxed{|AB| = 1}", "2"),
    ])
    def test_wrong_values_score_zero(self, math, completion, gold):
        assert_score(math, completion, gold, 0.0)


class TestInequalitySign:
    """Inequalities equal up to multiplying by a positive or negative number (the sign flips)."""

    @pytest.mark.parametrize("completion, gold", [
        (r"\boxed{-x > -1}", "x < 1"),
        (r"\boxed{-x > -1}", r"(-\infty, 1)"),
        (r"\boxed{2x \le 6}", r"x \le 3"),
        (r"\boxed{-2x + 4 \geq 0}", r"x \leq 2"),
        (r"\boxed{x - 1 < 0}", "x < 1"),
        (r"\boxed{-3 < -x < 2}", "-2 < x < 3"),
        (r"\boxed{y > -x}", "x + y > 0"),
        (r"\boxed{-y < x}", "x + y > 0"),
        (r"\boxed{-x^2 > -4}", "x^2 < 4"),
        (r"\boxed{x < 1}", "-x > -1"),
    ])
    def test_equivalent_inequalities(self, math, completion, gold):
        assert_score(math, completion, gold, 1.0)

    @pytest.mark.parametrize("completion, gold", [
        (r"\boxed{-x < -1}", "x < 1"),
        (r"\boxed{-x \ge -1}", "x < 1"),
        (r"\boxed{y < -x}", "x + y > 0"),
        (r"\boxed{2x \le 6}", r"x \le 2"),
        (r"\boxed{x^2 < 4}", "x < 2"),
        (r"\boxed{-x > 1}", "x < 1"),
    ])
    def test_different_inequalities_score_zero(self, math, completion, gold):
        assert_score(math, completion, gold, 0.0)


class TestTextUnits:
    @pytest.mark.parametrize("completion, gold", [
        (r"\boxed{5\textnormal{ miles}}", "5"),
        (r"\boxed{12 \textnormal{ sq. ft.}}", "12"),
        (r"\boxed{40 \textnormal{ mph}}", "40"),
        (r"\boxed{\textnormal{5 miles}}", "5"),
        (r"\boxed{3.5 \textnormal{ hours}}", "3.5"),
        (r"\boxed{\pi \text{ cm}^2}", r"\pi"),
        (r"\boxed{2\sqrt{3}\textnormal{ units}}", r"2\sqrt3"),
        (r"\boxed{5\text{ cm}}", r"5\textnormal{ cm}"),
        ("Final Answer: $18\\textnormal{ miles}$", "18"),
        (r"\boxed{5 \text { cm }}", "5"),
    ])
    def test_units_are_dropped(self, math, completion, gold):
        assert_score(math, completion, gold, 1.0)

    @pytest.mark.parametrize("completion, gold", [
        (r"\boxed{5\textnormal{ miles}}", "6"),
        (r"\boxed{5 \textnormal{ or } 6}", "5"),
        (r"\boxed{\pi \text{ cm}^2}", r"2\pi"),
    ])
    def test_controls_score_zero(self, math, completion, gold):
        assert_score(math, completion, gold, 0.0)


class TestChatTemplateTokens:
    """Text after a special token (a new turn the model wrote itself) is not the answer."""

    @pytest.mark.parametrize("completion, gold", [
        ("So the answer is (7,6) <|im_start|>user\nNext question: what is 2+2? The answer is 4", "(7,6)"),
        ("The answer is 42.<|im_end|>\n<|im_start|>user\nAnd 43?<|im_end|>\n<|im_start|>assistant\nThe answer is 43.", "42"),
        ("The total is 42<|endoftext|>Question: what is 3 + 4? The answer is 7", "42"),
        ("\\boxed{42}<|eot_id|><|start_header_id|>user<|end_header_id|>\n\\boxed{43}", "42"),
        ("\\boxed{42}</s>\\boxed{43}", "42"),
        ("\\boxed{42}<end_of_turn>\n<start_of_turn>user\n\\boxed{43}", "42"),
        ("The answer is \\boxed{42}<\uff5cend\u2581of\u2581sentence\uff5c><\uff5cUser\uff5c>\\boxed{43}", "42"),
        ("<|im_start|>assistant\nThe answer is \\boxed{42}<|im_end|>", "42"),
        ("\\boxed{42}<|im_end|>", "42"),
    ])
    def test_cut_at_the_first_special_token(self, math, completion, gold):
        assert_score(math, completion, gold, 1.0)

    @pytest.mark.parametrize("completion, gold", [
        ("The answer is 41.<|im_end|>\n<|im_start|>user\nNo. The answer is 42.", "42"),
        ("\\boxed{41}<|endoftext|>\\boxed{42}", "42"),
        ("<|im_start|>assistant\n\\boxed{3} or \\boxed{4}<|im_end|>", "4"),
    ])
    def test_text_after_the_token_is_not_credited(self, math, completion, gold):
        assert_score(math, completion, gold, 0.0)

    def test_cut_under_truncation_finds_no_answer_after_the_token(self, math):
        reward = assert_score(math, "We have 12 apples<|im_end|><|im_start|>user\nThe answer is 12", "12", 0.0,
                       finish_reason="length")
        assert reward.info["extracted"] is None


class TestSelfCorrection:
    """The last final answer counts after an explicit correction; offering several at once is hedging."""

    @pytest.mark.parametrize("completion, gold", [
        (r"So \boxed{5}. Wait, that is wrong: I forgot the carry. Redoing it gives \boxed{7}.", "7"),
        (r"\boxed{4}. Wait, that's wrong: \boxed{5}", "5"),
        (r"The answer is \boxed{5}. Actually, I made an error in step 2. The correct answer is \boxed{7}.", "7"),
        ("The answer is 5. Wait, no, it's 7.", "7"),
        ("The answer is 12. Actually the answer is 13.", "13"),
        ("\\boxed{12}\n\nHmm, let me recheck: 3 * 4 = 12, plus the extra one is 13. So the answer is \\boxed{13}.", "13"),
        ("#### 10\nOops, I made a mistake: I forgot the tax.\n#### 12", "12"),
        ("The answer is $\\boxed{\\frac{1}{2}}$.\n\nWait, I need to double check this. The probability "
         "should exclude the first case, so it is $\\frac{1}{3}$.\n\nFinal Answer: $\\boxed{\\frac{1}{3}}$", r"\frac13"),
        (r"\boxed{5}. Wait, let me double-check: 2 + 3 = 5. Yes, \boxed{5}.", "5"),
    ])
    def test_the_corrected_answer_counts(self, math, completion, gold):
        assert_score(math, completion, gold, 1.0)

    @pytest.mark.parametrize("completion, gold", [
        (r"So \boxed{5}. Wait, that is wrong: I forgot the carry. Redoing it gives \boxed{7}.", "5"),
        ("The answer is 5. Wait, no, it's 7.", "5"),
        (r"It could be \boxed{3} or maybe \boxed{4}.", "4"),
        (r"\boxed{5}" + "\n\nAnswer: 6", "6"),
        ("The answer is 3. Alternatively, it could be 4.", "4"),
        (r"\boxed{3}. Wait, or maybe \boxed{4}.", "4"),
        (r"\boxed{5}. Wait, that's wrong: it is \boxed{6} or \boxed{7}.", "7"),
        (r"\boxed{5}. Wait, that's wrong. It is 6, or maybe 7.", "6"),
        (r"\boxed{5}. Actually, it could also be \boxed{6}.", "6"),
        ("#### 10\n#### 12", "12"),
        (r"\boxed{1}. Wait, \boxed{2}, \boxed{3}, \boxed{4}", "4"),
        (r"The roots are \boxed{2}. Actually, there is another root, \boxed{5}.", "5"),  # an addition, not a fix
    ])
    def test_hedges_and_retracted_answers_score_zero(self, math, completion, gold):
        assert_score(math, completion, gold, 0.0)

    @pytest.mark.parametrize("completion, gold", [
        (r"The roots are \boxed{2}. Actually, there is another root, \boxed{5}.", "2, 5"),
        (r"The roots are \boxed{2}. Wait, I forgot the root at $x = 5$: \boxed{5}.", "2, 5"),
        (r"The roots are \boxed{2} and \boxed{5}.", r"\{2, 5\}"),
    ])
    def test_multi_part_answers_survive_a_revision_word(self, math, completion, gold):
        assert_score(math, completion, gold, 1.0)


# ----------------------------------------------------------------------------- the new paths stay fast
def test_new_paths_stay_linear_on_hostile_input_from_a_thread(math):
    """Special tokens, displays over many lines, revisions, concluding segments and inequality solving
    on long repetitive input, from a worker thread, with and without finish_reason."""
    import threading
    import time

    fragments = ["<|im_end|>", "<|a|>", "<", "Wait, ", "Actually, it's 1. ", "$$\n", "\\begin{pmatrix}", "\\[",
                 " is the solution", "that is wrong ", "\\quad", "$1$ or ", "Final Answer: The ", "\\boxed{1}. Wait, ",
                 "Answer: $$\n1 \\\\\n", "\\\\[3pt]", "\\begin{array}{", "-x > -", "1 < 2x < ", "#### 1\nOops. ", "$"]
    slowest = {}

    def work():
        for fragment in fragments:
            for text in (fragment * (20_000 // len(fragment)), "The answer is " + fragment * (3_000 // len(fragment)),
                         "\\boxed{" + fragment * (3_000 // len(fragment)) + "}"):
                for reason in (None, "length"):
                    start = time.perf_counter()
                    reward = math.score(text, {"answer": "42"}, finish_reason=reason)
                    slowest[(fragment, len(text), reason)] = (time.perf_counter() - start, reward.score)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive(), "the verifier hung"
    assert len(slowest) == len(fragments) * 3 * 2, "the verifier raised"
    assert all(seconds < 2.0 and score == 0.0 for seconds, score in slowest.values()), \
        max(slowest.items(), key=lambda kv: kv[1][0])
