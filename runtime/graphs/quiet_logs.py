"""Quieter logs for a call into a tool that makes ONNX Runtime sessions we do not configure (the ORT-format
converter of `pack --target mobile`, the static quantizer's calibration sessions): those sessions warn on stderr
about what gptedge does on purpose (`logits_to_keep`, an input with a default), and the tools log advice or
progress on Python loggers, where a user reads them as faults. Ours say what happened.

ONNX Runtime's default logger severity is process-wide and has no getter: the severity given back is the one set
through here before the call (at first onnxruntime's own default, WARNING), so nested or repeated calls restore
what they found; a severity set by calling onnxruntime directly is not known here and becomes WARNING after a
block. Python loggers get their own levels back. Not for threads: the levels are process-wide, and blocks that
end out of order (thread A enters, B enters, A leaves, B leaves) would leave the quieter levels behind; gptedge's
callers (pack, quantize) run in one thread."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

ORT_WARNING, ORT_ERROR = 2, 3  # onnxruntime's severities: 2 is its default
_ort_severity = [ORT_WARNING]  # the last default severity set through quiet_logs()


@contextlib.contextmanager
def quiet_logs(ort_severity: int = ORT_ERROR, loggers: dict[str | None, int] | None = None) -> Iterator[None]:
    """For the block: ONNX Runtime's default logger at `ort_severity`, and each named Python logger (None: the
    root logger) at its level; all given back after, also when the block raises."""
    import onnxruntime

    saved = {name: logging.getLogger(name).level for name in loggers or {}}
    before = _ort_severity[0]
    try:  # set inside: a level that fails to set still gives back what was set before it
        onnxruntime.set_default_logger_severity(ort_severity)
        _ort_severity[0] = ort_severity
        for name, level in (loggers or {}).items():
            logging.getLogger(name).setLevel(level)
        yield
    finally:
        onnxruntime.set_default_logger_severity(before)
        _ort_severity[0] = before
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)
