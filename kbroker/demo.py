"""A short produce/consume round trip against a running cluster, using kcat (an unmodified librdkafka
client): what `scripts/cluster.sh` shows after starting the cluster.

    python -m kbroker.demo --bootstrap-server 127.0.0.1:9092 [--topic kbroker-demo]
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kbroker.demo")
    ap.add_argument("--bootstrap-server", required=True)
    ap.add_argument("--topic", default="kbroker-demo")
    args = ap.parse_args(argv)
    kcat = shutil.which("kcat") or shutil.which("kafkacat")
    if kcat is None:
        print("kcat is not installed (scripts/setup.sh installs Debian's kcat)", file=sys.stderr)
        return 1
    stamp = time.strftime("%H:%M:%S")
    lines = [f"user{i}:hello {i} from kbroker at {stamp}" for i in range(5)]
    common = ["-b", args.bootstrap_server, "-t", args.topic, "-X", "message.timeout.ms=15000"]
    print(f"== producing {len(lines)} keyed records to {args.topic} with kcat")
    subprocess.run([kcat, "-P", "-K:", *common], input="\n".join(lines) + "\n", text=True,
                   check=True, timeout=60)
    print(f"== consuming {args.topic} from the beginning with kcat")
    out = subprocess.run([kcat, "-C", "-e", "-q", "-o", "beginning", *common,
                          "-f", "partition %p  offset %o  key %k  value %s\n"],
                         capture_output=True, text=True, check=True, timeout=60)
    sys.stdout.write(out.stdout)
    got = [line for line in out.stdout.splitlines() if stamp in line]
    if len(got) != len(lines):
        print(f"expected {len(lines)} records from this run, read {len(got)}", file=sys.stderr)
        return 1
    print(f"== round trip ok: {len(got)} records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
