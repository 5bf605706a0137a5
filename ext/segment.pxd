# cimport surface of kbroker._native.segment (see segment.pyx for the contract).
# The segment module is used from Python (kbroker.log); nothing is exported at C level yet
# beyond the RecordBatch header geometry other native modules may share.
cdef enum:
    SEGMENT_BATCH_HEADER = 61
    SEGMENT_LOG_OVERHEAD = 12
