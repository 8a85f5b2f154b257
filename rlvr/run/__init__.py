"""Run infrastructure: what every recipe needs around its loop and nothing of the math.

    runtime.py      devices, threads, seeds and RNG state, the optimizer and its schedule, the ranks
    ranks.py        what a data-parallel run does differently (rank 0 writes; metrics reduced)
    sharding.py     FSDP2 sharding of a model across the ranks (gradients summed)
    folder.py       one run folder per run, never shared by accident
    checkpoint.py   atomic checkpoints a run resumes from
    tracking.py     metrics.jsonl, plots, tensorboard/wandb
    alarms.py       watches on the metrics: no signal, truncation, over-optimisation, verifier errors
    progress.py     progress bars and plain progress lines
"""
