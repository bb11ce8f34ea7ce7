"""Serving backends behind one interface: real vLLM over HTTP, and a simulated vLLM instance."""
