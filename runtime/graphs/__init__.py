"""ONNX Runtime sessions, the graph variants chosen from the manifest's `graph` (how each is fed: its cache, its
prefill runs), and the pools that hold a continuous batch's caches."""
