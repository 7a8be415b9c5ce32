"""Starting Opsboard's processes: `python -m launcher.stack run|demo` (`make run`, `make
demo`), and the process helpers that the tests, the benchmarks and the evaluation share
(`launcher.procs`). Not part of the web application: nothing under `apps/` or `opsboard/`
imports it, except the evaluation harness, which starts stacks of its own."""
