"""The ``math`` verifier: does the response's final answer equal the gold answer?

Pipeline (one module per step)::

    extract.py      the answers the response commits to (boxed, "the answer is", ####, <answer>, ...),
                    with special_tokens.py, statements.py, self_correction.py, fallback.py
    normalize.py    strip dressing: $, \\text{}, \\dfrac, units, degrees, \\$, %, thousands separators
    answer.py       the answer's shape: number/formula, tuple, set, interval, matrix, equation, letter
    equivalence.py  exact / numeric / random-point comparison (no sympy)          ~0.1 ms
    symbolic.py     sympy via math-verify, only when the fast rules cannot decide   ~10-50 ms

score = 1.0 when the response commits to exactly one answer (or, for a multi-part gold, to one
set of parts) and it equals the gold; 0.0 otherwise, including *hedging*: two different boxed
values, "A or B", an enumeration of candidates, or a cut-off response whose last number happens
to match. After an explicit self-correction ("\\boxed{5}. Wait, that is wrong ... \\boxed{7}") only
the answers after it count. A response cut off by the length limit (``finish_reason="length"``)
counts only an explicit final-answer marker, and so does one still inside its ``<think>`` block. A
text whose every LaTeX command has two backslashes (escaped twice) is read once. ``status="error"``
means the item could not be judged: no gold in the reference, or an answer too large to evaluate
safely (power towers, giant factorials, deeply nested input).

math-verify's signal-based timeouts are disabled here (they break outside the main thread); the
:class:`~verifiers.runner.VerifierRunner` enforces the deadline by killing the worker process.
"""

from __future__ import annotations

import re
import time
from functools import lru_cache

from rlvr.verifiers.base import Reward, Verifier
from rlvr.verifiers.math import symbolic
from rlvr.verifiers.math.answer import (
    Answer, Choice, Matrix, Scalar, Seq, Text, Union_, Unparsed, parse_answer, split_top,
)
from rlvr.verifiers.math.choices import choice_letters
from rlvr.verifiers.math.equivalence import Tolerance, compare
from rlvr.verifiers.math.expr import TooLarge
from rlvr.verifiers.math.extract import extract, final_region, find_boxed
from rlvr.verifiers.math.normalize import normalize, undouble_escapes
from rlvr.verifiers.math.special_tokens import cut_at_special_tokens
from rlvr.verifiers.registry import register_verifier

MAX_CANDIDATES = 16
_PAREN_ALTERNATIVE_RE = re.compile(r"\s*\(\s*(?:or|maybe|possibly|perhaps)\s+([^()]*)\)")
_RESTATEMENT_RE = re.compile(r"\s*\(\s*(?:i\.\s?e\.?,?|that\s+is,?|which\s+is|about|approximately|approx\.?|roughly|"
                             r"=|\u2248|\\approx)[^()]*\)")
_HEDGE_WORDS_RE = re.compile(r"(?i)^\s*(?:maybe|perhaps|possibly|probably|else)\b\s*")
_OPTION_GOLD_RE = re.compile(r"^\(\s*([A-J])\s*\)\s+\S")
MAX_ANSWER_CHARS = 4000  # a final answer longer than this is not an answer (hostile or runaway output)
_OR_RE = re.compile(r"\\(?:text|mbox|textbf|mathrm)\s*\{\s*(or|and)\s*\}|\\lor\b|\\vee\b", re.I)


MAX_PLAIN_GOLD = 200  # a gold without a box or #### that is longer, or says "final answer" / "answer is", is a
# worked solution: its last answer statement is the gold
_GOLD_DECIMAL_COMMA_RE = re.compile(r"^[-+]?\d+,\d+$")
_GOLD_STATEMENT_RE = re.compile(r"(?i)\bfinal\s+answer\b|\banswer\s+is\b")


@lru_cache(maxsize=4096)
def parse_gold(raw: str) -> tuple[str, Answer]:
    """The gold answer as ``(normalised text, parsed shape)``. A full GSM8K solution (``#### N``), a
    MATH solution (``\\boxed{...}``) or a worked solution that ends in an answer statement ("Final
    Answer: The final answer is $28\\%$") is reduced to its final answer first. A gold with several
    different boxes (``\\boxed{1} papers and \\boxed{2} bins``) is the list of their contents."""
    text = undouble_escapes(raw.strip())
    if "####" in text:
        text = text.rsplit("####", 1)[1].strip()
    elif "\\boxed" in text or "\\fbox" in text:
        boxes = find_boxed(text)
        if boxes:
            text = _boxed_gold(text, boxes)
    elif len(text) > MAX_PLAIN_GOLD or _GOLD_STATEMENT_RE.search(text):
        stated = extract(text, think_tag=None, fallback="none").answers
        if stated:
            text = stated[-1]
    clean = normalize(text).text
    option = _OPTION_GOLD_RE.match(clean)  # "(B) 12": a multiple-choice gold written with its option text
    if option:
        return clean, Choice(option.group(1))
    return clean, parse_answer(text)


_LIST_GAP_WORDS = {"and", "or"}


def _listed(gap: str) -> bool:
    """The text between two boxes joins them into one list: nothing but symbols, or a connector
    ("," / "and" / "or") among at most three words (``\\boxed{1} papers and \\boxed{2} bins``)."""
    if len(gap) > 60:
        return False
    words = re.findall(r"[A-Za-z]+", re.sub(r"\\(?:quad|qquad|text|mbox|mathrm)\b|\\[()\[\]]", " ", gap))
    if not words:
        return True
    return len(words) <= 3 and ("," in gap or any(w.lower() in _LIST_GAP_WORDS for w in words))


def _boxed_gold(text: str, boxes: list[tuple[int, int, str]]) -> str:
    """The gold of a solution's boxes: its last box, with the boxes written before it as one list
    (``\\boxed{1} and \\boxed{-2}``, ``\\boxed{2}, \\boxed{3}``); repeated values count once."""
    first = len(boxes) - 1
    while first > 0 and _listed(text[boxes[first - 1][1]: boxes[first][0]]):
        first -= 1
    contents = [b[2] for b in boxes[first:]]
    kept: list[tuple[str, Answer]] = []
    for content in contents[-MAX_CANDIDATES:]:
        if not content.strip():
            continue
        shape = parse_answer(content)
        if not any(k == content or compare(a, shape, Tolerance()) for k, a in kept):
            kept.append((content, shape))
    if not kept:
        return contents[-1]
    return kept[0][0] if len(kept) == 1 else ", ".join(k for k, _ in kept)


def split_alternatives(answer: str) -> list[str]:
    """``"3 or 5"`` -> ``["3", "5"]`` (an answer that offers alternatives offers several answers).

    A parenthetical ``(or 5)`` / ``(maybe 5)`` is an alternative too; ``(i.e. twelve)``,
    ``(approximately 0.33)`` only restate the answer and are dropped."""
    cleaned = _RESTATEMENT_RE.sub(" ", answer)
    cleaned = _PAREN_ALTERNATIVE_RE.sub(r" or \1", cleaned)
    cleaned = _OR_RE.sub(lambda m: f" {m.group(1).lower()} " if m.group(1) else " or ", cleaned)
    cleaned = re.sub(r"\beither\b", " ", cleaned)
    parts = split_top(cleaned, (" or ",))
    return [p for p in (_HEDGE_WORDS_RE.sub("", p).strip(" ,;") for p in parts) if p]


@register_verifier("math")
class MathVerifier(Verifier):
    """Final answer equals ``reference["answer"]`` (see the module docstring for the full rules).

    Options:
        tolerance: relative tolerance for values written with decimals or irrational values
            (``|a-b| <= tolerance * max(|a|,|b|)``); exact rationals always compare exactly.
        fallback: ``"last_number"`` (the last number when no marker is present, refused when the
            response looks cut off or ends on an enumeration) or ``"none"``.
        answer_key: the reference field holding the gold answer (a string, a number, or a list of
            acceptable alternatives).
        think_tag: the reasoning tag whose content is skipped when the response closes it (None: off).
        penalize_hedging: score 0 when the response commits to several different answers.
        use_sympy: consult sympy (via math-verify) when the fast rules cannot decide.
        max_chars: only the last ``max_chars`` characters are read (the answer is at the end).
        choices: letters accepted as multiple-choice answers (extended up to the gold letter).
        rounded_gold: a decimal gold with >= 2 significant digits accepts a more precise answer
            that rounds to it (gold ``33.3``, answer ``100/3``).
        exact_decimals: the relative tolerance stays within the digits written: a decimal gold is
            exact to half a unit in its last written place (``12345.67`` is not ``12345.68``, a
            2-decimal amount is exact to the cent) and a decimal answer to an exact gold must be that
            value rounded or cut at its own last place (``1234567.4`` is not ``1234567``); false lets
            ``tolerance`` alone decide.
    """

    kind = "answer"  # rlvr verifiers audit: the built-in final-answer golden set

    name = "math"
    description = "final answer (boxed / 'the answer is' / #### / <answer> / last number) equals the gold; hedging scores 0"

    def __init__(self, tolerance: float = 1e-6, fallback: str = "last_number", answer_key: str = "answer",
                 think_tag: str | None = "think", penalize_hedging: bool = True, use_sympy: bool = True,
                 max_chars: int = 20_000, choices: str = "ABCDE", rounded_gold: bool = True,
                 exact_decimals: bool = True):
        if not 0 <= tolerance < 1:
            raise ValueError("math: tolerance must be in [0, 1)")
        if fallback not in ("last_number", "none"):
            raise ValueError("math: fallback must be 'last_number' or 'none'")
        self.tolerance = Tolerance(float(tolerance), bool(rounded_gold), bool(exact_decimals))
        self.fallback = fallback
        self.answer_key = answer_key
        self.think_tag = think_tag
        self.penalize_hedging = penalize_hedging
        self.use_sympy = use_sympy
        self.max_chars = int(max_chars)
        self.choices = choices.upper()

    # ------------------------------------------------------------------ public
    def score(self, completion: str, reference: dict, *, prompt=None, finish_reason: str | None = None) -> Reward:
        """Score one completion. ``finish_reason`` is how generation ended (``"stop"``, ``"length"``, or
        None when unknown): a completion cut off by the length limit has an answer only through an
        explicit final-answer marker. ``prompt`` is accepted and unused."""
        start = time.perf_counter()
        info: dict = {"extracted": None}
        golds = self._gold_texts(reference)
        if not golds:
            info["error"] = f"reference has no {self.answer_key!r} field"
            return Reward(0.0, status="error", latency_s=time.perf_counter() - start, info=info)
        completion = undouble_escapes(cut_at_special_tokens(completion or ""))
        truncated = finish_reason == "length"
        found = extract(completion, think_tag=self.think_tag, fallback=self.fallback, max_chars=self.max_chars,
                        finish_reason=finish_reason)
        info["source"] = found.source
        candidates: list[str] = []
        for a in found.answers:
            candidates.extend(c for c in split_alternatives(a) if c not in candidates)
        alternatives = [c for a in found.alternatives for c in split_alternatives(a) if c not in candidates]
        revised = [c for a in found.revised for c in split_alternatives(a) if c not in candidates][:MAX_CANDIDATES]
        if any(len(c) > MAX_ANSWER_CHARS for c in candidates + alternatives):
            info["extracted"] = candidates[-1][:200] if candidates else None
            info["error"] = f"answer too large to judge safely: longer than {MAX_ANSWER_CHARS} characters"
            return Reward(0.0, status="error", latency_s=time.perf_counter() - start, info=info)
        candidates = [c for c in candidates if normalize(c).text]
        if alternatives:
            info["alternatives"] = alternatives[:8]
        if not candidates and (truncated or not any(isinstance(parse_gold(g)[1], Choice) for g in golds)):
            return Reward(0.0, latency_s=time.perf_counter() - start, info=info)
        info["extracted"] = candidates[0] if len(candidates) == 1 else " | ".join(candidates)[:500]
        status, correct = "ok", False
        try:
            for gold in golds:
                # a cut-off response has no last line to read a letter from: only its markers count
                correct = self._judge(gold, candidates, alternatives, info, "" if truncated else completion)
                if not correct and revised and _multi_part(parse_gold(gold)[1]):
                    # "The roots are \boxed{2}. Actually, there is another: \boxed{5}": a revision that
                    # adds a part, not one that replaces the answer, for a multi-part gold
                    correct = self._judge(gold, revised + candidates, alternatives, info, completion)
                if correct:
                    break
        except (TooLarge, symbolic.TooComplex, RecursionError, MemoryError) as exc:
            status = "error"
            info["error"] = f"answer too large to judge safely: {exc}"
        return Reward(float(correct), status=status, latency_s=time.perf_counter() - start, info=info)

    # ------------------------------------------------------------------ steps
    def _gold_texts(self, reference: dict) -> list[str]:
        raw = reference.get(self.answer_key) if isinstance(reference, dict) else None
        if raw is None:
            return []
        values = raw if isinstance(raw, (list, tuple)) else [raw]
        return [_number_text(v) for v in values if str(v).strip()]

    def _judge(self, gold_raw: str, candidates: list[str], alternatives: list[str], info: dict,
               completion: str) -> bool:
        gold_text, gold = parse_gold(gold_raw)
        if isinstance(gold, Choice):
            return self._judge_choice(gold, candidates + alternatives, info, completion)
        if not candidates:
            return False
        if len(candidates) == 1 and _GOLD_DECIMAL_COMMA_RE.match(gold_text) \
                and normalize(candidates[0]).text == gold_text.replace(",", "."):
            # gold "1,22" is a list (MATH writes "0,1", "27,93") unless the answer writes it with a
            # decimal point: then the comma was a decimal comma
            info["method"] = "decimal_comma"
            return True
        numeric_gold = isinstance(gold, Scalar) and not gold.expr.variables
        parsed = [(c, parse_answer(c, numeric_gold=numeric_gold)) for c in candidates[: MAX_CANDIDATES + 1]]
        for alt in alternatives[:MAX_CANDIDATES]:  # a proposed alternative counts when it is math, not prose
            shape = parse_answer(alt, numeric_gold=numeric_gold)
            if not isinstance(shape, (Text, Unparsed, Choice)):  # a lone capital is a name here, not an option
                parsed.append((alt, shape))
        distinct = self._distinct(parsed)
        if len(distinct) > 1:
            if isinstance(gold, Union_) and len(distinct) == len(gold.items):  # "x < -1 or x > 3"
                verdict = compare(gold, Union_(tuple(a for _, a in distinct)), self.tolerance)
                info["method"] = "fast" if verdict is not None else "undecided"
                return bool(verdict)
            if not _multi_part(gold) or len(distinct) > MAX_CANDIDATES:
                if self.penalize_hedging:
                    info["hedged"] = True
                    return False
                distinct = distinct[-1:]  # hedging allowed: the last answer counts
            else:
                combined = Seq(tuple(a for _, a in distinct), "list")
                verdict = compare(gold, combined, self.tolerance)
                info["method"] = "fast" if verdict is not None else "undecided"
                return bool(verdict)
        pred_text, pred = distinct[0]
        verdict = compare(gold, pred, self.tolerance)
        info["method"] = "fast"
        if verdict is None and _shape_mismatch(gold, gold_text, pred, pred_text):
            verdict, info["method"] = False, "shape"
        if verdict is None:
            verdict, info["method"] = self._slow(gold_text, normalize(pred_text).text, gold)
        return verdict

    def _judge_choice(self, gold: Choice, candidates: list[str], info: dict, completion: str) -> bool:
        allowed = self.choices + "".join(chr(c) for c in range(ord("A"), ord(gold.letter) + 1))
        letters: set[str] = set()
        for c in candidates:
            letters |= choice_letters(c, allowed)
        if not letters:  # no marker named a letter ("(D) 12", "Option B is correct."): read the last line
            lines = [ln for ln in final_region(completion[-self.max_chars:], self.think_tag).split("\n") if ln.strip()]
            if lines and len(lines[-1]) <= 200:
                letters = choice_letters(lines[-1], allowed)
                info["extracted"] = lines[-1].strip()[:200] if letters else info["extracted"]
        info["method"] = "choice"
        if len(letters) > 1 and self.penalize_hedging:
            info["hedged"] = True
            return False
        return gold.letter in letters

    def _distinct(self, parsed: list[tuple[str, Answer]]) -> list[tuple[str, Answer]]:
        """Candidates with equivalent duplicates removed (``\\boxed{1/2}`` ... ``Answer: 0.5`` is one answer)."""
        kept: list[tuple[str, Answer]] = []
        for text, answer in parsed:
            duplicate = False
            for kept_text, kept_answer in kept:
                same = compare(kept_answer, answer, self.tolerance) or compare(answer, kept_answer, self.tolerance)
                if same is None:
                    same = normalize(kept_text).text == normalize(text).text
                if same:
                    duplicate = True
                    break
            if not duplicate:
                kept.append((text, answer))
        return kept

    def _slow(self, gold_text: str, pred_text: str, gold: Answer | None = None) -> tuple[bool, str]:
        if _text_key(gold_text) == _text_key(pred_text) and _text_key(gold_text):
            return True, "string"  # the same text needs no sympy (and no guard)
        if self.use_sympy:
            # a decimal gold is exact to half a unit in its last written place, in sympy too
            abs_tol = float(gold.ulp) / 2 if isinstance(gold, Scalar) and gold.ulp is not None \
                and self.tolerance.exact_decimals else None
            verdict = symbolic.sympy_equal(gold_text, pred_text, rel_tol=self.tolerance.relative, abs_tol=abs_tol)
            if verdict is not None:
                return verdict, "sympy"
        return _text_key(gold_text) == _text_key(pred_text) and bool(_text_key(gold_text)), "string"


_SEVERAL_ENTRIES_RE = re.compile(r"\\begin\{|&|,|;|\\\\")
_TABLE_RE = re.compile(r"\\begin\{|&|\\\\")  # an unreadable matrix or array


def _shape_mismatch(gold: Answer, gold_text: str, pred: Answer, pred_text: str) -> bool:
    """A single value against several entries (a matrix, a tuple, a list): different shapes, whatever
    sympy would make of them. Checked before sympy, which reads ``(4, 4)`` or a matrix loosely."""
    if isinstance(gold, (Seq, Matrix)) or _SEVERAL_ENTRIES_RE.search(gold_text):
        return False
    if isinstance(pred, Matrix):
        return len(pred.rows) * len(pred.rows[0]) > 1
    if isinstance(pred, Seq):
        return len(pred.items) > 1
    return isinstance(pred, Unparsed) and bool(_TABLE_RE.search(normalize(pred_text).text))


def _multi_part(gold: Answer) -> bool:
    """A gold with several separate answers (``3, 5``, ``\\{1, 2\\}``, ``\\pm 2``); a point ``(0, 0)``
    or an interval is one answer."""
    return isinstance(gold, Seq) and gold.kind in ("list", "set", "pm") and len(gold.items) > 1


def _number_text(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _text_key(s: str) -> str:
    return re.sub(r"[\s{}]+", "", s).lower()


__all__ = ["MathVerifier", "parse_gold", "split_alternatives", "Unparsed"]
