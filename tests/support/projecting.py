"""A projector that keeps one read model caught up, as a busy CLI would: the stress test runs it in threads of
its own process and, through `python -m tests.support.projecting` (one request a line on stdin), in other
processes."""

import asyncio
import os
import sys
from collections.abc import Callable, Mapping

from ftrain.logs import configure
from ftrain.service import RunService


async def keep_catching_up(
    env: Mapping[str, str], next_request: Callable[[], str], reply: Callable[[str], None]
) -> None:
    """Catch up again and again until asked; on `report`, catch up once more (the stream may have grown
    since the last pass started) and reply how many records this projector applied since its last report;
    on anything else, stop."""
    async with RunService.open(env) as app:
        reply("ready")
        applied = 0
        request = asyncio.ensure_future(asyncio.to_thread(next_request))
        while True:
            applied += await app.projector.catch_up()
            if request.done():
                if request.result().strip() != "report":
                    return
                reply(str(applied + await app.projector.catch_up()))
                applied = 0
                request = asyncio.ensure_future(asyncio.to_thread(next_request))
            await asyncio.sleep(0.001)  # let the other projectors of a busy machine in


def _reply(line: str) -> None:
    print(line, flush=True)


if __name__ == "__main__":
    configure()  # logs go to stderr: stdout carries the replies
    asyncio.run(keep_catching_up(os.environ, sys.stdin.readline, _reply))
