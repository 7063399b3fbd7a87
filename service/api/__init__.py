"""The HTTP API: one router module per domain and the request dependencies (``deps``). The top
layer with ``service.app``: it may call any domain, and nothing below imports it."""
