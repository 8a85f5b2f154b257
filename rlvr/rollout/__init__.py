"""Rollout: from task suites to the tensors an update reads, and the evaluation that measures a policy.

    suites.py          task suites as the trainer loads them; each problem's prompt encoded once
    chat.py            chat messages -> the text and token ids a model reads
    sampler.py         which problems a step trains on (and which examples an offline step takes)
    groups.py          problems -> G completions each -> rewards
    reward_scoring.py  a learned reward model as the training reward
    guidance.py        gold solutions into groups that got nothing right
    batch.py           groups -> reward tensors and the padded training batch
    evaluate.py        accuracy and pass@k on held-out problems
    preferences.py     preference pairs: read, tokenised, or made from a model's samples
"""
