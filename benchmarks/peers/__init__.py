"""Ours beside the toolkits users would pick instead (fairseq, eole): ``make bench-peers``.

    python benchmarks/peers [flags]          # the comparison (run.py)
    python benchmarks/peers ours WHAT ...    # our side alone, as the comparison starts it (ours.py)

data.py: the recipe's data for every toolkit; env.py: the shared shape, recipe and each peer's
environment; fairseq.py, eole.py: each peer's commands and what its logs say; report.py: the
tables. benchmarks/gpu_peers.py runs the same peers on a GPU.
"""
