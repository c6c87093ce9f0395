"""A tiny round-robin TCP load balancer for the replica benchmark (run as its own process, so it
does not share the load generator's interpreter).

    python -m benchmarks.load.balancer --port 9000 --backends 8001,8002

Each new client connection goes to the next backend in turn (layer 4, like nginx ``stream`` or
an L4 cloud balancer); bytes are piped both ways unchanged. Agents keep their connection open,
so a run's agent stays on one replica while it is connected; any replica can serve any run (the
state is in Postgres), so a reconnect may land elsewhere.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools


async def serve(port: int, backends: list[int]) -> None:
    turn = itertools.cycle(backends)

    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except ConnectionError:
            pass
        finally:
            dst.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", next(turn))
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--backends", required=True, help="comma-separated ports on 127.0.0.1")
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    asyncio.run(serve(args.port, [int(p) for p in args.backends.split(",")]))


if __name__ == "__main__":
    main()
