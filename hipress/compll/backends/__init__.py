"""Backends, by role: the C-family base both targets render with (``cfamily``), a folder per
target holding its renderer and its runner (``c``: C/OpenMP; ``cuda``: CUDA C on CuPy or the CPU
emulation), and what they share: the Jinja2 environment and generator digest (``render``), the
kernel cache (``cache``), the reference backend (``base``), backend selection (``select``) and the
table that renders any target by name (``targets``)."""
