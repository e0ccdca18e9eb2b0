"""SeCoPa's pure cost model: profiles, cost functions, the strategy formulas, the cost model,
the selection of the sizes to compress and the planner.

Pure functions of a :class:`~hipress.secopa.model.profile.Profile` and a model's parameter
sizes: nothing here measures, and nothing imports ``torch.distributed`` or
:mod:`hipress.secopa.measure` (a test holds both).
"""
