"""Write ``cases.jsonl``: hand-made cases for the ``math`` verifier, one category at a time.

Each case is ``{"id", "category", "completion", "answer", "expected", "note"}``; ``expected`` is the
score a correct verifier gives (1 or 0). Written in Python (raw strings) because LaTeX inside JSON
is unreadable; run ``python tests/verifier_cases/build.py`` after editing and commit both files.

Sources: the answer formats of GSM8K, MATH/MATH-500, Minerva, AMC/AIME (see /work/shared/data);
the failure reports in huggingface/Math-Verify issues #2, #14, #16, #26, #37, #41, #44, #47, #60,
#69, #76 (rewritten as cases, not copied); and the hedging patterns of RL reward hacking.
"""

from __future__ import annotations

import json
from pathlib import Path

CASES: list[dict] = []


def case(category: str, completion: str, answer, expected: int, note: str = "") -> None:
    CASES.append({"category": category, "completion": completion, "answer": answer, "expected": expected, "note": note})


def pos_neg(category: str, completion: str, right, wrong, note: str = "") -> None:
    """One completion scored against a gold it matches (1) and a gold it does not (0)."""
    case(category, completion, right, 1, note)
    case(category, completion, wrong, 0, note)


# ----------------------------------------------------------------------------- extraction paths
E = "extract_boxed"
pos_neg(E, r"Adding the two gives $x = \boxed{12}$.", "12", "13")
pos_neg(E, r"Thus the probability is $\boxed{\frac{3}{4}}$.", r"\frac{3}{4}", r"\frac{4}{3}")
pos_neg(E, r"The area is \boxed{48 \text{ square units}}.", "48", "84")
pos_neg(E, r"So the remainder is \boxed 5.", "5", "6", "box without braces")
pos_neg(E, r"Final: \fbox{7}", "7", "1")
pos_neg(E, "Step 1: 3+4=7.\nStep 2: 7*2=14.\n\n**Final Answer**\n\\[\n\\boxed{14}\n\\]", "14", "7")
pos_neg(E, r"We get \boxed{840}.,but let me put this after explain." + "\n\n**Final Answer**\n\\boxed{840}", "840", "840840",
        "Math-Verify #44: two identical boxes")
pos_neg(E, r"the answer should be \boxed{004}. So, \boxed{004} is the correct answer.", "4", "5", "Math-Verify #44: leading zeros")
pos_neg(E, r"<think>Maybe it is \boxed{3}? No.</think>The answer is $\boxed{5}$.", "5", "3", "draft box inside think")
pos_neg(E, r"$$\boxed{\left(\frac{1}{2}, -3\right)}$$", r"\left(\frac12,-3\right)", r"\left(-3, \frac12\right)")
pos_neg(E, r"Hence $\boxed{x^2+2x+1}$ is the polynomial.", "(x+1)^2", "x^2+2x-1")
pos_neg(E, r"The number of ways is $\boxed{\dbinom{10}{3}} = 120$.", "120", "720")
pos_neg(E, "Therefore\n$$\n\\boxed{\\sqrt{2}}\n$$", r"\sqrt2", r"\sqrt3")
pos_neg(E, r"so $m+n=\boxed{47}$", "47", "74")
pos_neg(E, r"The smallest such integer is $\boxed{1000}$. Checking: $1000 = 8 \cdot 125$.", "1000", "8")

E = "extract_answer_is"
pos_neg(E, "She pays 3 * 4 = 12 dollars. The answer is 12.", "12", "3")
pos_neg(E, r"So the final answer is $\frac{1}{2}$.", "0.5", "2")
pos_neg(E, "Therefore, the answer is: 7", "7", "17")
pos_neg(E, "The answer to the question is 9 apples.", "9", "8")
pos_neg(E, "The final answer is 3.14.", "3.14", "3.15")
pos_neg(E, "So the answer is approximately 2.72.", "2.72", "2.8")
pos_neg(E, r"Thus the answer is $-\frac{3}{8}$, as required.", r"-\frac{3}{8}", r"\frac{3}{8}")
pos_neg(E, "The correct option is (B).", "B", "C")
pos_neg(E, "First the answer is not 5, since 5 fails the check. The answer is 6.", "6", "5", "negated statement is ignored")
pos_neg(E, "I think the answer is x = -4.", "-4", "4")

E = "extract_gsm8k"
pos_neg(E, "Janet has 16 - 3 - 4 = <<16-3-4=9>>9 eggs.\nShe makes 9 * 2 = $<<9*2=18>>18.\n#### 18", "18", "9")
pos_neg(E, "Total cost is 1,200 + 300 = 1,500.\n#### 1,500", "1500", "1200")
pos_neg(E, "He earns $70.\n#### $70", "70", "7")
pos_neg(E, "So 0.5 of the cake remains.\n####0.5", "0.5", "5")
pos_neg(E, "#### -12", "-12", "12")

E = "extract_answer_tag"
pos_neg(E, "<think>12 + 30 = 42</think>\n<answer>42</answer>", "42", "12")
pos_neg(E, "<think>area = 6*7</think><answer>\\boxed{42}</answer>", "42", "6")
pos_neg(E, "<think>...</think><answer> The answer is 8 </answer>", "8", "0")
pos_neg(E, "<answer>\\frac{3}{5}</answer>", "0.6", "0.5")
pos_neg(E, "<think>first guess 10, then fix to 11</think>\n<answer>11</answer>", "11", "10")
pos_neg(E, "<answer>(D)</answer>", "D", "A")

E = "extract_bold"
pos_neg(E, "So the number of residents who own all four things is **73**.", "73", "234")
pos_neg(E, "Left: 437 + 2*234 = 905\nRight: 905\n\n--- \n\nFinal Answer: **73**", "73", "905", "Math-Verify #76")
pos_neg(E, "She needs **15** more stickers.", "15", "51")
pos_neg(E, "The total is 5 + 6.\n\nThe result is **11**", "11", "6")

E = "extract_answer_line"
pos_neg(E, "We multiply both sides by 2.\nAnswer: 17", "17", "2")
pos_neg(E, "ANSWER: 3/4", r"\frac34", r"\frac43")
pos_neg(E, "Solving gives the root.\nFinal answer: x = 5", "5", "-5")
pos_neg(E, "**Answer:** 2.5", "2.5", "25")
pos_neg(E, "**Final Answer:** $\\dfrac{9}{4}$", r"\frac{9}{4}", r"\frac{4}{9}")
pos_neg(E, "### Final Answer\n\n64", "64", "46", "heading then value")

E = "extract_last_number"
pos_neg(E, "She has 12 apples left.", "12", "13")
pos_neg(E, "It takes 3.5 hours.", "3.5", "3")
pos_neg(E, "42", "42", "24")
pos_neg(E, "First we add 5 and 7 to get 12. Then we double it to get 24.", "24", "12")
pos_neg(E, "The trip costs $1,250 in total.", "1250", "125")
pos_neg(E, "The speed is -3 m/s.", "-3", "3")

# ----------------------------------------------------------------------------- normalisations
N = "norm_thousands"
pos_neg(N, r"\boxed{1,234}", "1234", "1,235")
pos_neg(N, r"\boxed{1\,234}", "1234", "234")
pos_neg(N, r"\boxed{1{,}234{,}567}", "1234567", "1234")
pos_neg(N, r"\boxed{10080}", r"10,\!080", "10,008")
pos_neg(N, r"\boxed{11,111,111,100}", r"11,\! 111,\! 111,\! 100", "11111111")
pos_neg(N, "The population is 12,345,678.", "12345678", "12345")
pos_neg(N, r"\boxed{\$32,\!348}", r"\$32,\!348", "32,349")
pos_neg(N, r"\boxed{58,500}", "58500", "585")

N = "norm_sign"
pos_neg(N, r"\boxed{+7}", "7", "-7")
pos_neg(N, "The change is +12.", "12", "-12")
pos_neg(N, r"\boxed{-0}", "0", "1")
pos_neg(N, r"\boxed{- 5}", "-5", "5")

N = "norm_dollars_percent"
pos_neg(N, r"\boxed{\$18.90}", r"\$18.90", "18.09")
pos_neg(N, r"The total is $\$18.9$.", "18.90", "18")
pos_neg(N, r"\boxed{36 \text{ dollars}}", r"\$36", "63")
pos_neg(N, r"\boxed{25\%}", "25", "20")
pos_neg(N, r"The answer is 25%.", r"25\%", "2.5")
pos_neg(N, r"\boxed{0.25}", r"25\%", r"20\%", "a fraction for a percent gold")
pos_neg(N, r"\boxed{12.5\%}", r"12.5\%", r"1.25\%")
pos_neg(N, "#### $5", "5", "6")
pos_neg(N, r"She earned \boxed{\$ 1,080}.", "1080", "180")

N = "norm_units_degrees"
pos_neg(N, r"\boxed{15 \text{ cm}^2}", r"15\mbox{ cm}^2", "16")
pos_neg(N, r"\boxed{864 \text{ inches}^2}", r"864 \mbox{ inches}^2", "846")
pos_neg(N, r"\boxed{5.4 \text{ cents}}", r"5.4 \text{ cents}", "54")
pos_neg(N, r"The answer is 12 apples.", "12", "13")
pos_neg(N, r"\boxed{3.5 \text{ hours}}", "3.5", "35")
pos_neg(N, r"\boxed{90^\circ}", "90", "45")
pos_neg(N, r"\boxed{90^{\circ}}", r"90^\circ", "180")
pos_neg(N, "The angle is 30°.", r"30^\circ", "60")
pos_neg(N, r"\boxed{75 \text{ degrees}}", r"75^\circ", "57")
pos_neg(N, r"\boxed{\frac{270}{7}^\circ}", r"\frac{270}7\text{ degrees}", r"\frac{7}{270}")
pos_neg(N, r"\boxed{1.6 \mathrm{~cm}}", "1.6", "16")
pos_neg(N, r"\boxed{300 \mathrm{~km} / \mathrm{s}}", "300", "30")
pos_neg(N, "The speed is 5 m/s.", "5", "6")
pos_neg(N, r"\boxed{8 \text{ m}}", "8", "9")

N = "norm_text"
pos_neg(N, r"\boxed{\text{13}}", "13", "31", "Math-Verify #37")
pos_neg(N, r"\boxed{\text{Evelyn}}", r"\text{Evelyn}", r"\text{Navin}")
pos_neg(N, "The answer is east.", r"\text{east}", r"\text{west}")
pos_neg(N, r"\boxed{\textbf{12}}", "12", "21")
pos_neg(N, r"\boxed{\mathrm{even}}", r"\text{even}", r"\text{odd}")
pos_neg(N, r"\boxed{\text{ellipse}}", r"\text{ellipse}", r"\text{parabola}")
pos_neg(N, r"\boxed{\text{Monday}}", "Monday", "Tuesday")

N = "norm_dfrac"
pos_neg(N, r"\boxed{\dfrac{3}{4}}", r"\frac34", r"\frac{3}{5}")
pos_neg(N, r"\boxed{\tfrac12}", "0.5", "2")
pos_neg(N, r"\boxed{\dfrac{17}{50}}", r"\dfrac{17}{50}", r"\frac{17}{5}")
pos_neg(N, r"\boxed{\frac 59}", r"\frac{5}{9}", r"\frac{9}{5}")
pos_neg(N, r"\boxed{\frac9{19}}", r"\frac{9}{19}", r"\frac{9}{91}")
pos_neg(N, r"\boxed{1\frac{4}{5}}", r"\frac{9}{5}", r"\frac{4}{5}", "mixed number")
pos_neg(N, r"\boxed{137 \frac{1}{2}}", "137.5", "68.5", "mixed number")
pos_neg(N, r"\boxed{\dfrac{\sqrt{3}}{3}}", r"\frac{1}{\sqrt3}", r"\sqrt3")
pos_neg(N, r"\boxed{-\dfrac{24}{25}}", r"-\frac{24}{25}", r"\frac{24}{25}")

N = "norm_plain_math"
pos_neg(N, "The answer is sqrt(3).", r"\sqrt{3}", r"\sqrt{2}")
pos_neg(N, "The answer is pi/2.", r"\frac{\pi}{2}", r"\pi")
pos_neg(N, "The answer is (x+1)/(x-1).", r"\frac{x+1}{x-1}", r"\frac{x-1}{x+1}")
pos_neg(N, "The answer is 2*sqrt(2).", r"2\sqrt2", r"\sqrt2")
pos_neg(N, "The answer is 3^(1/2).", r"\sqrt3", r"3")
pos_neg(N, "The answer is x^2 + 2x + 1.", r"(x+1)^2", r"(x-1)^2")
pos_neg(N, "The answer is -2*pi.", r"-2\pi", r"2\pi", "Math-Verify #69")
pos_neg(N, "The answer is -1 + exp(16).", r"e^{16} - 1", r"e^{16} + 1", "Math-Verify #69")
pos_neg(N, "The answer is 14.0 + -1.0i.", "14 - i", "14 + i", "Math-Verify #69")
pos_neg(N, "The answer is 3 sqrt 5.", r"3\sqrt{5}", r"5\sqrt3")
pos_neg(N, "The answer is 1/12.", "0.0833333333333333", "0.084", "Math-Verify #2")
pos_neg(N, "The answer is 5pi/6.", r"\frac{5\pi}{6}", r"\frac{6\pi}{5}")
pos_neg(N, "The answer is 2√3.", r"2\sqrt{3}", r"3\sqrt{2}")
pos_neg(N, "The answer is π/4.", r"\frac{\pi}{4}", r"\frac{\pi}{3}")
pos_neg(N, "The answer is (a+5)(b+2).", "ab+2a+5b+10", "ab+5a+2b+10")
pos_neg(N, r"\boxed{\frac{x}{7}+\frac{2}{7}}", r"\frac{x+2}{7}", r"\frac{x+7}{2}", "Math-Verify #2")
pos_neg(N, r"\boxed{\sec^2(y)}", r"\tan^2(y)+1", r"\tan^2(y)-1", "Math-Verify #2")

N = "norm_scientific"
pos_neg(N, r"\boxed{6.02e23}", r"6.02 \times 10^{23}", r"6.02 \times 10^{22}")
pos_neg(N, "The answer is 2.5 million.", "2500000", "250000")
pos_neg(N, r"\boxed{1.5 \cdot 10^{-3}}", "0.0015", "0.015")
pos_neg(N, "The answer is 3 billion.", "3000000000", "300000000")
pos_neg(N, r"\boxed{4.5e33}", "4.5e33", "4.5e34")
pos_neg(N, r"\boxed{3.83 \times 10^{35}}", "3.83e35", "3.83e53")
pos_neg(N, r"\boxed{1e-5}", r"10^{-5}", r"10^{-6}")
pos_neg(N, r"\boxed{7.5 \times 10^7 \text{ years}}", "7.5e7", "7.5e6")
pos_neg(N, "The answer is 1.2 thousand.", "1200", "120")
pos_neg(N, r"\boxed{.0000672}", r"6.72 \times 10^{-5}", r"6.72 \times 10^{-4}")

N = "norm_choice"
pos_neg(N, r"The answer is (D).", "D", "B")
pos_neg(N, r"**Answer: B**", "B", "D")
pos_neg(N, r"\boxed{\textbf{(A)}}", r"\text{(A)}", r"\text{(E)}")
pos_neg(N, r"\boxed{C}", r"\text{(C)}", r"\text{(B)}")
pos_neg(N, r"The correct answer is C) 42.", "C", "A")
pos_neg(N, "Answer: (E) 17", "E", "D")
pos_neg(N, r"The answer is $\boxed{\text{(B)}}$", "(B)", "(C)")
pos_neg(N, "Option B because C is not valid.\nAnswer: B", "B", "C")
pos_neg(N, r"\boxed{(D)\ 36}", "D", "A")
pos_neg(N, "<answer>A</answer>", "A", "B")
pos_neg(N, "The final answer is **C**.", "C", "B")

N = "norm_interval"
pos_neg(N, r"\boxed{(-\infty, 3]}", r"(-\infty,3]", r"(-\infty,3)")
pos_neg(N, r"\boxed{[2, 5)}", "[2,5)", "(2,5]")
pos_neg(N, r"\boxed{x \in [-2,7]}", r"[-2,7]", r"[-7,2]")
pos_neg(N, r"\boxed{-2 \le x \le 7}", r"x \in [-2,7]", r"(-2,7)")
pos_neg(N, r"\boxed{(-\infty, 2) \cup (3, \infty)}", r"(3,\infty) \cup (-\infty,2)", r"(-\infty,3) \cup (2,\infty)")
pos_neg(N, r"\boxed{\left(\frac{3}{5},\frac{8}{3}\right]}", r"\left(\frac{3}{5},\frac{8}{3}\right]", r"\left[\frac{3}{5},\frac{8}{3}\right]")
pos_neg(N, r"\boxed{x > 5}", r"(5,\infty)", r"[5,\infty)")
pos_neg(N, r"\boxed{(0,9) \cup (9,36)}", r"(0,9) \cup (9,36)", r"(0,36)")
pos_neg(N, r"\boxed{\left[ \frac{\pi^2}{8}, \frac{5 \pi^2}{4} \right]}", r"\left[ \frac{\pi^2}{8}, \frac{5 \pi^2}{4} \right]",
        r"\left[ \frac{\pi^2}{4}, \frac{5 \pi^2}{8} \right]")
pos_neg(N, r"\boxed{(2,\infty)}", r"x > 2", r"x < 2")

N = "norm_tuple_set"
pos_neg(N, r"\boxed{(1, 2)}", "(1,2)", "(2,1)", "ordered pair: order matters")
pos_neg(N, r"\boxed{\{1, 2\}}", r"\{2, 1\}", r"\{1, 3\}", "set: order does not matter")
pos_neg(N, r"The solutions are $\boxed{1, -2}$.", "-2,1", "1,2", "list of solutions")
pos_neg(N, r"\boxed{3, 5, 7}", "7, 5, 3", "3, 5")
pos_neg(N, r"\boxed{(6,31,-1)}", "(6,31,-1)", "(6,-1,31)")
pos_neg(N, r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)", r"\left( \frac{\pi}{2}, 3 \right)")
pos_neg(N, r"\boxed{(1,4.5)}", r"(1,\frac{9}{2})", r"(1,\frac{9}{4})", "Math-Verify #2")
pos_neg(N, r"\boxed{1+\sqrt{19}, 1-\sqrt{19}}", r"1 \pm \sqrt{19}", r"1 + \sqrt{19}")
pos_neg(N, r"\boxed{\{1+\sqrt5, 1-\sqrt5, -2\}}", r"\{1\pm\sqrt{5},-2\}", r"\{1\pm\sqrt{5},2\}")
pos_neg(N, r"\boxed{12:00}", "12:00", "1:00", "Math-Verify #14: times")

N = "norm_equation"
pos_neg(N, r"\boxed{x = 3}", "3", "-3")
pos_neg(N, r"\boxed{3}", "x=3", "x=-3")
pos_neg(N, r"\boxed{y = 2x + 3}", "y = 3 + 2x", "y = 2x - 3")
pos_neg(N, r"\boxed{5x - 7y + 11z + 4 = 0}", "-5x + 7y - 11z - 4 = 0", "5x - 7y + 11z - 4 = 0")
pos_neg(N, r"\boxed{y = -\frac{1}{2}x + \frac{3}{4}}", "2x+4y-3=0", "2x+4y+3=0", "Math-Verify #26")
pos_neg(N, r"\boxed{-34x-45y+20z-100=0}", "34x+45y-20z+100=0", "34x+45y-20z-100=0", "Math-Verify #2")
pos_neg(N, r"\boxed{k = 2}", "2", "3")
pos_neg(N, r"\boxed{3x-y+13=0}", "3x - y + 13 = 0", "3x + 4y + 14 = 0", "Math-Verify #60")
pos_neg(N, r"\boxed{n = 2, 3, 4}", "n = 2, 3, 4", "n = 1, 2, 3", "Math-Verify #14")
pos_neg(N, r"\boxed{D = (0, 1)}", "D = (0, 1)", "D = (0, 1.5)", "Math-Verify #14")

N = "norm_matrix"
pos_neg(N, r"\boxed{\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}}", r"\begin{bmatrix} 1 & 2 \\ 3 & 4 \end{bmatrix}",
        r"\begin{pmatrix} 1 & 3 \\ 2 & 4 \end{pmatrix}")
pos_neg(N, r"\boxed{\begin{pmatrix} -\frac13 \\ \frac23 \\ \frac53 \end{pmatrix}}",
        r"\begin{pmatrix} -1/3 \\ 2/3 \\ 5/3 \end{pmatrix}", r"\begin{pmatrix} 1/3 \\ 2/3 \\ 5/3 \end{pmatrix}")
pos_neg(N, r"\boxed{\begin{pmatrix} -1 & 0 \\ 0 & -1 \end{pmatrix}}", r"\begin{pmatrix} -1 & 0 \\ 0 & -1 \end{pmatrix}",
        r"\begin{pmatrix} 1 & 0 \\ 0 & 1 \end{pmatrix}")
pos_neg(N, r"\boxed{\begin{pmatrix} -2 \\ -14 \\ -7 \end{pmatrix}}", "(-2, -14, -7)", "(-2, -7, -14)", "column vector as tuple")
pos_neg(N, r"\boxed{\begin{bmatrix} 0.2 & 0 \\ 0 & 0.5 \end{bmatrix}}", r"\begin{pmatrix} \frac15 & 0 \\ 0 & \frac12 \end{pmatrix}",
        r"\begin{pmatrix} \frac12 & 0 \\ 0 & \frac15 \end{pmatrix}")
pos_neg(N, r"\boxed{\begin{pmatrix} 16/49 \\ 48/49 \\ 24/49 \end{pmatrix}}",
        r"\begin{pmatrix} 16/49 \\ 48/49 \\ 24/49 \end{pmatrix}", r"\begin{pmatrix} 16/49 \\ 24/49 \\ 48/49 \end{pmatrix}")

N = "tiny_values"
case(N, r"\boxed{2^{-98}}", "2^{-99}", 0, "relative, not absolute, tolerance")
case(N, r"\boxed{\frac{1}{2^{98}}}", r"\frac{1}{2^{99}}", 0, "Math-Verify #14")
case(N, r"\boxed{\frac{1}{2004!}}", r"\frac{1}{2006!}", 0, "Math-Verify #14")
case(N, r"\boxed{1e-10}", "2e-10", 0)
case(N, r"\boxed{0.0000001}", "0.0000002", 0)
case(N, r"\boxed{\frac{2^{2005}+1}{3 \cdot 2^{2006}}}", r"\frac{1}{3 \cdot 2^{2006}}", 0, "Math-Verify #14")
case(N, r"\boxed{2^{-100}}", r"\frac{1}{2^{100}}", 1)
case(N, r"\boxed{1.5 \times 10^{-12}}", "1.5e-12", 1)
case(N, r"\boxed{6.67 \times 10^{-11}}", "6.67e-11", 1)
case(N, r"\boxed{10^{-9}}", "0.000000001", 1)

N = "wrong_answers"
case(N, r"\boxed{4\sqrt{2}}", "4", 0, "Math-Verify #41")
case(N, r"\boxed{1 + \frac{1}{e}}", r"1 - \frac{1}{e}", 0, "Math-Verify #14")
case(N, r"\boxed{2021}", r"\pm 2021", 0, "Math-Verify #14")
case(N, r"\boxed{21, 36, \text{and } 82}", r"19, 46, \text{ and } 82", 0, "Math-Verify #14")
case(N, r"\boxed{1728}", r"1331 \text{ and } 1728", 0, "Math-Verify #47: part of a multi-part gold")
case(N, r"\boxed{\frac{100}{3}}", "33", 0)
case(N, r"\boxed{3.14}", r"\pi", 0, "an approximation is not the exact answer")
case(N, r"\boxed{x+1}", "t+1", 0, "different variable")
case(N, r"\boxed{0}", "1", 0)
case(N, r"\boxed{}", "0", 0, "empty box")
case(N, "", "0", 0, "empty response")
case(N, "I don't know.", "7", 0, "no answer")

# ----------------------------------------------------------------------------- hedging (all 0)
H = "hedging"
case(H, r"It could be \boxed{3} or maybe \boxed{4}.", "3", 0, "two boxes that disagree")
case(H, r"It could be \boxed{3} or maybe \boxed{4}.", "4", 0, "two boxes that disagree (gold = last)")
case(H, r"\boxed{4}. Wait, that's wrong: \boxed{5}", "4", 0, "self-correction: the retracted answer does not count")
case(H, r"The answer is \boxed{3 \text{ or } 4}.", "3", 0, "alternatives inside one box")
case(H, "The answer is 3 or 4.", "4", 0, "alternatives")
case(H, "The answer is either 5 or 6.", "5", 0, "either/or")
case(H, "The answer is A or B.", "A", 0, "two letters")
case(H, "**Answer: B/D**", "D", 0, "two letters with a slash")
case(H, r"\boxed{A, C}", "A", 0, "two letters with a comma")
case(H, "The answer is (A) or (C).", "C", 0, "two letters in parentheses")
case(H, "Possible values: 1, 2, 3, 4, 5", "5", 0, "enumeration whose last number is the gold")
case(H, "The candidates are 2, 3, 5, 7, 11, 13", "13", 0, "enumeration")
case(H, r"The answer is \boxed{2, 3, 5, 7}.", "7", 0, "enumeration in a box")
case(H, "Let me compute step by step. " * 10 + "First 12 + 30 = 4", "4", 0, "truncated mid-number")
case(H, "Let me compute step by step. " * 10 + "So the total is 42 +", "42", 0, "truncated mid-expression")
case(H, r"\boxed{5}" + "\n\nAnswer: 6", "5", 0, "box and a later answer line disagree")
case(H, r"\boxed{5}" + "\n\nAnswer: 6", "6", 0, "box and a later answer line disagree")
case(H, "The answer is 12. Actually the answer is 13.", "12", 0, "self-correction: the retracted answer does not count")
case(H, "#### 10\n#### 12", "12", 0, "two GSM8K answers")
case(H, "<answer>3</answer><answer>4</answer>", "4", 0, "two answer tags")
case(H, r"\boxed{x = 1} \quad \boxed{x = 2} \quad \boxed{x = 3}", "2", 0, "three boxes")
case(H, r"The answer is $\frac12$ or $0.25$.", "0.5", 0, "alternatives in math mode")
case(H, r"\boxed{1} \boxed{2} \boxed{3} \boxed{4} \boxed{5} \boxed{6} \boxed{7} \boxed{8} \boxed{9} \boxed{10}", "7", 0, "box spray")
case(H, "The answer is 6, 7, 8, or 9.", "9", 0, "list offered as one answer")
case(H, r"\boxed{\pm 3}", "3", 0, "plus-minus for a single value")

# ----------------------------------------------------------------------------- multi-part answers (1)
M = "multipart"
pos_neg(M, r"The roots are \boxed{3} and \boxed{5}.", "3, 5", "3, 6")
pos_neg(M, r"The roots are \boxed{5} and \boxed{3}.", "3, 5", "3")
pos_neg(M, r"The answer is x = 2 or x = -2.", r"\pm 2", "2")
pos_neg(M, r"$\boxed{x=1}$ and $\boxed{x=-2}$", "1, -2", "1, 2")
pos_neg(M, r"The solutions are $\boxed{-1}$ or $\boxed{4}$.", r"\{-1, 4\}", r"\{-1, 3\}")
pos_neg(M, r"\boxed{1 \pm \sqrt{19}}", r"1 \pm \sqrt{19}", r"1 \pm \sqrt{17}")
pos_neg(M, r"The answer is $\boxed{2}$ chickens and $\boxed{3}$ rabbits.", "2, 3", "3, 4")
pos_neg(M, r"\boxed{(1, 2)} and \boxed{(3, 4)}", r"(1,2), (3,4)", r"(1,2), (4,3)")

# ----------------------------------------------------------------------------- second pass
# Written after the first implementation passed everything above, to probe generalisation; every one
# of these failed at first (19 of 116, then 3 of 19) and drove a fix: repeating decimals, degrees inside
# trig, space thousands, scale words in \\text, "x 10^", markdown vs **, choice letters without a
# marker, option-text golds, unions written as alternatives or with U, [[..],[..]] matrices, rounded golds.
SECOND_PASS = [
    ("extract_boxed", r"$\boxed{\text{B}}$", "B", 1),
    ("extract_boxed", r"\[ \boxed{x = \frac{-1 \pm \sqrt{5}}{2}} \]", r"\frac{-1 \pm \sqrt{5}}{2}", 1),
    ("extract_boxed", r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}", 1),
    ("extract_boxed", r"\boxed{0.\overline{3}}", r"\frac{1}{3}", 1),
    ("extract_boxed", r"\boxed{3\frac{1}{2}}", "3.5", 1),
    ("extract_boxed", r"\boxed{\infty}", r"\infty", 1),
    ("extract_boxed", r"\boxed{\emptyset}", r"\varnothing", 1),
    ("extract_boxed", r"\boxed{\mathbb{R}}", r"(-\infty, \infty)", 1),
    ("extract_boxed", r"\boxed{\text{No solution}}", r"\text{no solution}", 1),
    ("extract_boxed", r"\boxed{e^{i\pi}}", "-1", 1),
    ("extract_boxed", r"\boxed{\sqrt{-4}}", "2i", 1),
    ("extract_boxed", r"\boxed{2+3i}", "3i+2", 1),
    ("extract_boxed", r"\boxed{\sin 30^\circ}", r"\frac12", 1),
    ("extract_boxed", r"\boxed{\cos 60^{\circ}}", "0.5", 1),
    ("extract_boxed", r"\boxed{10!}", "3628800", 1),
    ("extract_boxed", r"\boxed{(x, y) = (2, 3)}", "(2,3)", 1),
    ("extract_boxed", r"\boxed{a=2, b=3}", "(2,3)", 1),
    ("extract_boxed", r"\boxed{k \geq 3}", r"[3, \infty)", 1),
    ("extract_answer_is", "The answer is: **12**", "12", 1),
    ("extract_answer_is", "The final answer is $12$. I hope it is correct.", "12", 1),
    ("extract_answer_is", "Final Answer: The final answer is 12. I hope it is correct.", "12", 1),
    ("extract_answer_is", "So, the answer would be 12.", "12", 1),
    ("extract_answer_is", "The answer: 12", "12", 1),
    ("extract_answer_is", "Hence the answer is therefore 12", "12", 1),
    ("extract_answer_is", "The answer is twelve.", "12", 1),
    ("extract_answer_is", "The answer is $5$ and $6$.", "5, 6", 1),
    ("extract_answer_is", "My answer is B.", "B", 1),
    ("extract_gsm8k", "#### 1,000.00", "1000", 1),
    ("extract_gsm8k", "####  $10.50", "10.5", 1),
    ("extract_gsm8k", "#### 18 eggs", "18", 1),
    ("extract_answer_tag", "<answer>\n42\n</answer>", "42", 1),
    ("extract_answer_tag", "<answer>The final answer is 4</answer>", "4", 1),
    ("extract_answer_tag", "<answer>4 apples</answer>", "4", 1),
    ("extract_answer_tag", "<ANSWER>4</ANSWER>", "4", 1),
    ("extract_answer_tag", "<answer>$\\frac{1}{2}$</answer>", "0.5", 1),
    ("extract_answer_line", "**Answer:** The total is 42 dollars.", "42", 1),
    ("extract_answer_line", "**Final answer: 42**", "42", 1),
    ("extract_answer_line", "- **Answer**: 42", "42", 1),
    ("extract_answer_line", "> Answer: 42", "42", 1),
    ("extract_answer_line", "Answer: C) 25", "C", 1),
    ("extract_last_number", "The train travels 60 * 2 = 120 miles.", "120", 1),
    ("extract_last_number", "So Tom has $25 left.", "25", 1),
    ("extract_last_number", "Total: 3,500 dollars.", "3500", 1),
    ("extract_last_number", "The result is -3.", "-3", 1),
    ("norm_thousands", r"\boxed{1 234 567}", "1234567", 1),
    ("norm_thousands", r"\boxed{12,345.67}", "12345.67", 1),
    ("norm_thousands", r"\boxed{10{,}000}", "10000", 1),
    ("norm_sign", r"\boxed{−7}", "-7", 1),
    ("norm_dollars_percent", r"\boxed{\$1.5 \text{ million}}", "1500000", 1),
    ("norm_dollars_percent", "The answer is 50 percent.", "50", 1),
    ("norm_dollars_percent", r"\boxed{5\%}", "0.05", 1),
    ("norm_dollars_percent", r"\boxed{\frac{1}{4}}", r"25\%", 1),
    ("norm_units_degrees", r"\boxed{12 \text{ km/h}}", "12", 1),
    ("norm_units_degrees", r"\boxed{12\,\text{cm}}", "12", 1),
    ("norm_units_degrees", r"\boxed{3 \mathrm{~m} / \mathrm{s}^{2}}", "3", 1),
    ("norm_units_degrees", "The acceleration is 9.8 m/s^2.", "9.8", 1),
    ("norm_units_degrees", r"\boxed{100 \text{ sq. ft}}", "100", 1),
    ("norm_units_degrees", r"\boxed{25^\circ C}", "25", 1),
    ("norm_units_degrees", r"\boxed{\angle ABC = 45^\circ}", "45", 1),
    ("norm_text", r"\boxed{\textbf{Odd}}", r"\text{odd}", 1),
    ("norm_plain_math", "The answer is sqrt(2)/2.", r"\frac{\sqrt2}{2}", 1),
    ("norm_plain_math", "The answer is 3*sqrt(3)/2.", r"\frac{3\sqrt3}{2}", 1),
    ("norm_plain_math", "The answer is 2^(1/3).", r"\sqrt[3]{2}", 1),
    ("norm_plain_math", "The answer is pi*r^2.", r"\pi r^2", 1),
    ("norm_plain_math", "The answer is e^(2x).", r"e^{2x}", 1),
    ("norm_plain_math", "The answer is ln(2).", r"\ln 2", 1),
    ("norm_plain_math", "The answer is 1/sqrt(2).", r"\frac{\sqrt{2}}{2}", 1),
    ("norm_plain_math", "The answer is (3+sqrt(5))/2.", r"\frac{3+\sqrt5}{2}", 1),
    ("norm_plain_math", "The answer is 4pi.", r"4\pi", 1),
    ("norm_plain_math", "The answer is 2pi/3.", r"\frac{2\pi}{3}", 1),
    ("norm_plain_math", "The answer is √(3)/2.", r"\frac{\sqrt3}{2}", 1),
    ("norm_plain_math", "The answer is x²+1.", r"x^2+1", 1),
    ("norm_scientific", "The answer is 6.02 x 10^23.", "6.02e23", 1),
    ("norm_scientific", "The answer is 6.02E+23.", r"6.02 \times 10^{23}", 1),
    ("norm_scientific", "The answer is 6.02*10**23.", "6.02e23", 1),
    ("norm_scientific", r"\boxed{1.2 \times 10^{6}}", "1,200,000", 1),
    ("norm_scientific", "The answer is 3 million.", "3000000", 1),
    ("norm_scientific", r"\boxed{5 \times 10^{-3}}", "0.005", 1),
    ("norm_choice", "(D) 12", "D", 1),
    ("norm_choice", "D", "D", 1),
    ("norm_choice", "The correct choice: D", "D", 1),
    ("norm_choice", "Option B is correct.", "B", 1),
    ("norm_choice", "The correct answer is option B", "B", 1),
    ("norm_choice", "**C**", "C", 1),
    ("norm_choice", r"The answer is \textbf{(B) } 12", "B", 1),
    ("norm_choice", r"\boxed{B}", r"\textbf{(B)}\ 12", 1),
    ("norm_choice", r"\boxed{B}", "(B) 12", 1),
    ("norm_interval", r"\boxed{x < -1 \text{ or } x > 3}", r"(-\infty,-1)\cup(3,\infty)", 1),
    ("norm_interval", r"\boxed{(-\infty,-1) U (3,\infty)}", r"(-\infty,-1)\cup(3,\infty)", 1),
    ("norm_interval", "The answer is (−∞, 3].", r"(-\infty, 3]", 1),
    ("norm_interval", "The answer is (-inf, 3].", r"(-\infty, 3]", 1),
    ("norm_interval", r"\boxed{-\infty < x < 5}", r"(-\infty, 5)", 1),
    ("norm_interval", r"\boxed{x \leq 3}", r"(-\infty, 3]", 1),
    ("norm_tuple_set", r"\boxed{\left\{ 1,2 \right\}}", r"\{1, 2\}", 1),
    ("norm_tuple_set", r"\boxed{\{(1,2),(3,4)\}}", r"\{(3,4),(1,2)\}", 1),
    ("norm_equation", r"\boxed{y = 3x + 2}", "3x+2", 1),
    ("norm_equation", r"\boxed{3x + 2}", "y=3x+2", 1),
    ("norm_equation", r"\boxed{x^2 + y^2 = 25}", "x^2+y^2=25", 1),
    ("norm_matrix", r"\boxed{[[1,2],[3,4]]}", r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", 1),
    ("norm_matrix", r"\boxed{\left[\begin{array}{cc} 1 & 2 \\ 3 & 4 \end{array}\right]}", r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", 1),
    ("norm_matrix", r"\boxed{\begin{pmatrix} 1 & 2 \end{pmatrix}}", "(1, 2)", 1),
    ("tiny_values", r"\boxed{\frac{1}{10^{20}}}", r"10^{-20}", 1),
    ("tiny_values", r"\boxed{1.0e-30}", "1.1e-30", 0),
    ("hedging", "The answer is 5 (or possibly 6).", "5", 0),
    ("hedging", r"\boxed{5} \boxed{6}", "6", 0),
    ("hedging", "Answer: 5 or 6", "6", 0),
    ("hedging", "The possible answers are 5, 6, and 7.", "7", 0),
    ("hedging", "A, B, or C", "C", 0),
    ("hedging", "The answer is A, B, or C.", "C", 0),
    ("hedging", "Either (A) or (D).", "D", 0),
    ("hedging", r"\boxed{A \text{ or } B}", "B", 0),
    ("hedging", r"\boxed{A}\boxed{B}", "B", 0),
    ("multipart", r"The answers are \boxed{2} and \boxed{3}", "2, 3", 1),
    ("multipart", r"\boxed{3, 2}", "2, 3", 1),
    ("multipart", "The answer is x = 2 and x = 3.", "2, 3", 1),
    ("multipart", "The answer is x = 2 or x = 3.", "2, 3", 1),
    ("norm_dollars_percent", r"$\boxed{28 pct}$", r"$28\%$", 1),
    ("norm_dollars_percent", r"$\boxed{28 percentage}$", r"$28\%$", 1),
    ("norm_dollars_percent", r"$\boxed{28 percent}$", r"28\%", 1),
    ("norm_dollars_percent", r"$28$ %", r"28\%", 1),
    ("norm_interval", r"Final Answer \[ \boxed{m \geq \sqrt{2}} \]", r"m \in [\sqrt{2}, +\infty)", 1),
    ("norm_interval", r"\boxed{0 < x < 12.5}", r"(0, 12.5)", 1),
    ("norm_tuple_set", r"\boxed{(3, \frac{2\pi}{3})}", r"\left( 3, \frac{\pi}{2} \right)", 0),
    ("norm_matrix", r"\boxed{\begin{pmatrix}-\frac{7}{4}&-2\\4&\frac{1}{4}\end{pmatrix}}", r"(\begin{pmatrix}-\frac{7}{4}&-2\\4&\frac{1}{4}\\\end{pmatrix})", 1),
    ("norm_plain_math", r"\boxed{\frac{1}{3x^{2/3}}}", r"\frac{1}{3\sqrt[3]{x}^2}", 1),
    ("norm_plain_math", r"\boxed{-\frac{8x^2}{9(x^2-2)^{5/3}}+\frac{2}{3(x^2-2)^{2/3}}}", r"-\frac{2(x^2+6)}{9(x^2-2)\sqrt[3]{x^2-2}^2}", 1),
    ("wrong_answers", r"\boxed{1, 3, 5, \ldots, 2n-1}", r"1, 2, \ldots, n", 0),
    ("wrong_answers", r"\boxed{1:4:9:\ldots}", r"1:2:3:\ldots", 0),
    ("wrong_answers", r"\boxed{F_n = \sum_{k=0}^{n-2} F_k F_{n-k-2}}", r"F_n = \sum_{k=0}^{n-1} F_k F_{n-k-1}", 0),
    ("norm_scientific", r"\boxed{\frac{100}{3}}", "33.3", 1),
    ("norm_matrix", r"\boxed{\begin{pmatrix}0.290243531202435\\0.196008371385084\\-0.186381278538813\end{pmatrix}}", r"(\begin{pmatrix}0.29\\0.196\\-0.186\\\end{pmatrix})", 1),
    ("norm_scientific", r"\boxed{4.52 \times 10^{33}}", "4.5e33", 0),  # another rounding, not the gold's
    ("tiny_values", r"\boxed{3.0e-10}", "2e-10", 0),
    ("tiny_values", r"\boxed{0.54}", "0.5", 0),
    ("extract_answer_is", "The final answer is 3.14.", "3.15", 0),
]
for _category, _completion, _answer, _expected in SECOND_PASS:
    case(_category, _completion, _answer, _expected, "second pass")

# ----------------------------------------------------------------------------- third pass: natural-language hedges
# Hedges in words ("Alternatively, it could be 4", "Wait, no, it's 4", "3 (maybe 4)", "Answers: 3, 4") and,
# as a guard against false hedges, correct answers followed by verification text full of other numbers.
THIRD_PASS = [
    ("hedging", "The answer is 3. Alternatively, it could be 4.", "3", 0),
    ("hedging", "The answer is 3. Alternatively, the answer could be 4.", "4", 0),
    ("hedging", r"\boxed{3} (or \boxed{4} if we count differently)", "3", 0),
    ("hedging", "The answer is 3 or 4, depending on interpretation.", "3", 0),
    ("hedging", "I'm not sure, but I'd guess 3 or 4.", "4", 0),
    ("hedging", "Answer: 3 (maybe 4)", "3", 0),
    ("hedging", "Answers: 3, 4", "4", 0),
    ("hedging", "The answer is 3. Wait, no, it's 4.", "3", 0),
    ("self_correction", "The answer is 3. Wait, no, it's 4.", "4", 1),
    ("hedging", "So the answer is 12, or maybe 13.", "12", 0),
    ("hedging", "The answer is (B), but it could also be (C).", "B", 0),
    ("hedging", "Another possible answer is 7. The answer is 5.", "5", 0),
    ("hedging", "The total is 4, or maybe 5.", "5", 0),
    ("hedging", r"\boxed{12}. Actually, it's 13.", "12", 0),
    ("hedging", r"$x = 3$ or $x = 4$ are both possible, so the answer is $3$ or $4$.", "3", 0),
    ("extract_boxed", r"The answer is \boxed{3}. Wait, let me recheck: 2+1 = 3. Yes.", "3", 1),
    ("extract_boxed", r"Therefore $17^{-1} \equiv \boxed{44} \pmod{83}$. Check: $17 \cdot 44 = 748 = 9 \cdot 83 + 1$.", "44", 1),
    ("extract_answer_is", "The answer is 12. To double-check, 4 * 3 = 12, which matches.", "12", 1),
    ("extract_answer_is", "The answer is 12. Note that 13 would be wrong because 13 is prime.", "12", 1),
    ("extract_boxed", r"So $n = \boxed{5}$. (If we had counted the endpoints we would get 7, but they are excluded.)", "5", 1),
    ("extract_boxed", r"\boxed{5}. Actually, it's 5 because the other roots are complex.", "5", 1),
    ("multipart", "The answer is x = 2, or maybe x = -2.", r"\pm 2", 1),
]
for _category, _completion, _answer, _expected in THIRD_PASS:
    case(_category, _completion, _answer, _expected, "third pass")

# ----------------------------------------------------------------------------- fourth pass: over- and under-leniency
# Rounded golds (exact or full-precision answers accepted, other roundings not), siunitx, braces without
# backslashes, number words, conditional alternatives, negated answers, and formatting odds and ends.
FOURTH_PASS = [
    ("tiny_values", r"\boxed{1.54}", "1.5", 0),
    ("tiny_values", r"\boxed{0.152}", "0.15", 0),
    ("norm_scientific", r"\boxed{\frac{100}{3}}", "33.3", 1),
    ("norm_scientific", r"\boxed{33.33}", "33.3", 0),
    ("norm_scientific", r"\boxed{33.3333333}", "33.3", 1),
    ("norm_thousands", r"\boxed{\num{1234}}", "1234", 1),
    ("norm_units_degrees", r"\boxed{\SI{5}{\meter}}", "5", 1),
    ("norm_tuple_set", r"\boxed{{1, 2}}", r"\{2, 1\}", 1),
    ("norm_tuple_set", "The answer is {1, 2}.", r"\{1, 2\}", 1),
    ("norm_scientific", "The answer is one million.", "1000000", 1),
    ("norm_scientific", "The answer is twenty-five.", "25", 1),
    ("norm_scientific", "The answer is forty.", "40", 1),
    ("hedging", "\\boxed{5}\n\nNote: if the question meant the other base, the answer would be 6.", "5", 0),
    ("wrong_answers", "The answer is not 42.", "42", 0),
    ("extract_last_number", "It's not 42, it's 43.", "43", 1),
    ("extract_boxed", r"\boxed{\displaystyle\frac{1}{2}}", "0.5", 1),
    ("extract_boxed", r"\boxed{\left. 5 \right.}", "5", 1),
    ("extract_boxed", r"\boxed{42.}", "42", 1),
    ("extract_boxed", r"$x = \boxed{5}$", "5", 1),
    ("norm_dfrac", r"\boxed{\frac{1}{2}\sqrt{3}}", r"\frac{\sqrt{3}}{2}", 1),
    ("norm_dfrac", r"\boxed{2 \sqrt 3}", r"2\sqrt{3}", 1),
    ("norm_dfrac", r"\boxed{\sqrt{3}/2}", r"\frac{\sqrt3}{2}", 1),
    ("norm_choice", r"$\boxed{(\text{C})}$", "C", 1),
    ("norm_choice", r"**(C)**", "C", 1),
    ("norm_choice", r"Answer: $\text{(C)}$", "C", 1),
    ("norm_choice", r"The answer is $\boxed{\textbf{(C) }12}$", r"\textbf{(C)}", 1),
    ("norm_choice", r"\boxed{(C) 42 \text{ or } (D) 43}", "C", 0),
    ("norm_interval", r"\boxed{\left[-2, 7\right]}", "[-2,7]", 1),
    ("norm_interval", r"\boxed{(-∞,-3)∪(3,∞)}", r"(-\infty, -3) \cup (3, \infty)", 1),
    ("norm_equation", r"\boxed{y=2x+3}", "2x - y + 3 = 0", 1),
    ("norm_equation", r"\boxed{2x - y + 3 = 0}", "y = 2x + 3", 1),
    ("norm_equation", r"\boxed{4x+8y=6}", "2x+4y=3", 1),
    ("norm_matrix", r"\boxed{\begin{pmatrix} 1 \\ 2 \\ 3 \end{pmatrix}}", r"\langle 1, 2, 3 \rangle", 1),
    ("norm_dollars_percent", r"\boxed{\$1,234.56}", "1234.56", 1),
    ("norm_dollars_percent", "So 25% of the students passed.", "25", 1),
    ("norm_units_degrees", r"\boxed{3\frac{1}{2} \text{ hours}}", "3.5", 1),
    ("norm_units_degrees", "The temperature is 45°F.", "45", 1),
    ("norm_scientific", r"\boxed{10^6}", "1000000", 1),
    ("norm_scientific", r"\boxed{1e6}", "1,000,000", 1),
    ("extract_gsm8k", "#### 18.", "18", 1),
    ("extract_gsm8k", "####18", "18", 1),
    ("extract_answer_is", "The answer is: $18", "18", 1),
    ("extract_last_number", "Therefore, Janet makes 18 dollars.", "18", 1),
    ("extract_boxed", "<think>\nlet me see\n</think>\n\\boxed{5}", "5", 1),
    ("multipart", r"\boxed{2}, \boxed{3}, \boxed{4}", "2, 3", 0),
    ("multipart", r"\boxed{-3, 3}", r"\pm 3", 1),
    ("norm_text", r"\boxed{\text{not even}}", r"\text{even}", 0),
    ("norm_plain_math", r"\boxed{\pi}", "3.14", 1),
]
FOURTH_PASS += [
    ("tiny_values", r"\boxed{e^{-1000}}", r"e^{-1001}", 0),  # floats underflow to 0: sympy, with a relative check
    ("tiny_values", r"\boxed{2^{-1000}}", r"2^{-1001}", 0),
    ("tiny_values", r"\boxed{e^{-1000}}", r"e^{-1000}", 1),
]
for _category, _completion, _answer, _expected in FOURTH_PASS:
    case(_category, _completion, _answer, _expected, "fourth pass")


# ----------------------------------------------------------------------------- fifth pass: false hedges
# Correct answers followed by restatements or commentary must keep their credit; parenthetical
# alternatives are hedges.
FIFTH_PASS = [
    ("extract_answer_is", "The answer is 5. Note that it could also be written as 10/2.", "5", 1),
    ("extract_answer_is", "The answer is 5. It could also be written in words as five.", "5", 1),
    ("extract_answer_is", "The answer is 5. Note it could also be the case that the problem means something else.", "5", 1),
    ("extract_answer_is", "The answer is 12 (or 12.0).", "12", 1),
    ("extract_answer_is", "The answer is 12 (i.e., twelve).", "12", 1),
    ("extract_boxed", r"\boxed{\frac{1}{2}} (or 0.5)", "0.5", 1),
    ("extract_answer_is", "The answer is 1/3 (approximately 0.333).", r"\frac13", 1),
    ("extract_answer_is", "The answer is 3. Actually, that is correct.", "3", 1),
    ("extract_answer_is", "The answer is 3. No, it is not 4; it is 3.", "3", 1),
    ("hedging", "The answer is 5, or maybe 6.", "5", 0),
    ("hedging", r"\boxed{3} (or 4)", "3", 0),
    ("hedging", r"\boxed{(1,2)} (or (2,1) if unordered)", "(1,2)", 0),
    ("hedging", "The answer is 3 (maybe 4).", "4", 0),
    ("extract_boxed", r"so $J$ must be $\boxed{120}$ (or else $J$ would have more than 16 factors).", "120", 1),
    ("extract_gsm8k", "32 * 0.25 = <<32*0.25=8>>8 own both.\nThe answer is <<8=8>>8.\n#### 8", "8", 1),
    ("extract_gsm8k", "the final answer is 15 gallons * 8 pints / gallon = <<15*8=120>>120 pints\n#### 120", "120", 1),
    ("norm_interval", r"\boxed{x \neq 2}", r"(-\infty,2)\cup(2,\infty)", 1),
    ("norm_interval", r"\boxed{\text{all real numbers}}", r"(-\infty,\infty)", 1),
    ("norm_interval", r"\boxed{\mathbb{R}}", r"(-\infty, \infty)", 1),
    ("norm_text", "The answer is no solution.", r"\emptyset", 1),
    ("norm_text", r"\boxed{\emptyset}", r"\text{no solution}", 1),
    ("norm_text", "The answer is yes.", r"\text{Yes}", 1),
    ("norm_text", "The answer is no.", r"\text{Yes}", 0),
]
for _category, _completion, _answer, _expected in FIFTH_PASS:
    case(_category, _completion, _answer, _expected, "fifth pass")


# ----------------------------------------------------------------------------- sixth pass: issue 12, section 1
# The categories an independent held-out check found misjudged (its cases are private; these are ours):
# shapes, written precision, matrix environments, concluding sentences, labels, inequality signs, text
# units, chat-template tokens, self-corrections. Truncated completions need finish_reason, which this
# case format does not carry: they are tested in tests/test_verifiers_math_categories.py and measured by
# benchmarks/verifiers.py.
SIXTH_PASS = [
    ("shape", r"We find $A^2 = \begin{bmatrix} 7 & 10 \\ 15 & 22 \end{bmatrix}$.", "22", 0),
    ("shape", r"We find $A^2 = \begin{bmatrix} 7 & 10 \\ 15 & 22 \end{bmatrix}$.",
     r"\begin{pmatrix} 7 & 10 \\ 15 & 22 \end{pmatrix}", 1),
    ("shape", "The centre is at $(2, -3)$ and the radius is $5$.", "5", 1),
    ("shape", r"Hence $\vec{u} = \langle 1, 0, 6 \rangle$.", "6", 0),
    ("shape", r"\boxed{(6, 6)}", "6", 0),
    ("shape", r"\boxed{\begin{pmatrix} 6 \\ 6 \\ 6 \end{pmatrix}}", "6", 0),
    ("shape", r"\boxed{\begin{pmatrix} 6 \end{pmatrix}}", "6", 1),
    ("shape", "So the eigenvector is\n\\[\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}\\]", "2", 0),
    ("precision", r"\boxed{\$23,456.79}", "23456.78", 0),
    ("precision", r"\boxed{\$23,456.78}", "23456.78", 1),
    ("precision", "The answer is 7654321.5.", "7654321.6", 0),
    ("precision", "The answer is 2500000.3.", "2500000", 0),
    ("precision", "The answer is 2500000.", "2500000.0", 1),
    ("precision", r"\boxed{0.0045679}", "0.0045678", 0),
    ("precision", r"\boxed{0.00456780}", "0.0045678", 1),
    ("precision", r"\boxed{3.605551}", r"\sqrt{13}", 1),
    ("precision", r"\boxed{3.605552}", r"\sqrt{13}", 0),
    ("matrix_env", r"\boxed{\left[\begin{array}{@{}rr@{}} -1 & 0 \\[2pt] 0 & 1 \end{array}\right]}",
     r"\begin{pmatrix} -1 & 0 \\ 0 & 1 \end{pmatrix}", 1),
    ("matrix_env", r"\boxed{\begin{bmatrix*}[c] -1 & 0 \\ 0 & 1 \end{bmatrix*}}",
     r"\begin{pmatrix} -1 & 0 \\ 0 & 1 \end{pmatrix}", 1),
    ("matrix_env", r"\boxed{\begin{array}{|c|c|} \hline -1 & 0 \\ \hline 0 & 1 \\ \hline \end{array}}",
     r"\begin{bmatrix} -1 & 0 \\ 0 & 1 \end{bmatrix}", 1),
    ("matrix_env", r"\boxed{\begin{array}{|c|c|} \hline -1 & 0 \\ \hline 0 & -1 \\ \hline \end{array}}",
     r"\begin{bmatrix} -1 & 0 \\ 0 & 1 \end{bmatrix}", 0),
    ("matrix_env", "The answer is:\n$$\n\\begin{pmatrix}\n-1 & 0 \\\\\n0 & 1\n\\end{pmatrix}\n$$",
     r"\begin{bmatrix} -1 & 0 \\ 0 & 1 \end{bmatrix}", 1),
    ("matrix_env", "Therefore\n\\[\\mathbf{M} = \\begin{pmatrix} -1 & 0 \\\\ 0 & 1 \\end{pmatrix}.\\]",
     r"\begin{bmatrix} -1 & 0 \\ 0 & 1 \end{bmatrix}", 1),
    ("conclusion", "Final Answer: The smallest possible value of $a+b$ is $12$.", "12", 1),
    ("conclusion", "Final Answer: The smallest possible value of $a+b$ is $12$.", "2", 0),
    ("conclusion", "Final answer: there are 15 such numbers.", "15", 1),
    ("conclusion", "Therefore, $y \\le -2$ is the solution.", r"(-\infty, -2]", 1),
    ("conclusion", "Therefore, $y \\le -2$ is the solution.", "-2", 0),
    ("conclusion", "So t < 4 is the answer.", "t < 4", 1),
    ("conclusion", "So t < 4 is the answer.", "4", 0),
    ("conclusion", "Thus the area of the triangle is $\\frac{15}{2}$.", "7.5", 1),
    ("conclusion", "Thus the area of the triangle is $\\frac{15}{2}$.", "2", 0),
    ("conclusion", "We checked 3 and 4, and neither works.", "4", 1),
    ("labelled", "Hence $(a, b, c) = (2, 3, 5)$.", "(2,3,5)", 1),
    ("labelled", "Hence $(a, b, c) = (2, 3, 5)$.", "5", 0),
    ("labelled", r"So $\frac{AE}{EC} = \frac{2}{\sqrt{5}}$.", r"\frac{2\sqrt5}{5}", 1),
    ("labelled", r"So $\frac{AE}{EC} = \frac{2}{\sqrt{5}}$.", "5", 0),
    ("labelled", r"This gives $\|\mathbf{v}\| = 3\sqrt{2}$.", r"3\sqrt2", 1),
    ("labelled", r"This gives $\|\mathbf{v}\| = 3\sqrt{2}$.", "2", 0),
    ("labelled", r"\boxed{m\angle BAC = 72^\circ}", "72", 1),
    ("inequality", r"\boxed{-3t \geq -12}", r"t \le 4", 1),
    ("inequality", r"\boxed{-3t \geq -12}", r"t \ge 4", 0),
    ("inequality", r"\boxed{-3t > -12}", r"t \le 4", 0),
    ("inequality", r"\boxed{5 - x > 2}", r"(-\infty, 3)", 1),
    ("inequality", r"\boxed{1 < 2x - 1 \le 5}", r"(1, 3]", 1),
    ("inequality", r"\boxed{1 < 2x - 1 \le 5}", r"(1, 5]", 0),
    ("inequality", r"\boxed{b - a \geq 0}", r"a \le b", 1),
    ("inequality", r"\boxed{a - b \geq 0}", r"a \le b", 0),
    ("text_units", r"\boxed{7\textnormal{ feet}}", "7", 1),
    ("text_units", r"\boxed{7 \textnormal{ cubic inches}}", "7", 1),
    ("text_units", r"\boxed{\textnormal{7 hours}}", "7", 1),
    ("text_units", r"\boxed{4\pi \textnormal{ square units}}", r"4\pi", 1),
    ("text_units", r"\boxed{7\textnormal{ feet}}", "8", 0),
    ("chat_tokens", "So $(x, y) = (7, 6)$. <|im_start|>user\nThanks! Now solve x + y = 1. <|im_end|>", "(7,6)", 1),
    ("chat_tokens", "The answer is 12.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nThe answer is 13.", "12", 1),
    ("chat_tokens", "The answer is 12.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nThe answer is 13.", "13", 0),
    ("chat_tokens", "\\boxed{9}</s><s>[INST] next question [/INST] \\boxed{10}", "9", 1),
    ("self_correction", r"\boxed{18}. Hmm, wait: I double counted the corner. So the answer is \boxed{17}.", "17", 1),
    ("self_correction", r"\boxed{18}. Hmm, wait: I double counted the corner. So the answer is \boxed{17}.", "18", 0),
    ("self_correction", "The answer is 40.\n\nActually, I made an arithmetic error: 8 * 6 = 48.\n\nThe answer is 48.", "48", 1),
    ("self_correction", "#### 40\nCorrection: the discount applies twice.\n#### 32", "32", 1),
    ("hedging", r"\boxed{18}. Wait, maybe it is \boxed{17}, or perhaps \boxed{16}.", "16", 0),
    ("hedging", r"\boxed{18}. Actually it could also be \boxed{17}.", "17", 0),
    ("self_correction", r"\boxed{18} or \boxed{17}. Wait, let me check... yes, \boxed{17}.", "17", 1),
    ("hedging", r"\boxed{18} or \boxed{17}. Wait, let me check... yes, \boxed{17} or \boxed{18}.", "17", 0),
]
for _category, _completion, _answer, _expected in SIXTH_PASS:
    case(_category, _completion, _answer, _expected, "sixth pass (issue 12)")


# ----------------------------------------------------------------------------- seventh pass: Math-Verify's suite
# The failure groups found by scoring this verifier on Math-Verify's own unit tests
# (tests/test_math_verify_suite.py reads them from its sdist; none of its cases is copied here, these
# are ours): golds with a named left side, chained and approximate results, math segments without a
# standalone number, golds with several boxes or a worked solution, digit grouping and decimal commas,
# chained inequalities against intervals; and two false positives: a response still inside its <think>
# block, and a large matrix filled with the gold number.
_BIG_MATRIX = r"\begin{pmatrix} " + r" \\ ".join(" & ".join(["3"] * 30) for _ in range(30)) + r" \end{pmatrix}"
_WORKED_GOLD = ("The boxes hold 4 rows of 6 apples, so there are $4 \\cdot 6 = 24$ apples; 7 are eaten, which "
                "leaves $24 - 7 = 17$. Final Answer: The final answer is $17$. I hope it is correct. Note: the "
                "count assumes no apple was counted twice, which the statement guarantees. Final Answer: The "
                "final answer is $17$.")
SEVENTH_PASS = [
    ("labelled", r"\boxed{12}", r"|PQ| = 12", 1),
    ("labelled", r"\boxed{13}", r"|PQ| = 12", 0),
    ("labelled", "$$7$$", "g(t) = 7", 1),
    ("labelled", "$$-7$$", "g(t) = 7", 0),
    ("labelled", r"\boxed{(4, 9)}", "(m, n) = (4, 9)", 1),
    ("labelled", r"\boxed{(9, 4)}", "(m, n) = (4, 9)", 0),
    ("labelled", r"\boxed{6, 8}", "PQ=6, RS=8", 1),
    ("labelled", r"\boxed{6, 9}", "PQ=6, RS=8", 0),
    ("labelled", r"\boxed{2:5}", "A_1:A_2 = 2:5", 1),
    ("labelled", r"\boxed{5:2}", "A_1:A_2 = 2:5", 0),
    ("labelled", r"\boxed{\frac{\sqrt{3}}{3}}", r"\frac{PM}{MQ} = \frac{1}{\sqrt{3}}", 1),
    ("labelled", r"\boxed{(3,1),(5,1)}", "a=3, b=1; a=5, b=1", 1),
    ("labelled", r"\boxed{(1,3),(1,5)}", "a=3, b=1; a=5, b=1", 0),
    ("labelled", "The answer is 5.", "x + y = 5", 0),
    ("chained", r"$y = 4 \cdot 3 - 2 = 10$", "10", 1),
    ("chained", r"$y = 4 \cdot 3 - 2 = 10$", "12", 0),
    ("chained", r"So $y = 4 \cdot 3 - 2 = 10$.", "y = 10", 1),
    ("chained", r"Thus $t = \frac{2}{3} \approx 0.67$.", r"\frac23", 1),
    ("chained", r"Thus $t = \frac{2}{3} \approx 0.67$.", "0.67", 1),
    ("chained", r"Thus $t = \frac{2}{3} \approx 0.67$.", "0.6", 0),
    ("chained", r"So $r \approx 2.45$.", "2.45", 1),
    ("chained", r"\boxed{w = 3 + 4 = 7}", "7", 1),
    ("chained", r"\boxed{w = 3 + 4 = 7}", "3", 0),
    ("bare_answer", r"\frac{7}{4}", "1.75", 1),
    ("bare_answer", r"\frac{7}{4}", "4", 0),
    ("bare_answer", r"-\frac{7}{4}", "-1.75", 1),
    ("bare_answer", r"$\frac25$", "0.4", 1),
    ("bare_answer", r"$\frac25$", "5", 0),
    ("bare_answer", r"$\sqrt5 $", r"\sqrt{5}", 1),
    ("bare_answer", r"$\sqrt5 $", "5", 0),
    ("bare_answer", r"$\cos^2(t)$", r"1 - \sin^2(t)", 1),
    ("bare_answer", r"$\cos^2(t)$", r"1 + \sin^2(t)", 0),
    ("bare_answer", "$$\\text{composite}$$", r"\text{composite}", 1),
    ("bare_answer", "$$\\text{composite}$$", r"\text{prime}", 0),
    ("bare_answer", "$prime$", r"\text{Prime}", 1),
    ("bare_answer", "$$g(s) = s^2$$", "g(s) = s^2", 1),
    ("bare_answer", "$$g(s) = s^3$$", "g(s) = s^2", 0),
    ("bare_answer", "3 5", "15", 0),
    ("bare_answer", r"$\begin{pmatrix} 2 & 0 \\ 0 & 2 \end{pmatrix}$", "2", 0),
    ("norm_thousands", "12 500", "12500", 1),
    ("norm_thousands", "12 500", "500", 0),
    ("norm_thousands", "It costs 4,75 €.", "4.75", 1),
    ("norm_thousands", "It costs 4,75 €.", "475", 0),
    ("norm_thousands", "The plot measures 2,500.5m².", "2500.5", 1),
    ("norm_thousands", "The plot measures 2,500.5m².", "2500", 0),
    ("norm_thousands", r"$\boxed{48, 120}$", "48120", 0),
    ("norm_thousands", r"$\boxed{48,120}$", "48120", 1),
    ("norm_thousands", r"\boxed{3,5}", "3.5", 1),
    ("norm_thousands", r"\boxed{3,5}", "35", 0),
    ("norm_thousands", r"\boxed{0.45}", "0,45", 1),
    ("norm_thousands", r"\boxed{2, 45}", "2,45", 1),
    ("norm_thousands", r"\boxed{2.46}", "2,45", 0),
    ("gold_forms", r"\boxed{3, 8}", r"\boxed{3} and \boxed{8}", 1),
    ("gold_forms", r"\boxed{8}", r"\boxed{3} and \boxed{8}", 0),
    ("gold_forms", r"The sides are $\boxed{5}$ and $\boxed{12}$.", r"$\boxed{12}$, $\boxed{5}$", 1),
    ("gold_forms", r"\boxed{8}", r"First \boxed{3}, which fails the check on the second condition; the count is \boxed{8}", 1),
    ("gold_forms", r"\boxed{3, 8}", r"First \boxed{3}, which fails the check on the second condition; the count is \boxed{8}", 0),
    ("gold_forms", r"\boxed{17}", _WORKED_GOLD, 1),
    ("gold_forms", r"\boxed{24}", _WORKED_GOLD, 0),
    ("gold_forms", r"\boxed{2, 7, 9}", "2, 7 or 9", 1),
    ("gold_forms", r"\boxed{2, 7}", "2, 7 or 9", 0),
    ("gold_forms", r"The answer is $\\frac{1}{4}$.", "0.25", 1),
    ("gold_forms", r"\boxed{0.25}", r"$\\frac{1}{4}$", 1),
    ("gold_forms", r"\boxed{0.5}", r"$\\frac{1}{4}$", 0),
    ("inequality", r"$w \in [-5, -2] \cup [2, 5]$", r"2 \le |w| \le 5", 1),
    ("inequality", r"$w \in [2, 5]$", r"2 \le |w| \le 5", 0),
    ("inequality", r"$(0, 4)$", "0 < g(x) < 4", 1),
    ("inequality", r"$[0, 4]$", "0 < g(x) < 4", 0),
    ("inequality", r"$t \in [-1, 6]$", r"-1 \\le t \\le 6", 1),
    ("norm_tuple_set", "${2,6}$", "(2,6)", 1),
    ("norm_tuple_set", "${2,6}$", "(6,2)", 0),
    ("norm_tuple_set", r"\boxed{(1,2), (3,4), (1,2)}", "(1,2),(3,4)", 1),
    ("norm_tuple_set", r"\boxed{(1,2), (3,5)}", "(1,2),(3,4)", 0),
    ("conclusion", r"Interest for the first half-year: $0.03 \cdot 5,000 = \boxed{150}$ So the balance is 5,150 "
                   r"dollars. For the second: $0.03 \cdot 5,150 = \boxed{154.5}$ So the balance becomes 5,304.5 "
                   r"dollars. Final Answer: The final answer is $5,304.50$.", "5304.5", 1),
    ("hedging", r"So $0.03 \cdot 5,000 = \boxed{150}$. Final Answer: 5,304.50", "5304.5", 0),
    ("hedging", r"\boxed{150} Then the balance grows again in the second half of the year. Final Answer: The "
                r"final answer is $5,304.50$.", "5304.5", 0),
    ("extract_last_number", "<think>\nEach of the 6 bags holds 7 marbles, so 6 * 7 = 42", "42", 0),
    ("extract_last_number", "<think>\nEach of the 6 bags holds 7 marbles. So there are 42 marbles.", "42", 0),
    ("extract_last_number", "<think>6 * 7 = 42</think>\nThere are 42 marbles.", "42", 1),
    ("shape", f"The matrix is ${_BIG_MATRIX}$.", "3", 0),
    ("shape", f"{_BIG_MATRIX}", "3", 0),
]
for _category, _completion, _answer, _expected in SEVENTH_PASS:
    case(_category, _completion, _answer, _expected, "seventh pass (Math-Verify's suite)")

def main() -> None:
    out = Path(__file__).with_name("cases.jsonl")
    counts: dict[str, int] = {}
    with out.open("w") as f:
        for c in CASES:
            counts[c["category"]] = counts.get(c["category"], 0) + 1
            c = {"id": f"{c['category']}-{counts[c['category']]:03d}", **c}
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    print(f"wrote {len(CASES)} cases to {out}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
