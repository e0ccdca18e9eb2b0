"""The CompLL IR: types, nodes, walks, semantics, the reference interpreter, payloads, state and errors."""
