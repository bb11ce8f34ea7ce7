"""A simulated vLLM instance: the engine model, its profiles, virtual-time and real-time drivers."""
