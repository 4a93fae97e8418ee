"""What load's integrity checks cost (docs/model-directory.md#model-directory-integrity): for each model dir, the
SHA-256 of its recorded files alone (GB/s on one core), ONNX Runtime's session build alone, and gptedge's load, which
hashes in a thread while the session builds, then checks the manifest's claims. Each figure is the median of --repeat
runs, files in the page cache (a first run warms it).

    python benchmarks/load_integrity.py DIR... [--repeat 3] [--threads 2]

GPT-2 XL fp32 (6.2 GB; `benchmarks/family.py` builds it) is the case the README estimates from the hash rate.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

from gptedge.runtime import SessionConfig, load
from gptedge.runtime.graphs.session import make_session
from gptedge.runtime.modeldir.manifest import read_manifest
from gptedge.runtime.modeldir.model_files import forget_digests, hash_problems


def median_s(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def isa() -> str:
    flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    return ", ".join(f for f in ("avx2", "avx512f", "avx512_vnni", "amx_int8", "sha_ni") if f in flags) or "unknown"


def main() -> None:
    import hashlib
    import ssl

    import onnxruntime

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    print(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()} ({isa()}), python "
          f"{platform.python_version()}, onnxruntime {onnxruntime.__version__}, {ssl.OPENSSL_VERSION}, "
          f"{args.threads} threads, median of {args.repeat}")
    print("| model | recorded GB | SHA-256 alone s | GB/s | session build alone s | gptedge load s | load - "
          "session s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    config = SessionConfig(threads=args.threads)
    for path in map(Path, args.models):
        m = read_manifest(path)
        size = sum(r.size for r in m.files) / 1e9

        def digest_all(m=m, path=path) -> None:  # no memo: hashlib directly, as a first load in a fresh process
            for r in m.files:
                h = hashlib.sha256()
                with open(path / r.path, "rb") as f:
                    for block in iter(lambda f=f: f.read(1 << 20), b""):
                        h.update(block)

        assert not hash_problems(path, m.files), f"{path}: its files are not as recorded"
        digest_all()  # warm the page cache
        hashing = median_s(digest_all, args.repeat)
        session = median_s(lambda m=m, path=path: make_session(str(path / m.model_file), "cpu", config), args.repeat)
        loading = median_s(lambda path=path: (forget_digests(), load(path, device="cpu", session=config)),
                           args.repeat)
        print(f"| {path} | {size:.2f} | {hashing:.2f} | {size / hashing:.2f} | {session:.2f} | {loading:.2f} | "
              f"{loading - session:+.2f} |")


if __name__ == "__main__":
    main()
