"""gptedge.quantize: ONNX -> ONNX INT8 variants of a gptedge model directory."""
