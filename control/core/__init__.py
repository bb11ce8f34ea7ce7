"""The pure scheduling core: decisions from state and time as plain data; no I/O, no clock."""
