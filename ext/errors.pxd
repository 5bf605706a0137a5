# The Kafka error codes native code answers or raises: the same numbers as kbroker.protocol.errors.Errors
# (tests/test_native_errors.py checks each name and value against it). Add a code here before using it.

cdef enum:
    ERR_CORRUPT_MESSAGE = 2
    ERR_REQUEST_TIMED_OUT = 7
    ERR_MESSAGE_TOO_LARGE = 10
    ERR_INVALID_TIMESTAMP = 32
    ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    ERR_KAFKA_STORAGE_ERROR = 56
    ERR_UNSUPPORTED_COMPRESSION_TYPE = 76
    ERR_INVALID_RECORD = 87
