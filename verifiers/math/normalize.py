"""String-level clean-up of an answer before it is parsed.

A final answer arrives dressed in many ways that do not change its value: ``$\\dfrac{1}{2}$``,
``\\$1,\\!234``, ``90^\\circ``, ``15\\mbox{ cm}^2``, ``50\\%``, ``\\left( 3, \\frac{\\pi}{2} \\right)``.
:func:`normalize` strips that dressing and returns a plain LaTeX-ish string plus the one fact that
*does* change the value (a percent sign). Everything here is regular-expression work on short
strings; no parsing, no sympy.

Why here and not in the parser: the same clean-up serves the gold answer, the extracted answer,
the structural parser (:mod:`verifiers.math.answer`) and the sympy fallback, so it is done once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Unicode that models emit in place of LaTeX or ASCII.
_UNICODE = {
    "\u2212": "-", "\u2013": "-", "\u2014": "-", "\u00d7": "*", "\u22c5": "*", "\u00b7": "*", "\u00f7": "/",
    "\u03c0": "\\pi ", "\u221a": "\\sqrt", "\u221e": "\\infty ", "\u2264": "<=", "\u2265": ">=", "\u2260": "!=",
    "\u00b2": "^2", "\u00b3": "^3", "\u00b0": "", "\u00bd": "(1/2)", "\u00bc": "(1/4)", "\u00be": "(3/4)",
    "\u222a": "\\cup ", "\u2009": " ", "\u202f": " ", "\u00a0": " ", "\u2032": "'", "\uff1a": ":", "\u2003": " ", "\u2002": " ",
}
_UNICODE_RE = re.compile("|".join(map(re.escape, _UNICODE)))

# Commands whose argument is kept and whose name is dropped (styling, not meaning).
_UNWRAP = ("num", "text", "textnormal", "textbf", "textit", "textrm", "texttt", "textsf", "textup", "mathrm", "mathbf",
           "mathit", "mathsf", "mathtt", "mbox", "hbox", "operatorname", "boldsymbol", "bm", "emph", "mathnormal",
           "displaystyle", "boxed", "fbox", "framebox", "underline", "overline_text")
_UNWRAP_RE = re.compile(r"\\(" + "|".join(_UNWRAP) + r")\s*\{")
# A unit written as text after a value: 15\mbox{ cm}^2, 1.6 \mathrm{~cm}, 5.4 \text{ cents}.
_TEXT_UNIT_RE = re.compile(
    r"(?:(?<=[\d}).])|(?<=\\pi))(\s*)\\(?:text|textnormal|textup|textit|textsf|mbox|mathrm|mathit|mathsf|textrm|operatorname)"
    r"\s*\{\s*~?\s*([A-Za-z][A-Za-z\s.~/]*)\}"
    r"(?:\s*\^\s*\{?\s*-?\d+\s*\}?)?")
# 0.\overline{3} = 1/3, 0.1\overline{6} = 1/6
_REPEATING_RE = re.compile(r"(?<![\d.])(\d*)\.(\d*)\\overline\s*\{(\d{1,12})\}")
# \sin 30^\circ: degrees inside a trig function are an angle to convert, not a unit to drop
_TRIG_DEGREES_RE = re.compile(
    r"\\(sin|cos|tan|cot|sec|csc)\s*(\(?)\s*(\d+(?:\.\d+)?)\s*\^\s*\{?\s*\\circ\s*\}?\s*(\)?)")
_TIMES_TEN_RE = re.compile(r"(\d)\s*[xX]\s*(?=10\s*\^)")  # 6.02 x 10^23
_UNION_U_RE = re.compile(r"(?<=[)\]])\s*U\s*(?=[(\[])")  # (-oo,-1) U (3,oo)
_SCALE_WORDS = {"thousand", "million", "billion", "trillion"}
_SI_RE = re.compile(r"\\(?:SI|qty)\s*\{([^{}]*)\}\s*\{[^{}]*\}")  # siunitx: \SI{5}{\meter}
_CALCULATOR_RE = re.compile(r"<<[^<>\n]{0,200}>>")  # GSM8K calculator annotations: <<48/2=24>>24
_PHANTOM_RE = re.compile(r"\\(?:phantom|hphantom|vphantom|label|tag)\s*\{[^{}]*\}")
_CONNECTORS = {"and", "or", "if", "for", "all", "where", "with", "when", "but", "so", "then", "is", "are"}

_SIZE_RE = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg|bigl|bigr|Bigl|Bigr|biggl|biggr|Biggl|Biggr)(?![a-zA-Z])\s*(\\?[.]?)")
_SPACING_RE = re.compile(r"(?<!\\)\\(?:quad|qquad|displaystyle|textstyle|scriptstyle|nonumber|limits|,|;|:|!|\s)|~")
_DEGREES_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ\b|\\degree\b|\bdegrees?\b|\bdeg\b\.?", re.I)
_PERCENT_RE = re.compile(r"\\%|%|\bpercent\b|\bper\s*cent\b", re.I)
_OPS = [
    (re.compile(r"\\(?:cdot|times|ast)(?![a-zA-Z])"), "*"),
    (re.compile(r"\\div(?![a-zA-Z])"), "/"),
    (re.compile(r"\\(?:leq|leqslant|le)(?![a-zA-Z])"), "<="),
    (re.compile(r"\\(?:geq|geqslant|ge)(?![a-zA-Z])"), ">="),
    (re.compile(r"\\(?:neq|ne)(?![a-zA-Z])"), "!="),
    (re.compile(r"\\lt(?![a-zA-Z])"), "<"),
    (re.compile(r"\\gt(?![a-zA-Z])"), ">"),
    (re.compile(r"\\(?:d|t|c)frac(?![a-zA-Z])"), r"\\frac"),
    (re.compile(r"\\(?:d|t)binom(?![a-zA-Z])"), r"\\binom"),
    (re.compile(r"\\(?:lvert|rvert|vert)(?![a-zA-Z])"), "|"),
    (re.compile(r"\\(?:lbrace)(?![a-zA-Z])"), r"\\{"),
    (re.compile(r"\\(?:rbrace)(?![a-zA-Z])"), r"\\}"),
    (re.compile(r"\\(?:langle)(?![a-zA-Z])"), "("),
    (re.compile(r"\\(?:rangle)(?![a-zA-Z])"), ")"),
]
# Thousands separators written with LaTeX spacing or braces: 1{,}234  10,\!080  1\,234  1\;234.
_THOUSANDS_BRACE_RE = re.compile(r"(\d)\{,\}(?=\d{3})")
_THOUSANDS_SPACE_RE = re.compile(r"(\d)\\[,;:!](?:\s*)(?=\d{3}(?!\d))")
_COMMA_BANG_RE = re.compile(r",\s*\\!\s*")
# A number written in a base: 52_8, 4210_{5} (the digits are the answer; the base is the question's).
_BASE_RE = re.compile(r"(?<![A-Za-z\\_\d])(\d+)_\{?(\d{1,2})\}?(?![\d}])")
_TRAILING_RE = re.compile(r"[\s.,;:]+$")
# Matrix and array dressing: a row break with extra space (\\[3pt]), rules (\hline), \begin {pmatrix}.
_ROW_SPACE_RE = re.compile(r"\\\\\s*\[\s*-?[\d.]*\s*(?:pt|em|ex|mm|cm|in|mu|bp)\s*\]")
_RULES_RE = re.compile(r"\\(?:hline|toprule|midrule|bottomrule|cline\s*\{[^{}]*\}|hdashline)(?![a-zA-Z])")
_ENV_SPACE_RE = re.compile(r"\\(begin|end)\s*\{\s*([a-zA-Z]+\*?)\s*\}")


_SINGLE_COMMAND_RE = re.compile(r"(?<!\\)\\[a-zA-Z]")
_DOUBLE_COMMAND_RE = re.compile(r"\\\\[a-zA-Z]")


def undouble_escapes(text: str) -> str:
    """``\\\\boxed{4}``, ``-2 \\\\le x`` -> ``\\boxed{4}``, ``-2 \\le x``: a text whose every LaTeX command
    is written with two backslashes was escaped twice (a JSON or a Python string written raw); read
    it once. A text with a single-backslash command is left as it is (``\\\\`` is a row break there)."""
    if "\\\\" not in text or _SINGLE_COMMAND_RE.search(text) or not _DOUBLE_COMMAND_RE.search(text):
        return text
    return text.replace("\\\\", "\\")


@dataclass(frozen=True)
class Normalized:
    """A cleaned answer: ``text`` without dressing; ``percent`` when a percent sign was removed."""

    text: str
    percent: bool = False


def matching_brace(s: str, open_index: int) -> int:
    """Index of the ``}`` closing the ``{`` at ``open_index`` (``\\{`` and ``\\}`` do not count); -1 if none."""
    depth = 0
    i = open_index
    n = len(s)
    while i < n:
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def unwrap_commands(s: str, pattern: re.Pattern = _UNWRAP_RE) -> str:
    """Replace every ``\\cmd{arg}`` matched by ``pattern`` (which ends at the ``{``) by `` arg ``."""
    for _ in range(64):  # nested wrappers unwrap one level per pass; 64 bounds hostile input
        m = pattern.search(s)
        if not m:
            return s
        close = matching_brace(s, m.end() - 1)
        if close < 0:
            return s[: m.start()] + " " + s[m.end():]
        s = s[: m.start()] + " " + s[m.end(): close] + " " + s[close + 1:]
    return s


def strip_math_delimiters(s: str) -> str:
    """Drop ``$``, ``\\(``, ``\\)``, ``\\[``, ``\\]`` and escaped dollars anywhere in ``s``."""
    s = s.replace("\\$", " ").replace("$", " ")
    s = re.sub(r"\\[()\[\]]", " ", s)
    return s


def _repeating_decimal(m: re.Match) -> str:
    whole, fixed, repeat = m.group(1) or "0", m.group(2), m.group(3)
    numerator = int(fixed + repeat) - int(fixed or "0")
    denominator = (10 ** len(repeat) - 1) * 10 ** len(fixed)
    return f"({whole}+\\frac{{{numerator}}}{{{denominator}}})"


def _drop_unit(m: re.Match) -> str:
    words = m.group(2).replace("~", " ").replace(".", " ").replace("/", " ").lower().split()
    if not words or any(w in _CONNECTORS or w in _SCALE_WORDS for w in words) or all(len(w) == 1 for w in words):
        return m.group(0)
    return " "


def normalize(answer: str) -> Normalized:
    """Strip the dressing of one answer string. See the module docstring for what is removed."""
    s = _CALCULATOR_RE.sub(" ", undouble_escapes(answer))
    if "\\begin" in s or "\\\\" in s:
        s = _ROW_SPACE_RE.sub(r"\\\\ ", s)  # before the delimiters go: "\\[" is not "\["
        s = _RULES_RE.sub(" ", s)
        s = _ENV_SPACE_RE.sub(r"\\\1{\2}", s)
    s = _UNICODE_RE.sub(lambda m: _UNICODE[m.group(0)], s)
    s = strip_math_delimiters(s)
    s = _THOUSANDS_BRACE_RE.sub(r"\1,", s)
    s = _COMMA_BANG_RE.sub(",", s)
    s = _THOUSANDS_SPACE_RE.sub(r"\1", s)
    s = _REPEATING_RE.sub(_repeating_decimal, s)
    s = _TRIG_DEGREES_RE.sub(lambda m: f"\\{m.group(1)}({m.group(3)}*\\pi/180)", s)
    s = _TIMES_TEN_RE.sub(r"\1 * ", s)
    s = _UNION_U_RE.sub(r" \\cup ", s)
    s = _SI_RE.sub(r" \1 ", s)
    s = _PHANTOM_RE.sub(" ", s)
    s = _SPACING_RE.sub(" ", s)
    s = _DEGREES_RE.sub(" ", s)
    percent = bool(_PERCENT_RE.search(s))
    if percent:
        s = _PERCENT_RE.sub(" ", s)
    s = _TEXT_UNIT_RE.sub(_drop_unit, s)
    s = unwrap_commands(s)
    s = _SIZE_RE.sub(lambda m: m.group(1) if m.group(1) not in (".", "\\.") else "", s)
    s = _SPACING_RE.sub(" ", s)
    for pattern, repl in _OPS:
        s = pattern.sub(repl, s)
    s = _BASE_RE.sub(r"\1", s)
    s = s.replace("**", "^") if "**" in s and "\\" not in s else s  # python power in plain text
    s = re.sub(r"\s+", " ", s).strip()
    s = _TRAILING_RE.sub("", s)
    s = s.lstrip(",;: ")
    return Normalized(s, percent)
