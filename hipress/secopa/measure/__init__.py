"""SeCoPa's online profiling: what the pure cost model (:mod:`hipress.secopa.model`) is fed,
measured on this cluster, and the plan shared by every rank.

The codecs the profiler times (:mod:`~hipress.secopa.measure.timed_codec`), the compute
profiler, the network profiler and its transport (:mod:`~hipress.secopa.measure.comm`), local
process groups for the CLI, the calibration against real sync steps, the gradients' ready
times in backward (:mod:`~hipress.secopa.measure.readiness`), and planning inside a training
job (:mod:`~hipress.secopa.measure.runtime`: plan on rank 0, broadcast).
"""
