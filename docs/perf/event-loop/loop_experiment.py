"""Experiment driver (not part of kbroker): perf.request_bench with asyncio vs uvloop brokers, both started
with PYTHONPATH=$UVLOOP_PATCH_DIR, a directory holding uvloop_experiment_sitecustomize.py copied as
sitecustomize.py (the patch does nothing on asyncio). Run from the repository root."""
import os
import sys

from kbroker.perf import request_bench as R

PP = {"PYTHONPATH": os.environ["UVLOOP_PATCH_DIR"]}
R.KBROKER_VARIANTS["kbroker-asyncio"] = ({"kbroker.event.loop": "asyncio"}, dict(PP))
R.KBROKER_VARIANTS["kbroker-uvloop"] = ({"kbroker.event.loop": "uvloop"}, dict(PP))
sys.exit(R.main(sys.argv[1:]))
