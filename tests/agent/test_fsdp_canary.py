"""The FSDP canary, one module unsharded at a time: tests/agent/fsdp_canary.py under
torchrun, 4 CPU ranks (gloo), 16 layers of Linear(1024, 1024) each sharded over all 4 ranks
(no replicas: every rank holds a different shard, so no checksum has a peer), rank 2's
backward wrong; FSDP2 (`fully_shard`) and FSDP1 (a FullyShardedDataParallel unit a layer)."""

from __future__ import annotations

import json
import math
import sys

import pytest

from detectors.config import DEFAULT_CONFIG
from detectors.sdc import minority_canary
from detectors.types import StepRow
from tests.agent.conftest import REPO
from tests.agent.torchrun import run_ok

RANKS, FAULTY, LAYERS, WIDTH = 4, 2, 16, 1024


@pytest.fixture(scope="module", params=["fsdp2", "fsdp1"])
def ranks(request, tmp_path_factory) -> dict[int, dict]:
    out = tmp_path_factory.mktemp(request.param)
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone"),
        *("--nproc-per-node", str(RANKS), str(REPO / "tests" / "agent" / "fsdp_canary.py")),
        *(str(out), "--faulty", str(FAULTY), "--layers", str(LAYERS), "--width", str(WIDTH)),
        *(["--fsdp1"] if request.param == "fsdp1" else []),
    ]
    run_ok(command)
    return {rank: json.loads((out / f"rank{rank}.json").read_text()) for rank in range(RANKS)}


def values(canary: dict) -> list[float]:
    return [canary["norm"], *canary["proj"]]


def close(a: dict, b: dict, rel: float = 1e-9) -> bool:
    pairs = zip(values(a), values(b), strict=True)
    return all(math.isclose(x, y, rel_tol=rel, abs_tol=1e-15) for x, y in pairs)


def close_norms(a: dict, b: dict) -> bool:
    return math.isclose(a["norm"], b["norm"], rel_tol=1e-9)


def test_each_healthy_rank_computes_the_full_local_gradient_of_the_probe(ranks):
    for rank, result in ranks.items():
        assert close(result["canary"], result["again"])  # the same at every check
        if result["whole"] is not None:  # FSDP2: as the whole-model unshard gave
            assert close(result["canary"], result["whole"])
        # FSDP1's coordinates are the flat parameters': the norm is the full gradient's.
        same = close if result["whole"] is not None else close_norms
        assert same(result["canary"], result["reference"]) == (rank != FAULTY)
        assert result["grads_kept"]  # never reduce-scattered into the training gradients


def test_the_canary_names_the_rank_whose_backward_is_wrong(ranks):
    # The probe all-gathers parameters only: the faulty rank's wrong gradients stay its own,
    # and the detector's rule picks it out of the 4 (no checksum could: no shard has a peer).
    rows = {
        rank: StepRow(
            node=f"n{rank}",
            rank=rank,
            step=10,
            ts=0.0,
            step_time=1.0,
            canary_norm=result["canary"]["norm"],
            canary_proj=tuple(result["canary"]["proj"]),
        )
        for rank, result in ranks.items()
    }
    assert minority_canary(rows, DEFAULT_CONFIG.sdc_canary_rtol) == ([FAULTY], False)


def test_the_probe_holds_one_or_two_layers_unsharded_not_the_model(ranks):
    for result in ranks.values():
        layer, model = result["layer_bytes"], result["model_bytes"]
        assert result["shard_bytes"] == model // RANKS
        # Beyond what an unsharded model's canary needs (its gradients in flight, the
        # activations, the sampled coordinates), the probe adds the layer it computes and
        # the one prefetched: measured 2.1 layers (FSDP2), 1.1 (FSDP1); 3 allowed.
        assert result["peak"] - result["peak_plain"] <= 3 * layer
        # FSDP2: unsharding everything at once added the other ranks' shards of every layer.
        if result["peak_whole"] is not None:
            assert result["peak_whole"] - result["peak_plain"] >= (model - model // RANKS) * 0.9
