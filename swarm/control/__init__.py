"""The control plane: who is in the swarm, who coordinates, who is kicked or blocked, who owns it.

Sans-IO cores, fed events and ``now``, and one thin asyncio adapter:

==================  ==================================================================
``machine.py``      :class:`Controller`, the coordinator state machine (roles, terms,
                    heartbeats, claims, handoff, kicks and blocks) and its commands
``state.py``        :class:`CoordinatorState`, the signed coordinator-state item, and
                    the blocklist it carries; persistence in the data dir
``election.py``     deterministic election (:func:`elect`, :func:`successor`) and the
                    term guard (fencing)
``charter.py``      the owner-signed swarm charter item and the DHT validators for it
``membership.py``   :class:`MemberRecord`, the signed announcements under the swarm topic
``observer.py``     a read-only view of a swarm for ``swarm status`` and owner commands
``owned.py``        swarms this machine published (swarm key, owner credential, chain)
``plane.py``        :class:`ControlPlane`, the asyncio adapter: frames, sends, receives,
                    persists
==================  ==================================================================

Roles of one node (``machine.Role``; the table ``machine._TRANSITIONS`` is the law)::

                  claim term N+1 (CAS put)         won the claim
    FOLLOWER  -------------------------->  CANDIDATE  ----------->  COORDINATOR
       ^  ^                                   |                       |     ^
       |  +-----------------------------------+                       |     | successor
       |        lost the claim / legitimate higher term seen           v     | failed
       +--------------------------------------------------------  HANDING_OFF
                 legitimate higher term seen / handoff done

    any role --leave--> STOPPED

Observers (``observer.py``) read the same items and apply the same checks, but never claim.

The data plane (``swarm.links``, ``swarm.runtime``) never imports this package; the node and
the commands sit above it.
"""
