"""The C (OpenMP) target: its renderer (functions, stages) and its runner (the native backend)."""
