"""Measuring variants: latency, throughput, memory, load time, accuracy and cost."""
