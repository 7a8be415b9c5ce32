import asyncio
import signal

from django.conf import settings
from django.core.management.base import BaseCommand

from apps.live.services import live_publish_forever


class Command(BaseCommand):
    help = "Publish coalesced node-health deltas to the clusters' websocket groups."

    def handle(self, *args, **options):
        asyncio.run(self._run())

    async def _run(self) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        self.stderr.write("live publisher running")
        await live_publish_forever(
            interval=settings.LIVE_PUBLISH_INTERVAL,
            node_interval=settings.LIVE_NODE_INTERVAL,
            stop=stop,
        )
