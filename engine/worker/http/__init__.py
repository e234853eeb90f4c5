"""The worker's HTTP client: pycurl multi handles driven by the worker's event
loop, one POST's transfer and result, and faults of the client's machinery."""
