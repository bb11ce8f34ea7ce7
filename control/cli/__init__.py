"""The `steersman` command line: parse, call, print."""
