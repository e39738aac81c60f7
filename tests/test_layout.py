"""The package layout: dependencies point one way, and low-level modules stay light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "python" / "txnstream"

#: Layers, lowest first: a module may import only its own layer or lower ones.
LAYERS = [
    {"errors", "_native", "proto", "timer", "durable_file", "future"},
    {"frame", "ackset", "config", "metrics", "replay"},
    {"coordinator.metadata"},
    {"coordinator.config"},
    {"coordinator.state"},
    {"coordinator.terminated"},
    {"coordinator.ending"},
    {"coordinator.aio"},
    {"coordinator.coordinator"},
    {"coordinator"},
    {"tiered.remote"},
    {"tiered.metadata", "tiered.txn_index"},
    {"tiered.offload", "tiered.reader"},
    {"tiered"},
    {"buffer.transaction_buffer", "buffer.snapshot_reader", "buffer.snapshot_writer"},
    {"buffer"},
    {"pendingack.cursor_acks"},
    {"pendingack.store"},
    {"pendingack"},
    {"broker.topic_name", "broker.dedup", "broker.recovery"},
    {"broker.subscription"},
    {"broker.topic", "admin", "datadir"},
    {"broker.broker"},
    {"broker"},
    {"client.message"},
    {"client.transaction"},
    {"client.aio"},
    {"client.client"},
    {"client"},
    # The Spark pipeline reads storage files; nothing below imports it.
    {"spark.columns", "spark.transactions"},
    {"spark.udfs", "spark.log_source", "spark.topic_source"},
    {"spark.session", "spark.report"},
    {"spark.audit", "spark"},
    {"workload", "demo", "bench", "testing"},
    {"cli"},
]

#: Imports against the layers, each a factory imported when called (never at
#: import time): ``Broker.client()`` makes a Client, which depends on the broker.
UPWARD_FACTORIES = {("broker.broker", "client")}


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(parts)


def layer_of(name: str) -> int:
    for i, layer in enumerate(LAYERS):
        if name in layer or (name.split(".")[0] in layer and "." not in name):
            return i
    if name.startswith("proto"):
        return 0
    raise AssertionError(f"module {name} has no layer in tests/test_layout.py")


def imports(path: Path) -> set[str]:
    """txnstream modules ``path`` imports at run time (not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("txnstream"):
            base = node.module.removeprefix("txnstream").lstrip(".")
            if base:
                found.add(base)
            else:
                found.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("txnstream."):
                    found.add(a.name.removeprefix("txnstream."))
        for sub in ast.iter_child_nodes(node):
            visit(sub)

    visit(tree)
    return {m for m in found if not m.startswith("proto.")} | (
        {"proto"} if any(m.startswith("proto") for m in found) else set()
    )


MODULES = [
    *sorted(
        p
        for p in PKG.rglob("*.py")
        if "proto" not in p.relative_to(PKG).parts and p.name != "__init__.py"
    ),
    *(
        PKG / pkg / "__init__.py"
        for pkg in ("coordinator", "tiered", "buffer", "pendingack", "broker", "client")
    ),
]


@pytest.mark.parametrize("path", MODULES, ids=[module_name(p) for p in MODULES])
def test_dependencies_point_one_way(path: Path) -> None:
    me = module_name(path)
    for dep in imports(path):
        if (me, dep) in UPWARD_FACTORIES:
            continue
        assert layer_of(dep) <= layer_of(me), f"{me} imports {dep}, a higher layer"


def test_low_level_modules_do_not_pull_in_the_coordinator() -> None:
    code = (
        "import sys, txnstream.ackset, txnstream.frame, txnstream.replay, txnstream.timer;"
        "print(sorted(m for m in sys.modules if m.startswith('txnstream.coordinator')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    code = "import txnstream as ts; print(ts.TransactionCoordinator.__name__, ts.TxnAction.COMMIT)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["TransactionCoordinator", "TxnAction.COMMIT"]
