"""FastAPI application factory."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi_offline import FastAPIOffline

import drcredit
from drcredit.broker.consumers import CachedCensus, ConsumerRegistry
from drcredit.scoring.results.events import NotificationListener
from drcredit.settings import Settings, get_settings
from drcredit.tenancy.budgets import Releaser
from drcredit.wiring.runtime import Runtime
from drcredit_api import analytics, audits, labels, operations, usage
from drcredit_api.auth import OPEN_TENANT
from drcredit_api.endpoints import router
from drcredit_api.errors import install_handlers
from drcredit_api.middleware import AccessLog, Authenticate, BodyLimit
from drcredit_api.ui import routes as ui

log = logging.getLogger("drcredit.api")

DESCRIPTION = """\
Process credit for deep-research agents (Dr.Credit). Post a group of rollouts for one
question; the service judges how much new rubric support each visit adds, credits
searches for navigation and snippets, normalizes within the group and returns per-turn
advantages for GRPO-style training.
"""


def create_app(
    settings: Settings | None = None,
    *,
    runtime_factory: Callable[[Settings], Runtime] | None = None,
    broker_probe: Callable[[], None] | None = None,
) -> FastAPI:
    settings = settings or get_settings()
    factory = runtime_factory or (lambda s: Runtime.build(s))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = factory(settings)
        app.state.runtime = runtime
        if app.state.broker_probe is None and hasattr(runtime.dispatcher, "ping"):
            app.state.broker_probe = runtime.dispatcher.ping
        registry = None
        if settings.broker_url:
            # Which queues have a live worker (drcredit.broker.consumers): group status,
            # /readyz and /metrics say when one has none.
            registry = ConsumerRegistry(settings.broker_url)
            app.state.consumers = CachedCensus(registry)
        if not app.state.tenant_keys:
            log.warning(
                "no API keys configured (DRCREDIT_API_KEYS): the API is OPEN to anyone who can reach it; local use only"
            )
            unused = sorted(t for t in settings.tenants if t != OPEN_TENANT)
            if unused:
                log.warning(
                    "DRCREDIT_TENANTS names %s, but without DRCREDIT_API_KEYS every request is tenant %r:"
                    " those policies apply to no group posted here",
                    ", ".join(unused),
                    OPEN_TENANT,
                )
        log.info(
            "drcredit API ready: judge=%s model=%s database=%s execution=%s",
            runtime.judge.backend,
            runtime.judge.model,
            runtime.db.engine.url.render_as_string(hide_password=True),
            "celery" if settings.distributed else "in-process",
        )
        if not settings.distributed:
            # This process judges: ask the judge servers what they serve before the first step.
            runtime.pipeline.warm()
        listener = None
        if runtime.db.engine.dialect.name == "postgresql":
            # Groups finished by workers wake this process's long-polls (NOTIFY).
            conninfo = runtime.db.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
            listener = NotificationListener(conninfo, runtime.pipeline.events)
            listener.start()
        # Groups held for a budget are sent at its reset, by whichever API process is first.
        releaser = Releaser(runtime.db, runtime.dispatcher)
        releaser.start()
        try:
            yield
        finally:
            releaser.stop()
            if listener is not None:
                listener.stop()
            if registry is not None:
                registry.close()
            runtime.close()
            if listener is not None:
                listener.join(timeout=5)  # it looks at its stop flag every second

    # FastAPIOffline serves the /docs and /redoc assets from the installed package: the
    # documentation works without internet access.
    app = FastAPIOffline(title="DrCredit", version=drcredit.__version__, description=DESCRIPTION, lifespan=lifespan)
    for route in app.routes:
        if isinstance(route, APIRoute) and route.path in ("/docs", "/redoc"):
            route.methods = {*(route.methods or ()), "HEAD"}  # as the API's pages: link checkers ask so
    app.state.tenant_keys = settings.tenant_keys()
    app.state.broker_probe = broker_probe
    app.state.consumers = None
    install_handlers(app)
    app.include_router(router)
    app.include_router(operations.router)
    app.include_router(analytics.router)
    app.include_router(audits.router)
    app.include_router(labels.router)
    app.include_router(usage.router)
    app.include_router(ui.router)
    app.include_router(ui.root)
    app.mount("/ui/static", ui.static, name="ui-static")
    # Added last runs first: the access log wraps authentication, which runs before the
    # body limit reads anything.
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(Authenticate, keys=app.state.tenant_keys, open_tenant=OPEN_TENANT)
    app.add_middleware(AccessLog)
    return app
