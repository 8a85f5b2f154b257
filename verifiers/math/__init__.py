"""The ``math`` verifier and its parts (see :mod:`verifiers.math.verifier` for the pipeline).

    from rlvr.verifiers import get_verifier
    get_verifier("math").score("... so the answer is \\boxed{\\dfrac{1}{2}}", {"answer": "0.5"}).score  # 1.0
"""

from rlvr.verifiers.math.verifier import MathVerifier, parse_gold, split_alternatives

__all__ = ["MathVerifier", "parse_gold", "split_alternatives"]
