"""Modelling: loading and saving models, rlvr's own forward, log-probabilities, the critic, the reward
model, and the tiny model the quickstart and the tests build.

    loading.py        the policy (full or LoRA), the reference, final models, weights for an engine
    fast_forward.py   rlvr's shared-prompt forward for Llama-family models
    forward_choice.py which forward a model runs, proven at load by a parity probe
    logprobs.py       per-token log-probabilities of completions (with and without a graph)
    chunked_logprobs.py  log-probs from final hidden states a chunk of tokens at a time (no whole logits)
    value_model.py    PPO's critic: a value head on a transformer body
    reward_model.py   a Bradley-Terry reward model's heads, loading, saving and scoring
    tiny.py           the tiny character-level Llama built locally
"""
