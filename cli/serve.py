"""`sp-plan serve`: the planner service (service/app.py) on uvicorn."""
from __future__ import annotations

import errno
import os
import socket
from typing import Optional

import typer

from sp_plan.cli.discover import _fail as fail, err
from sp_plan.planner.errors import PlanError, require_extra

STORE_HELP = "profile store URL, e.g. sqlite:////path/store.db"


def server_parts() -> str:
    """The event loop and HTTP parser uvicorn's ``--loop auto --http auto`` pick: uvloop and httptools (C) when
    installed (``pip install 'sp-plan[service]'``), else asyncio and h11 (pure Python)."""
    from importlib.util import find_spec

    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    loop = "uvloop" if find_spec("uvloop") else "asyncio"
    return f"{loop} + {'httptools' if AutoHTTPProtocol.__name__ == 'HttpToolsProtocol' else 'h11'}"


def serve_cmd(
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on"),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="TCP port"),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP,
                                        show_default="$SP_PLAN_STORE, else SQLite in the user data directory"),
    workers: int = typer.Option(1, "--workers", min=1, help="uvicorn worker processes (each with its own search pool)"),
    token_file: Optional[str] = typer.Option(None, "--token-file", help="bearer tokens for writes, one per line",
                                             show_default="$SP_PLAN_TOKENS, comma-separated"),
    private: bool = typer.Option(False, "--private", help="reads need a token too"),
    max_world: int = typer.Option(65536, "--max-world", min=1, help="largest world (ranks) a request may ask for"),
    max_body: int = typer.Option(4 * 2**20, "--max-body", min=1, help="largest request body in bytes (413 above)"),
    processes: Optional[int] = typer.Option(None, "--processes", min=1, help="search processes per worker",
                                            show_default="the cores / workers"),
) -> None:
    """Serve plans over HTTP: /v1/plan, /v1/estimate, /v1/profiles, ... (OpenAPI at /docs)."""
    try:
        for module in ("uvicorn", "fastapi", "prometheus_client", "pydantic_settings"):
            require_extra(module, "service", "sp-plan serve")
    except PlanError as e:
        fail(e)
    import uvicorn

    from sp_plan.service.app import create_app
    from sp_plan.service.settings import SETTINGS_ENV, Settings, settings_env

    try:
        check_listen(host, port)
        settings = Settings(store=store, token_file=token_file, private=private, max_world=max_world,
                            max_body=max_body, processes=processes or max(1, (os.cpu_count() or 1) // workers),
                            freeze_gc=True)
        tokens = checked_tokens(settings)
        url, shown = opened_store(settings.store)
        settings.store = url  # the workers open the URL checked here, whatever their environment says
    except PlanError as e:
        fail(e)
    err.print(f"sp-plan serve on http://{host}:{port} (store {shown}, {workers} worker(s) x "
              f"{settings.processes} search process(es), {len(tokens)} token(s){', private' if private else ''}, "
              f"{server_parts()}); API docs at /docs", highlight=False, soft_wrap=True)
    if workers == 1:
        uvicorn.run(create_app(settings), host=host, port=port, loop="auto", http="auto", log_level="info",
                    timeout_graceful_shutdown=GRACE_S)
    else:
        os.environ[SETTINGS_ENV] = settings_env(settings)
        uvicorn.run("sp_plan.service.app:app_from_env", factory=True, host=host, port=port, workers=workers,
                    loop="auto", http="auto", log_level="info", timeout_graceful_shutdown=GRACE_S)


#: seconds a stopping server lets its requests in flight finish before it ends them: a search may run minutes,
#: and SIGTERM must stop the service
GRACE_S = 10


def check_listen(host: str, port: int) -> None:
    """PlanError on --port or --host unless a socket can listen on (host, port) as uvicorn's will (each address
    ``host`` resolves to, SO_REUSEADDR, IPv6 sockets IPv6-only as asyncio's create_server makes them); the probe is
    closed at once. A busy port or a bad address is then one error line, not uvicorn's startup log and exit 3."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as e:
        raise PlanError("--host", f"cannot listen on {host}: {e.strerror or e}",
                        "pass an address of this machine, e.g. 127.0.0.1 or 0.0.0.0") from None
    for family, kind, proto, _, addr in infos:
        try:
            sock = socket.socket(family, kind, proto)
        except OSError:  # a family this kernel lacks (IPv6 off): asyncio skips it too
            continue
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(addr)
                sock.listen()  # SO_REUSEADDR lets a bind share a port that another socket only listens on
            except OSError as e:
                raise _listen_error(host, port, addr, e) from None


def _listen_error(host: str, port: int, addr: tuple, e: OSError) -> PlanError:
    """The PlanError for a socket that cannot listen on ``addr``: the port's fault (in use, privileged) or the
    host's (not an address of this machine)."""
    shown = f"[{addr[0]}]:{port}" if ":" in addr[0] else f"{addr[0]}:{port}"
    if e.errno == errno.EADDRINUSE:
        return PlanError("--port", f"{shown} is in use", "pick another --port")
    if e.errno == errno.EACCES:
        return PlanError("--port", f"cannot listen on {shown}: {e.strerror}", "pick a --port above 1023")
    return PlanError("--host", f"cannot listen on {host}: {e.strerror or e}",
                     "pass an address of this machine, e.g. 127.0.0.1 or 0.0.0.0")


def opened_store(url: str | None) -> tuple[str, str]:
    """(URL, URL as shown) of the store, once it is migrated and checked here, before the workers open it."""
    from sp_plan.profiles.store import Store

    with Store(url) as st:
        return st.url, st.shown


def checked_tokens(settings) -> tuple[bytes, ...]:
    """The accepted tokens: a bad token file fails here, once, not in every worker; --private needs one."""
    from sp_plan.service import auth

    tokens = auth.load_tokens(settings.token_file, settings.listed_tokens())
    if settings.private and not tokens:
        raise PlanError("--private", "reads need a token but no token is configured",
                        f"pass --token-file FILE or set ${auth.ENV_VAR}")
    return tokens


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_cmd)
