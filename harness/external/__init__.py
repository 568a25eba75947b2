"""External-ranks mode: the case library on whatever ranks a cluster launcher gives.

    torchrun --nnodes 2 --nproc-per-node 8 --max-restarts 20 ... -m harness.external cases/
    srun --ntasks 16 python -m harness.external cases/ --backend nccl   (no restarts)

A front end over the runner (:mod:`harness.runner`): every rank loads the same case files,
prepares every instance the way the pytest items do (overrides, ordering probes,
``--check-iters``, perf plans, capability skips gathered from every rank), runs its share with
the same per-rank code as the harness's own pools, and rank 0 judges the gathered results with
the runner's verdict and writes the one report. ``cli`` (options, entry point), ``session``
(the run's steps), ``files`` (case files, the report pair), ``schedule`` (packing instances
onto disjoint rank blocks), ``progress`` and ``resultfile`` (what is kept to resume after a hang
or crash), ``launch`` (the launcher's environment, joining, the deadline watchdog).

Gives the JSON and Markdown reports. Must not: start rank processes of its own (the launcher
does), judge in any other way than the runner's verdict, or read a pickle from the state
directory (other nodes write it).
"""
