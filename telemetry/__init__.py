"""Sources of measurements: NVML GPUs and vLLM instance metrics."""
