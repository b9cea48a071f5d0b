"""The long-running processes of one machine: a member of a swarm (``member.serve``, behind
``swarm publish`` and ``swarm join``) and a plain worker with no control plane
(``python -m swarm.processes.worker``, what ``swarm.local`` and ``swarm.init`` spawn)."""
