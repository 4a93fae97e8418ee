"""gptedge.export: the PyTorch side. Reference GPT, checkpoint loading, ONNX graph building, validation."""
