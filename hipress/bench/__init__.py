"""Every benchmark, each runnable as ``hipress bench NAME`` from an installed package: whole
training jobs (:mod:`~hipress.bench.e2e` on a shaped network, :mod:`~hipress.bench.convergence`,
the workloads they share in :mod:`~hipress.bench.workloads`), the kernels
(:mod:`~hipress.bench.kernels` against :mod:`~hipress.bench.torch_ops`), one gradient sync
(:mod:`~hipress.bench.sync`), SeCoPa's predictions against measurements
(:mod:`~hipress.bench.prediction`) and its studies (:mod:`~hipress.bench.costfit`,
:mod:`~hipress.bench.ring`); the simulated cluster network they run on
(:mod:`~hipress.bench.netsim`); what every result records (:mod:`~hipress.bench.provenance`) and
the tables made from results (:mod:`~hipress.bench.tables`, :mod:`~hipress.bench.report`).
Results go to ``hipress-results/``; one reference per benchmark is kept in ``docs/results/``.
See docs/reference/benchmarks.md."""
