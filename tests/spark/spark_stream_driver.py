"""A streaming query run as its own driver process by tests/test_spark_stream.py (so the test can
kill it with SIGKILL mid-batch): kbroker topic -> foreachBatch into Parquet keyed by batch id
(overwrite per batch id: a re-run batch replaces its own output, so the sink is idempotent).

    python spark_stream_driver.py BOOTSTRAP TOPIC CHECKPOINT OUT MAX_OFFSETS [SLOW_SECONDS [SLOW_FROM]]

SLOW_SECONDS of extra work in each batch from batch id SLOW_FROM on (default 0): the window in which the
test kills the driver, spent only in the batch it kills.

Markers in OUT/_markers: started-<batchId> when a batch begins, failed-once after the injected
task failure (the first attempt of the first task to see the marker missing raises once).
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from spark_util import make_session  # noqa: E402


def main():
    bootstrap, topic, checkpoint, out, max_offsets = sys.argv[1:6]
    slow = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
    slow_from = int(sys.argv[7]) if len(sys.argv) > 7 else 0
    markers = Path(out) / "_markers"
    markers.mkdir(parents=True, exist_ok=True)
    spark = make_session("kbroker-stream-driver", master="local[2,2]")
    spark.sparkContext.setLogLevel("ERROR")
    failed_marker = str(markers / "failed-once")

    def fail_once(batches):
        # The injected task failure: first attempt of one task in the first batch that runs it.
        from pyspark import TaskContext
        ctx = TaskContext.get()
        for b in batches:
            if ctx.attemptNumber() == 0 and not os.path.exists(failed_marker):
                try:
                    fd = os.open(failed_marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                    os.close(fd)
                    raise RuntimeError("injected task failure")
                except FileExistsError:
                    pass
            yield b

    def sink(df, batch_id):
        (markers / f"started-{batch_id}").touch()
        rows = df.mapInArrow(fail_once, df.schema)
        rows.write.mode("overwrite").parquet(os.path.join(out, f"batch={batch_id}"))
        if slow and batch_id >= slow_from:
            time.sleep(slow)     # widen the window in which the test kills the driver

    stream = (spark.readStream.format("kbroker").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", max_offsets).load()
              .select("topic", "partition", "offset", "value"))
    q = (stream.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
         .trigger(availableNow=True).start())
    q.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
