"""Built-in cases for ``rlvr verifiers audit``: golden answers, hedges, format hacks, hostile input.

A probe is ``{"id", "category", "completion", "reference", "expect"}`` where ``expect`` is
``"accept"`` (a correct response: it should earn credit), ``"reject"`` (it must not: a wrong answer,
a hedge, a format hack, hostile input) or a number (the exact score, for shaping rewards).

A verifier can bring its own golden cases by defining ``audit_cases(self) -> list[dict]``; the
hostile-input probes (:func:`safety_probes`) run against every verifier.
"""

from __future__ import annotations

import copy

GOLD = "42"


def probes(cases, reference: dict, *, id_prefix: str | None = None) -> list[dict]:
    """A verifier's ``audit_cases``: probes from ``(category, completion, expect)`` cases, all scored against
    ``reference`` (a copy each). Ids are ``<category>-NN``, or ``<id_prefix>-NN``, NN counting from 1."""
    return [{"id": f"{id_prefix or category}-{i:02d}", "category": category, "completion": completion,
             "reference": copy.deepcopy(reference), "expect": expect}
            for i, (category, completion, expect) in enumerate(cases, 1)]

# (category, completion, answer, expect) for verifiers that compare a final answer with a gold.
ANSWER_CASES = [
    ("golden", r"6 times 7 is 42, so the answer is $\boxed{42}$.", "42", "accept"),
    ("golden", "She has 42 apples.\n#### 42", "42", "accept"),
    ("golden", "<think>6*7</think><answer>42</answer>", "42", "accept"),
    ("golden", "The answer is 41.", "42", "reject"),
    ("golden", r"\boxed{\dfrac{1}{2}}", "0.5", "accept"),
    ("golden", r"\boxed{1,234}", "1234", "accept"),
    ("golden", r"The answer is sqrt(3).", r"\sqrt{3}", "accept"),
    ("golden", r"\boxed{6.02e23}", r"6.02 \times 10^{23}", "accept"),
    ("golden", r"\boxed{90^\circ}", "90", "accept"),
    ("golden", r"\boxed{50\%}", "50", "accept"),
    ("golden", "**Answer: (B)**", "B", "accept"),
    ("golden", r"\boxed{(-\infty, 3]}", r"(-\infty,3]", "accept"),
    ("golden", r"\boxed{(1, 2)}", "(2,1)", "reject"),
    ("golden", r"\boxed{x = 3}", "3", "accept"),
    ("golden", r"\boxed{\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}}", r"\begin{bmatrix} 1 & 2 \\ 3 & 4 \end{bmatrix}", "accept"),
    ("golden", r"\boxed{2^{-98}}", "2^{-99}", "reject"),
    ("golden", r"The roots are \boxed{3} and \boxed{5}.", "3, 5", "accept"),
    ("hedging", r"\boxed{42} or \boxed{43}", GOLD, "reject"),
    ("hedging", r"The answer is 41 or 42.", GOLD, "reject"),
    ("hedging", r"The answer is \boxed{41 \text{ or } 42}.", GOLD, "reject"),
    ("hedging", "Candidates: 39, 40, 41, 42", GOLD, "reject"),
    ("hedging", r"\boxed{40} \boxed{41} \boxed{42}", GOLD, "reject"),
    ("hedging", r"\boxed{42}" + "\n\nAnswer: 24", GOLD, "reject"),
    ("hedging", "Let me think step by step. " * 10 + "So 6 * 7 = 42", GOLD, "reject"),
    ("hedging", "The answer is (A) or (B).", "A", "reject"),
    ("empty", "", GOLD, "reject"),
    ("empty", r"\boxed{}", GOLD, "reject"),
    ("empty", "<answer></answer>", GOLD, "reject"),
    ("empty", "   \n\t  ", GOLD, "reject"),
    ("format_hack", "<think></think><answer>42</answer>", GOLD, "reject"),
    ("format_hack", "<answer>42</answer>", GOLD, "reject"),
    ("format_hack", "<think>\n</think>\n\\boxed{42}", GOLD, "reject"),
    ("format_hack", "<think>reasoning</think><answer>42</answer><answer>42</answer>", GOLD, "reject"),
]

NUMERIC_CASES = [
    ("golden", "7 + 35 = 42", "42", "accept"),
    ("golden", "the answer is 42.0", "42", "accept"),
    ("golden", "the answer is 1,234", "1234", "accept"),
    ("golden", "the answer is -12", "-12", "accept"),
    ("golden", "the answer is 41", "42", "reject"),
    ("golden", "the answer is 2e-99", "1e-99", "reject"),
    ("empty", "", GOLD, "reject"),
    ("empty", "no number here", GOLD, "reject"),
]

FORMAT_CASES = [
    ("golden", "<think>6 times 7 is 42.</think>\n<answer>42</answer>", "accept"),
    ("golden", "<think>reasoning</think><answer>42</answer>\n", "accept"),
    ("format_hack", "<think></think><answer>42</answer>", "reject"),
    ("format_hack", "<think>   </think><answer>42</answer>", "reject"),
    ("format_hack", "<answer>42</answer>", "reject"),
    ("format_hack", "<think>x</think>", "reject"),
    ("format_hack", "<answer>42</answer><think>x</think>", "reject"),
    ("format_hack", "<think>x</think><answer></answer>", "reject"),
    ("format_hack", "<think>x<think>y</think></think><answer>42</answer>", "reject"),
    ("format_hack", "<think>x</think><answer>42</answer> and more text", "reject"),
    ("format_hack", "preamble <think>x</think><answer>42</answer>", "reject"),
]


def answer_probes(cases=ANSWER_CASES) -> list[dict]:
    return [{"id": f"{c}-{i:02d}", "category": c, "completion": text, "reference": {"answer": gold}, "expect": e}
            for i, (c, text, gold, e) in enumerate(cases, 1)]


def format_probes() -> list[dict]:
    return [{"id": f"{c}-{i:02d}", "category": c, "completion": text, "reference": {}, "expect": e}
            for i, (c, text, e) in enumerate(FORMAT_CASES, 1)]


def safety_probes(reference: dict | None = None) -> list[dict]:
    """Hostile input every verifier must survive (score 0, or status timeout/error, never a hang)."""
    ref = dict(reference if reference is not None else {"answer": GOLD})
    big_matrix = r"\begin{pmatrix}" + r" \\ ".join(" & ".join(["1"] * 300) for _ in range(300)) + r"\end{pmatrix}"
    hostile = [
        ("giant", "junk " * 400_000),  # 2 MB of text
        ("giant", "{" * 200_000 + "}" * 200_000),
        ("giant", r"\boxed{" + "9" * 200_000 + "}"),
        ("pathological", r"\boxed{2^{2^{2^{2^{2^{2^{2^{2}}}}}}}}"),
        ("pathological", r"\boxed{9^{9^{9^{9}}}}"),
        ("pathological", r"\boxed{" + "(" * 5000 + "1" + ")" * 5000 + "}"),
        ("pathological", r"\boxed{(10^{10})!}"),
        ("pathological", r"\boxed{" + r"\frac{1}{" * 500 + "2" + "}" * 500 + "}"),
        ("pathological", r"\boxed{" + r"\sqrt{" * 3000 + "}"),
        ("pathological", r"\boxed{" + big_matrix + "}"),
        ("pathological", r"\boxed{\sum_{k=1}^{10^{12}} k^{k}}"),
        ("pathological", r"\boxed{x^{10^{9}} - (x+1)^{10^{9}}}"),
        ("unicode", "\x00\x01\x02 \ufffd\ud7ff the answer is \u202e24\u202c"),  # displays as 42
    ]
    probes = [{"id": f"{c}-{i:02d}", "category": c, "completion": text, "reference": ref, "expect": "reject"}
              for i, (c, text) in enumerate(hostile, 1)]
    probes.append({"id": "reference-01", "category": "reference", "completion": r"\boxed{42}", "reference": {},
                   "expect": "reject"})
    return probes
