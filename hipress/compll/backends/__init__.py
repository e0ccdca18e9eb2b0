"""Backends: the kernel cache, the C/OpenMP and CUDA targets, backend selection."""
