"""The C-family renderer (types, operation table, expressions, reductions, one function's state;
shared with the CUDA target) and the C (OpenMP) target: its functions, stages, native backend."""
