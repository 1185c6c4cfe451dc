"""What an ONNX file holds, read as data before onnxruntime runs it.

onnxruntime runs whatever a graph computes, and a graph with a ``Loop`` node runs as long as its trip count and
condition say: a few hundred bytes can keep a process busy for ever (a condition that stays true, a trip count of
2**63). visiontf's exports never hold a loop (their graphs are traced: ``tools/export.py``), so a graph that does is
not one of them and is refused before anything runs, naming the node. ``Scan`` (a loop over a tensor's rows) is
refused alike. The nodes are looked for in the main graph, in every subgraph (an ``If``'s branches, a loop's body)
and in the model's local functions, without recursion (a deeply nested file cannot exhaust the stack).
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["LOOP_OPS", "loop_nodes"]

#: operators that repeat a subgraph: none of visiontf's exports holds one
LOOP_OPS = ("Loop", "Scan")


def loop_nodes(path: str | Path) -> list[str]:
    """``"<op> '<node name>'"`` of every loop node in the ONNX file ``path`` (its weights stored elsewhere are not
    read); empty for visiontf's exports. Raises onnx's own errors for a file that is not an ONNX model."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    graphs = [model.graph, *model.functions]  # a local function holds nodes as a graph does
    found = []
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            if node.op_type in LOOP_OPS:
                found.append(f"{node.op_type} {node.name!r}")
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    graphs.append(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    graphs.extend(attr.graphs)
    return found

