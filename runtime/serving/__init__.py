"""Continuous batching without HTTP: the language model's engine and its admission policy, the classifier's
batching worker, and their counters. gptedge.serve (HTTP) and the Ray replicas drive them."""
