"""What every API of yard shares: reading a request's headers (``intake``:
API key, priority, deadline, time window) and answering a refusal
(``errors``). It holds no service; each API is handed the one it uses
(``docs/architecture.md``)."""
