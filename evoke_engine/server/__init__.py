"""The OpenAI-compatible local endpoint: the same engine and conversations as the window, statefully.

Modules: `app` (FastAPI routes, SSE), `models` (request bodies), `service` (routing and turns),
`sessions` (canonical messages, plans, the session table), `toolcalls`, `security`, `errors`, `runner`.
"""

from .app import create_app
from .runner import EndpointServer, serve
from .security import ServerConfig

__all__ = ["create_app", "EndpointServer", "ServerConfig", "serve"]
