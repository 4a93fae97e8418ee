"""The model directory as data: its manifest, file records, graph facts read from the wire, tokenizer, recipe,
task and KV-cache tables, and the files written beside the graph for other runtimes. No ONNX Runtime session."""
