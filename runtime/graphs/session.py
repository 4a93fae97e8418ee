"""ONNX Runtime: import with a one-line hint, pick providers for a device, make sessions."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import DeviceError, InvalidArgumentError, MissingRuntimeError, ModelDirError, install_hint
from .file_pages import release_model_file_pages
from .huge_pages import weights_on_huge_pages

log = logging.getLogger(__name__)

DEVICES = ("cpu", "cuda", "auto")
CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
# More threads than logical CPUs only slows ONNX Runtime down (1,000 took 10-70 s to load): refused.
MAX_THREADS = os.cpu_count() or 1
HUGE_PAGES_ENV = "GPTEDGE_HUGE_PAGES"
MAX_SPIN_US = 100_000  # a tenth of a second: past it, spinning is just burning the cores
OPTIMIZATION_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
                       "all": "ORT_ENABLE_ALL"}


def import_onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError:
        raise MissingRuntimeError(f"ONNX Runtime is not installed: {install_hint('cpu')}") from None
    return onnxruntime


@functools.cache
def gqa_takes_query_seqlens() -> bool:
    """Whether the installed ONNX Runtime's GroupQueryAttention has the query_seqlens input (1.32 and later), which
    export's rotary-inside form reads (docs/design.md#the-onnx-io-contract)."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

        schemas = ort_state.get_all_operator_schema()
    except (ImportError, AttributeError):  # no onnxruntime, or a build without its schemas
        return False
    return any(s.name == "GroupQueryAttention" and any(i.name == "query_seqlens" for i in s.inputs) for s in schemas)


def available_providers() -> list[str]:
    return list(import_onnxruntime().get_available_providers())


def providers_for(device: str, available: list[str] | None = None) -> list[str]:
    """Execution providers for a device name; fails in one line when the device cannot be had."""
    available = available_providers() if available is None else available
    if device not in DEVICES:
        raise DeviceError(f"unknown device {device!r}: choose cpu, cuda or auto")
    if device == "cuda" or (device == "auto" and CUDA_PROVIDER in available):
        if CUDA_PROVIDER not in available:
            raise DeviceError(
                f"device 'cuda' needs the CUDA execution provider, which this onnxruntime lacks "
                f"(has {', '.join(available)}); install 'gptedge[gpu]' in place of 'gptedge[cpu]'"
            )
        return [CUDA_PROVIDER, CPU_PROVIDER]
    return [CPU_PROVIDER]


@dataclass(frozen=True)
class SessionConfig:
    """How the one InferenceSession of a loaded model is made; None leaves ONNX Runtime's default."""

    threads: int | None = None  # intra-op threads (ORT's default: one per physical core)
    inter_op_threads: int | None = None  # only used when execution_mode is parallel
    optimization_level: str = "all"  # disable | basic | extended | all
    provider_options: Mapping[str, Any] = field(default_factory=dict)  # for the first provider (CUDA's, say)
    profile_prefix: str | None = None  # turn ONNX Runtime's per-op profiler on, writing PREFIX_*.json
    # Intra-op threads spin-wait for work between and after runs (ORT's default: on). Off, they yield the cores
    # at once: what a server wants, whose event loop and clients need the cores between two decode steps.
    spin: bool | None = None
    # With spin on: at most this many microseconds an idle intra-op thread spin-waits before it sleeps (ONNX
    # Runtime's session.intra_op.spin_duration_us; None: its own default). A short spin keeps the threads hot
    # between the parallel sections of one run and yields the cores soon after the run.
    spin_us: int | None = None
    # With spin on: False stops the spinning the moment a run returns (ONNX Runtime's session.force_spinning_stop):
    # the threads spin only in the gaps between the parallel sections of a run, and sleep between runs, when the
    # server's event loop and its clients need the cores. True (ORT's default) spins on after a run as well.
    spin_between_runs: bool = True
    # On CUDA, replay decode steps as captured CUDA graphs where the dir's graph allows it (a kv_buffer graph
    # with a wide mask: runtime/graphs/cuda_graph.py). A second session holds the weights again on the GPU.
    cuda_graph: bool = True
    # On the CPU, the session's weights are moved onto 2 MiB pages once it is made (Linux, THP in madvise mode), and
    # a generation's KV cache is allocated where numpy advises them: a batch-1 decode step streams every weight, and
    # on 4 KiB pages the TLB and the prefetchers cost it 0-25 %, as the host's state goes
    # (runtime/graphs/huge_pages.py). Off: both on small pages, a load ~0.2 s faster per 150 MB of weights.
    # GPTEDGE_HUGE_PAGES=0 in the environment turns it off for every command.
    huge_pages: bool = field(default_factory=lambda: os.environ.get(HUGE_PAGES_ENV, "1") != "0")
    # Once a CPU session is made, the pages of the model's data file that ONNX Runtime keeps mapped (initializers
    # read in place, such as a tied embedding's table) leave the process until read again (Linux; only mappings
    # no page of which was written: runtime/graphs/file_pages.py). GPT-2 small 8-bit: ~52 MiB less RSS.
    release_file_pages: bool = True
    # Once a model is loaded, the C heap's free pages (what parsing the graph, hashing the dir's files and reading the
    # tokenizer freed) go back to the kernel (glibc's malloc_trim: runtime/graphs/heap_trim.py). GPT-2 small 8-bit:
    # ~28 MiB less RSS after a load.
    trim_heap: bool = True

    def __post_init__(self) -> None:
        for name in ("threads", "inter_op_threads"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and 1 <= value <= MAX_THREADS):
                raise InvalidArgumentError(f"{name} must be an integer in 1..{MAX_THREADS}, got {value!r}")
        if self.spin_us is not None and not (isinstance(self.spin_us, int) and not isinstance(self.spin_us, bool)
                                             and 1 <= self.spin_us <= MAX_SPIN_US):
            raise InvalidArgumentError(f"spin_us must be an integer in 1..{MAX_SPIN_US}, got {self.spin_us!r}")
        if self.optimization_level not in OPTIMIZATION_LEVELS:
            raise InvalidArgumentError(f"optimization_level must be one of {', '.join(OPTIMIZATION_LEVELS)}, "
                                       f"got {self.optimization_level!r}")


_cuda_preloaded = False

# ONNX Runtime graph rewrites every session skips. GroupQueryAttentionFusion (CUDA) folds the q/k/v projections and
# the two RotaryEmbedding nodes in front of a GroupQueryAttention into one packed MatMul(NBits) with rotary inside
# the attention, the layout GenAI's builder writes. Where our graphs rotate outside the attention (the fp16 graphs,
# older ONNX Runtimes; partial rotary, q/k/v biases between the projection and the rotation) they also feed an
# attention_bias input the rewrite drops: on a weight-only Llama dir ONNX Runtime 1.31 then refuses the rewritten
# node (input count), and where it does not the fused graph would skip the biases. Where export put the rotary
# inside the op already there is nothing to fold. See docs/design.md#the-onnx-io-contract.
DISABLED_OPTIMIZERS = ("GroupQueryAttentionFusion",)


def _preload_cuda(ort: Any) -> None:
    """CUDA and cuDNN from pip's nvidia-* packages (onnxruntime-gpu >= 1.21 finds them there), once per process."""
    global _cuda_preloaded
    if not _cuda_preloaded and hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    _cuda_preloaded = True


def make_session(model_path: str | bytes, device: str = "auto", config: SessionConfig | None = None,
                 capture: bool = False, external_data_dir: str | None = None) -> Any:
    """An InferenceSession on `device`, made as `config` says, from a file or a serialized model (whose external
    data, if any, lies in external_data_dir); capture: CUDA graphs on (ONNX Runtime's enable_cuda_graph), for the
    decode session of runtime/graphs/cuda_graph.py."""
    config = config or SessionConfig()  # made per call: GPTEDGE_HUGE_PAGES is read when the session is made
    ort = import_onnxruntime()
    providers = providers_for(device)
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel,
                                               OPTIMIZATION_LEVELS[config.optimization_level])
    options.log_severity_level = 3  # our own logging says what matters; ORT's warnings are noise to users
    if config.threads:
        options.intra_op_num_threads = config.threads
    if config.inter_op_threads:
        options.inter_op_num_threads = config.inter_op_threads
    if config.spin is not None:
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if config.spin else "0")
    if config.spin_us is not None:
        options.add_session_config_entry("session.intra_op.spin_duration_us", str(config.spin_us))
    if not config.spin_between_runs:
        options.add_session_config_entry("session.force_spinning_stop", "1")
    if external_data_dir is not None:
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", external_data_dir)
    if config.profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = config.profile_prefix
    if CUDA_PROVIDER in providers:
        _preload_cuda(ort)
    provider_options = [dict(config.provider_options)] + [{} for _ in providers[1:]]
    if capture:
        if CUDA_PROVIDER not in providers:
            raise DeviceError("CUDA graphs need the CUDA execution provider")
        provider_options[0]["enable_cuda_graph"] = "1"
    try:
        with weights_on_huge_pages(config.huge_pages and providers == [CPU_PROVIDER]):
            session = ort.InferenceSession(model_path, sess_options=options, providers=providers,
                                           provider_options=provider_options,
                                           disabled_optimizers=list(DISABLED_OPTIMIZERS))
    except Exception as e:  # onnxruntime's own exception types, one per status code
        if "GroupQueryAttention" in str(e) and not gqa_takes_query_seqlens():
            raise ModelDirError(f"the graph's GroupQueryAttention reads query_seqlens (its rotary inside the op, "
                                f"written by an export on onnxruntime >= 1.32); onnxruntime {ort.__version__} has "
                                f"no such input: install onnxruntime >= 1.32, or export the dir again with this "
                                f"one") from None
        raise
    if config.release_file_pages and providers == [CPU_PROVIDER]:
        release_model_file_pages(os.path.dirname(os.path.abspath(model_path))
                                 if isinstance(model_path, (str, os.PathLike)) else external_data_dir)
    log.info("session on %s (providers used: %s)", device, ", ".join(session.get_providers()))
    return session


def gpu_description() -> list[dict[str, str]]:
    """The NVIDIA GPUs nvidia-smi lists (name, driver, memory); [] where there is none or no nvidia-smi."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    fields = ("name", "driver_version", "memory.total", "compute_cap")
    try:
        out = subprocess.run([smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        log.info("nvidia-smi failed: %s", e)
        return []
    return [dict(zip(fields, (v.strip() for v in line.split(",")), strict=False)) for line in out.splitlines()
            if line.strip()]


def provider_report(session: Any) -> dict[str, Any]:
    """What `gptedge info` shows of a session: providers used, their options, the GPU when CUDA is one."""
    ort = import_onnxruntime()
    used = session.get_providers()
    report: dict[str, Any] = {"onnxruntime": ort.__version__, "providers_used": used,
                              "provider_options": {p: session.get_provider_options().get(p, {}) for p in used}}
    if CUDA_PROVIDER in used:
        report["gpus"] = gpu_description()
    return report
