"""Benchmarks of whole training jobs: end-to-end throughput on a shaped network
(:mod:`hipress.bench.e2e`), convergence under compression (:mod:`hipress.bench.convergence`), and
the workloads they share (:mod:`hipress.bench.models`). See docs/benchmarks.md."""
