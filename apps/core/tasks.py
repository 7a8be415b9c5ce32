"""Enqueueing by task name. A service never imports its app's `tasks` module (the tasks
import the services, so the reverse would be a cycle); it sends the task by the name the
task is registered under, which the service module owns as a constant."""

from typing import Any

from celery import current_app
from kombu.exceptions import ChannelError


def queue_length(queue: str) -> int:
    """Messages waiting in the broker's `queue` (not counting those a worker holds)."""
    with current_app.connection_for_read() as connection:
        try:
            declared = connection.default_channel.queue_declare(queue=queue, passive=True)
        except ChannelError:  # Redis keeps no empty queue: not found means none waiting
            return 0
        return declared.message_count


def task_enqueue(name: str, *args: Any, **options: Any) -> None:
    """Send the task `name` with positional `args`; `options` as for apply_async (`retry`,
    `expires`, ...). Raises what the broker raises: the caller decides what a failure means."""
    current_app.send_task(name, args=args, **options)
