"""Decisions and the loops that carry them out; this layer wires every other one."""
