"""A cluster simulator that drives the real agent code against a live Opsboard server.

`python -m opsboard_agent.sim --server URL --token-file F --nodes 4 --gpus 8 ...` pretends
to be N nodes × G GPUs training K runs: node telemetry goes through the node agent's loop
(`Agent.tick` → `Shipper` → `Spool` → `Sender`), step reports and run events through one
`Reporter` per rank. Faults (`--fault straggler:rank=5,at=60,factor=1.4`) are injected into
the generated data and written out as a scenario (`--scenario-out`) to score detectors with.

Layers, each usable alone:
- `layout`: which ranks run on which node and GPU, for which run and shard;
- `faults`: parsing `--fault` specs into resolved, immutable `Fault`s;
- `model` (+ `telemetry`): the pure, deterministic generator — a seed and a simulated time
  in, samples/steps/events out, no I/O, no clock;
- `scenario`: the JSON description of layout and faults;
- `driver`: paces the model against the wall clock and feeds the real agent code;
- `cli`: the command line.

Nothing here imports Django.
"""
