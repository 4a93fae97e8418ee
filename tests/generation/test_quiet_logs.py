"""runtime/graphs/quiet_logs.py: ONNX Runtime's process-wide default logger and named Python loggers lowered for a
block (the mobile converter's and the static quantizer's sessions), and given back after it, also when it raises."""

import logging

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from gptedge.runtime.graphs import quiet_logs as quiet
from gptedge.runtime.graphs.quiet_logs import ORT_ERROR, ORT_WARNING, quiet_logs

LOGGER = "gptedge.tests.quiet_logs"


@pytest.fixture(autouse=True)
def ort_default_severity():
    """Each test starts and ends at ONNX Runtime's default severity, whatever ran before it in this process."""
    onnxruntime.set_default_logger_severity(ORT_WARNING)
    quiet._ort_severity[0] = ORT_WARNING
    yield
    onnxruntime.set_default_logger_severity(ORT_WARNING)
    quiet._ort_severity[0] = ORT_WARNING


def input_with_default() -> bytes:
    """A graph whose input k also has an initializer (as gptedge's logits_to_keep): a default session warns."""
    k = numpy_helper.from_array(np.ones(1, np.float32), "k")
    graph = helper.make_graph([helper.make_node("Add", ["x", "k"], ["y"])], "g",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in ("x", "k")],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], [k])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def warned(capfd) -> bool:
    onnxruntime.InferenceSession(input_with_default(), providers=["CPUExecutionProvider"])
    return "appears in graph inputs" in capfd.readouterr().err  # ONNX Runtime writes to fd 2, not sys.stderr


def test_onnx_runtime_warns_outside_the_block_and_not_inside(capfd):
    assert warned(capfd)
    with quiet_logs(ORT_ERROR):
        assert not warned(capfd)
    assert warned(capfd) and quiet._ort_severity[0] == ORT_WARNING


def test_levels_come_back_when_the_block_raises_and_when_nested(capfd, monkeypatch):
    monkeypatch.setattr(logging.getLogger(LOGGER), "level", logging.INFO)
    with pytest.raises(RuntimeError), quiet_logs(ORT_ERROR, {LOGGER: logging.ERROR}):
        assert logging.getLogger(LOGGER).level == logging.ERROR
        with quiet_logs(ORT_WARNING):  # an inner block gives back what it found: the outer ERROR
            assert warned(capfd)
        assert not warned(capfd)
        raise RuntimeError("the converter failed")
    assert logging.getLogger(LOGGER).level == logging.INFO
    assert quiet._ort_severity[0] == ORT_WARNING and warned(capfd)


def test_root_logger_is_named_by_none():
    root = logging.getLogger()
    before = root.level
    with quiet_logs(ORT_ERROR, {None: logging.CRITICAL}):
        assert root.level == logging.CRITICAL
    assert root.level == before



def test_a_level_that_fails_to_set_gives_back_what_was_set(capfd):
    with pytest.raises((TypeError, ValueError)), quiet_logs(ORT_ERROR, {LOGGER: "NOT A LEVEL"}):
        pass
    assert quiet._ort_severity[0] == ORT_WARNING and warned(capfd)
