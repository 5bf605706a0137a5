"""SASL mechanisms, the broker's side (``server.py``: PLAIN, SCRAM-SHA-256/512) and the SCRAM
computations both sides share (``scram.py``). The connection drives them one token at a time."""
