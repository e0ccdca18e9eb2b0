"""The C-family base both targets render with: types and literals, the operation table,
expressions and their loop-index analyses, reductions, and one function's state
(:class:`~hipress.compll.backends.cfamily.family.CFamily`), which the C and CUDA renderers
subclass."""
