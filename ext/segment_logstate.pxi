# Included by segment.pyx: LogState, the base class of kbroker.log.log.Log: the fields the native
# Produce and Fetch paths read or write per request, as C fields, and the one high-watermark rule
# (advance_hw / advance_hw_alone) that both Python (Partition) and the native Fetch path call.

cdef class LogState:
    """The per-request fields of kbroker.log.log.Log (its base class; declared in segment.pxd)."""

    cpdef bint advance_hw(self, list isr, dict followers, int local_id, Py_ssize_t min_isr, int64_t leo) except -1:
        """A leader's high-watermark rule (Kafka's maybeIncrementLeaderHW): with at least ``min_isr``
        replicas in ``isr`` and every one but ``local_id`` known in ``followers`` with a log end
        (``.leo`` >= 0), the HW moves to the smallest log end over the ISR (this log's is ``leo``),
        clamped as Log.high_watermark's setter clamps it; it never moves back. -> whether it moved.
        The one implementation: Partition.maybe_increment_hw and the native Fetch path's follower
        record call it. Precondition, the stricter of the two callers': the partition is led here and
        its leadership is not stale (a stale or former leader's followers do not commit anything; the
        Python caller checks it, the native one only records followers of an armed, not stale slot)."""
        cdef int64_t hw = leo, f_leo
        cdef object r, f
        if len(isr) < min_isr:
            return False
        for r in isr:
            if <int>r == local_id:
                continue
            f = followers.get(r)
            if f is None:
                return False
            f_leo = f.leo
            if f_leo < 0:
                return False
            if f_leo < hw:
                hw = f_leo
        return self._raise_hw(hw, leo)

    cpdef bint advance_hw_alone(self, int64_t leo) except -1:
        """``advance_hw`` for an ISR of this replica alone (no follower to wait for): the HW moves to
        ``leo``. Log.high_watermark_to_end and the native Produce path's ISR-of-one append call it."""
        return self._raise_hw(leo, leo)

    cdef bint _raise_hw(self, int64_t hw, int64_t leo) noexcept:
        cdef int64_t start
        if hw <= self._high_watermark:
            return False
        start = self.log_start_offset
        self._high_watermark = (hw if hw > start else start) if hw < leo else leo
        return True
