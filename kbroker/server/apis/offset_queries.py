"""ListOffsets' lookups beyond earliest / latest / first-at-or-after-a-time, as Kafka 3.9 answers them:
the record with the largest timestamp (KIP-734, ``-3``) and v0's list of segment start offsets."""
from __future__ import annotations

import os
import struct

from ...record import decode_records

_EPOCH = struct.Struct(">i")
_EPOCH_AT = 12          # partitionLeaderEpoch's position in a v2 batch header


def max_timestamp(lg):
    """(offset, timestamp, leader_epoch) of the first record holding the log's largest timestamp, or None.

    As Kafka: the segment with the largest max timestamp (the first of equals), its first batch with
    that max timestamp, the first record of the batch carrying it (every record of a LogAppendTime
    batch carries it: its first); the epoch is the batch's partition leader epoch."""
    best = None
    for seg in lg.segments:
        if seg.max_timestamp >= 0 and (best is None or seg.max_timestamp > best.max_timestamp):
            best = seg
    if best is None:
        return None
    ts = best.max_timestamp
    r = best.find_timestamp(ts)
    if r is None:
        return None
    _base, _max_ts, position, size = r
    data = os.pread(best.read_fd, size, position)
    cap = max(64 << 20, 16 * lg.config.max_message_bytes)
    epoch = _EPOCH.unpack_from(data, _EPOCH_AT)[0]
    for offset, record_ts, *_rest in decode_records(data, max_decompressed=cap):
        if record_ts == ts:
            return offset, ts, (epoch if epoch >= 0 else -1)
    return None


def legacy_offsets_before(lg, timestamp: int, max_num_offsets: int, now_ms: int, high_watermark: int | None):
    """ListOffsets v0's ``old_style_offsets``: segment start offsets (the log start for the first, the log
    end after a non-empty active segment), newest first, starting at the last whose file was modified at
    or before ``timestamp`` (latest: the log end; earliest: the log start), at most ``max_num_offsets``.
    ``high_watermark``: a consumer's answer, where no offset above it is listed and it replaces them."""
    segs = list(lg.segments)
    start = lg.log_start_offset
    times = [(max(s.base_offset, start), int(os.stat(s.log_path).st_mtime * 1000)) for s in segs]
    if segs and segs[-1].size > 0:
        times.append((lg.log_end_offset, now_ms))
    if timestamp == -1:
        i = len(times) - 1
    elif timestamp == -2:
        i = 0
    else:
        i = len(times) - 1
        while i >= 0 and times[i][1] > timestamp:
            i -= 1
    n = min(max_num_offsets, i + 1)
    offsets = sorted((times[i - j][0] for j in range(n)), reverse=True)
    if high_watermark is not None and any(o > high_watermark for o in offsets):
        offsets = [high_watermark] + [o for o in offsets if o <= high_watermark]
    return offsets
