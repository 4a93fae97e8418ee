"""gptedge: GPT-2 / GPT from PyTorch to ONNX Runtime, with parity checks at every step.

Sub-packages: ``gptedge.export`` (PyTorch side), ``gptedge.quantize`` (ONNX -> ONNX),
``gptedge.runtime`` (ONNX Runtime side; never imports torch).
"""

__version__ = "0.1.0"
