"""Regenerate the Python protobuf classes in python/txnstream/proto from proto/.

Usage: python scripts/gen_proto.py [OUT_DIR]   (default: the package folder)

Uses grpcio-tools' bundled protoc, so no system protoc is needed. The Rust
types are generated from the same files by rust/core/build.rs.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
DEFAULT_OUT = ROOT / "python" / "txnstream" / "proto"


def proto_files() -> list[Path]:
    return sorted(PROTO_DIR.glob("*.proto"))


def generate(out: Path) -> list[Path]:
    from grpc_tools import protoc  # type: ignore[import-untyped]

    out.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        *[str(p) for p in proto_files()],
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed: {' '.join(args)}")
    return sorted(out.glob("*_pb2.py*"))


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    for path in generate(target):
        print(path.relative_to(target))
