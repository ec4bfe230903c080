#!/usr/bin/env python3
"""A TCP relay for bench/regions.sh: forwards LISTEN -> TARGET, delaying every
chunk by LATENCY_MS in each direction (a link across an ocean), and counts
connections into COUNT_FILE. SIGUSR1 cuts the link (new connections are held
and never answered: a hanging partition); SIGUSR2 heals it.

    relay.py LISTEN_PORT TARGET_HOST:PORT LATENCY_MS COUNT_FILE
"""
import asyncio
import signal
import sys

port, target, latency_ms, count_file = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
host, tport = target.rsplit(":", 1)
state = {"cut": False, "connections": 0}


async def pipe(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            await asyncio.sleep(latency_ms / 1000)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def handle(reader, writer):
    state["connections"] += 1
    with open(count_file, "w") as f:
        f.write(str(state["connections"]))
    if state["cut"]:
        await asyncio.sleep(3600)
        return
    try:
        r2, w2 = await asyncio.open_connection(host, int(tport))
    except OSError:
        writer.close()
        return
    await asyncio.gather(pipe(reader, w2), pipe(r2, writer))


async def main():
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, lambda: state.update(cut=True))
    loop.add_signal_handler(signal.SIGUSR2, lambda: state.update(cut=False))
    server = await asyncio.start_server(handle, "127.0.0.1", port)
    with open(count_file, "w") as f:
        f.write("0")
    async with server:
        await server.serve_forever()


asyncio.run(main())
