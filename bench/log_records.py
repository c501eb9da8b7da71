"""What hiding URL secrets costs a log line: the same records made and written with and without the record
factory (`outbox._internal.redaction.log_records`), alternated within every round.

    python -m bench.log_records [--rounds 30] [--records 5000]

Each round writes `--records` records of each shape, through a logger at DEBUG and a handler with outbox's
format writing to /dev/null, once with the factory installed and once without, in a new shuffled order:
  plain:   an outbox line with a number and no URL (what most lines are)
  httpx:   httpx's line for a webhook request, its URL (an httpx.URL with a query) an argument
  httpcore: an httpcore DEBUG line (no URL)
It prints, per shape, the median and the p10-p90 spread over the rounds of the microseconds per record
each way and of the difference, and the load average before and after.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import time
from collections.abc import Callable

import httpx

from outbox._internal.redaction.log_records import hide_secrets_in_logs

URL = httpx.URL("http://127.0.0.1:8080/hooks?token=qtok-7Hq2Lr9Wm")


def shapes(logger: logging.Logger) -> dict[str, Callable[[], None]]:
    return {
        "plain": lambda: logger.info("claimed %d lane heads in %.1f ms", 17, 3.25),
        "httpx": lambda: logger.info('HTTP Request: %s %s "%s %d %s"', "POST", URL, "HTTP/1.1", 200, "OK"),
        "httpcore": lambda: logger.debug("receive_response_body.complete"),
    }


def per_record_us(write: Callable[[], None], records: int) -> float:
    started = time.perf_counter()
    for _ in range(records):
        write()
    return (time.perf_counter() - started) / records * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.log_records")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--records", type=int, default=5000)
    arguments = parser.parse_args()

    logger = logging.getLogger("bench.log_records")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    with open(os.devnull, "w") as sink:
        handler = logging.StreamHandler(sink)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        logger.addHandler(handler)
        plain_factory = logging.getLogRecordFactory()
        hide_secrets_in_logs()
        hiding_factory = logging.getLogRecordFactory()
        factories = {"without": plain_factory, "with": hiding_factory}
        written = shapes(logger)
        results: dict[tuple[str, str], list[float]] = {(shape, way): [] for shape in written for way in factories}
        load_before = os.getloadavg()
        for _ in range(arguments.rounds):
            runs = [(shape, way) for shape in written for way in factories]
            random.shuffle(runs)
            for shape, way in runs:
                logging.setLogRecordFactory(factories[way])
                results[shape, way].append(per_record_us(written[shape], arguments.records))
        logging.setLogRecordFactory(plain_factory)
        load_after = os.getloadavg()

    print(f"{arguments.rounds} rounds of {arguments.records} records a shape and way; µs per record")
    print(f"{'shape':<10} {'without':>20} {'with':>20} {'added':>20}")
    for shape in written:
        without, with_ = results[shape, "without"], results[shape, "with"]
        added = [hidden - plain for hidden, plain in zip(with_, without, strict=True)]
        print(f"{shape:<10} {_figure(without):>20} {_figure(with_):>20} {_figure(added):>20}")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")


def _figure(values: list[float]) -> str:
    deciles = statistics.quantiles(values, n=10)
    return f"{statistics.median(values):.2f} ({deciles[0]:.2f}-{deciles[-1]:.2f})"


if __name__ == "__main__":
    main()
