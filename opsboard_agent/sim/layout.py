"""The simulated cluster's layout: nodes, runs, and the rank on every GPU.

Nodes are shared out among runs in contiguous blocks (the first runs get one more node when
the division is uneven); every GPU of a node holds one rank of the node's run. Ranks are
numbered node by node (`rank = node_index_in_run * gpus + gpu`), the usual torchrun order.
With tensor parallelism `tp`, GPU `g` holds shard `tp{g % tp}-pp0`; the ranks that share a
shard are the data-parallel replicas that must agree bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankSlot:
    """One rank of a run, pinned to a node and a local GPU."""

    run: str
    rank: int
    node: str
    gpu: int
    shard: str


@dataclass(frozen=True)
class RunLayout:
    name: str
    nodes: tuple[str, ...]
    ranks: tuple[RankSlot, ...]

    @property
    def world_size(self) -> int:
        return len(self.ranks)


@dataclass(frozen=True)
class Layout:
    nodes: tuple[str, ...]
    gpus: int
    runs: tuple[RunLayout, ...]

    def run(self, name: str) -> RunLayout:
        for run in self.runs:
            if run.name == name:
                return run
        raise KeyError(name)

    def run_of_node(self, node: str) -> RunLayout:
        for run in self.runs:
            if node in run.nodes:
                return run
        raise KeyError(node)

    def slot_on(self, node: str, gpu: int) -> RankSlot:
        """The rank that runs on `gpu` of `node`."""
        for slot in self.run_of_node(node).ranks:
            if slot.node == node and slot.gpu == gpu:
                return slot
        raise KeyError((node, gpu))

    def to_dict(self) -> dict[str, object]:
        """The layout as plain JSON: nodes, and for each run its nodes and rank placement."""
        return {
            "gpus_per_node": self.gpus,
            "nodes": list(self.nodes),
            "runs": [
                {
                    "run": run.name,
                    "nodes": list(run.nodes),
                    "world_size": run.world_size,
                    "ranks": [
                        {"rank": s.rank, "node": s.node, "gpu": s.gpu, "shard": s.shard}
                        for s in run.ranks
                    ],
                }
                for run in self.runs
            ],
        }


def layout_build(
    *, nodes: int, gpus: int, runs: int = 1, tp: int = 1, prefix: str = "sim"
) -> Layout:
    """`nodes` × `gpus` shared by `runs` runs. Names: `<prefix>-node-00`, `<prefix>-run-0`."""
    if nodes < 1 or gpus < 1 or runs < 1:
        raise ValueError("nodes, gpus and runs must be at least 1")
    if runs > nodes:
        raise ValueError(f"{runs} runs need at least {runs} nodes (a node serves one run)")
    if tp < 1 or gpus % tp:
        raise ValueError(f"tp={tp} must divide the {gpus} GPUs of a node")
    width = max(2, len(str(nodes - 1)))
    names = tuple(f"{prefix}-node-{i:0{width}d}" for i in range(nodes))
    per_run, extra = divmod(nodes, runs)
    run_layouts = []
    first = 0
    for index in range(runs):
        count = per_run + (1 if index < extra else 0)
        run_nodes = names[first : first + count]
        first += count
        name = f"{prefix}-run-{index}"
        slots = tuple(
            RankSlot(name, n * gpus + g, node, g, f"tp{g % tp}-pp0")
            for n, node in enumerate(run_nodes)
            for g in range(gpus)
        )
        run_layouts.append(RunLayout(name, run_nodes, slots))
    return Layout(names, gpus, tuple(run_layouts))
