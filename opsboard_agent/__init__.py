"""Opsboard agent: collects node telemetry and training-loop reports and ships them to the
Opsboard server over the v1 wire protocol (see docs/agent.md).

The package never imports Django or anything from the server side; it runs on GPU nodes and
inside training jobs with only the standard library plus psutil, nvidia-ml-py and
prometheus_client (torch only inside the reporter's PyTorch helpers, imported lazily).
"""

__version__ = "0.1.0"
