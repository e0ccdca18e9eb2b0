"""Lowering: the checked IR -> a kernel plan, and the passes over it."""
