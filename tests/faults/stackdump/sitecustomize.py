"""On the fault stacks' PYTHONPATH (tests/faults/private_stack.py): SIGRTMIN+1 writes every
thread's stack to the process's log (its stderr), which gunicorn and Celery leave alone.
Test 4 asks the web workers for one during each freeze: a request that overstays its bound
leaves the evidence of where it waited."""

import faulthandler
import signal

faulthandler.register(signal.SIGRTMIN + 1, all_threads=True)
