"""Browser tabs in the swarm: the join page, tab signaling, the relay, the status panel.

``swarm publish --http HOST:PORT`` and ``swarm join --http HOST:PORT`` run a
:class:`~swarm.web.server.WebServer` next to the node: it serves plain ES modules from
``static/`` (no build step, nothing from a CDN), a WebSocket for signed tab signaling, a
relay listener through which requesters reach the tabs (:mod:`swarm.links.tabs`) and the
status panel's JSON. See docs/architecture.md ("Browser tabs").
"""
