"""Run benchmark jobs (whole ``rlvr`` commands) a few at a time, each logging to its own file."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def run_jobs(jobs: list[tuple[str, list[str], Path]], parallel: int) -> None:
    """Run ``(label, command, log file)`` jobs in the order given, ``parallel`` at a time; stop the
    script at the first that fails, naming its log."""
    pending, running = list(jobs), []
    while pending or running:
        while pending and len(running) < parallel:
            label, command, log = pending.pop(0)
            with open(log, "w") as out:  # the child holds its own descriptor
                running.append((label, log, subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)))
            print(f"  started {label}", flush=True)
        time.sleep(1.0)
        for job in [j for j in running if j[2].poll() is not None]:
            running.remove(job)
            label, log, process = job
            if process.returncode != 0:
                sys.exit(f"{label} failed: see {log}")
            print(f"  finished {label}", flush=True)
