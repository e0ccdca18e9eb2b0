"""The CUDA target: rendering, the runtime (CuPy or the CPU emulation), NVRTC."""
