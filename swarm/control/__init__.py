"""The control plane: who is in the swarm, who coordinates, who is kicked or blocked, who owns it.

One sans-IO core, fed events and ``now``, and one thin asyncio adapter:

==================  ==================================================================
``core.py``         :class:`ControlCore`, the control plane of one node: typed events in
                    (messages, reads answered, ticks), typed actions out (reads, puts,
                    sends, disconnects, persists); message dispatch, command checks, the
                    proofs kept to forward, evidence and liar-report bookkeeping, the
                    member view, the order of a term claim. The plane and the simulator
                    (:mod:`swarm.testing.sim`) drive this same core
``machine.py``      :class:`Controller`, the coordinator state machine (duties, terms,
                    heartbeats, claims, handoff, kicks, blocks, liar reports and their
                    :class:`Judgement` hook); :func:`counted_states`, the rule for which
                    state items count (entitled signers, terms within a bound)
``state.py``        :class:`CoordinatorState`, the signed coordinator-state item
                    (:class:`StateItem`) with its blocklist in chained
                    :class:`BlockPage` s; every control message's typed codec
                    (:class:`SignedMessage`, :class:`LiarReport`, ...); the data dir copy
``election.py``     deterministic election (:func:`elect`, :func:`successor`) over
                    :class:`Candidate` s and their :class:`Fitness`; the term guard
``replay.py``       :class:`CommandGuard`: operator commands once, fresh, with a forward-
                    moving authenticator sign counter
``charter.py``      the owner-signed swarm charter item, the DHT validators for it, and
                    the charter counter floor kept in the data dir
``membership.py``   :class:`MemberRecord`, the signed announcements under the swarm topic
                    (its :class:`Health`); the peers seen, kept in the data dir
``observer.py``     a read-only view of a swarm for ``swarm status`` and owner commands,
                    by the core's own state read; a fresh ``join_uri`` of live peers
``owned.py``        swarms this machine published (swarm key, owner credential, chain)
``sync.py``         :class:`Sync`: what a node reads from the DHT and when (heartbeat
                    digests; members fetch what changed; DHT fallback on silence)
``plane.py``        :class:`ControlPlane`, the asyncio adapter: carries out the core's
                    actions on the DHT and the data dir, feeds back their answers
==================  ==================================================================

Duties of one node (``machine.Duty``; the table ``machine._TRANSITIONS`` is the law)::

                  claim term N+1 (CAS put)         won the claim
    FOLLOWER  -------------------------->  CANDIDATE  ----------->  COORDINATOR
       ^  ^                                   |                       |     ^
       |  +-----------------------------------+                       |     | successor
       |        lost the claim / legitimate higher term seen           v     | failed
       +--------------------------------------------------------  HANDING_OFF
                 legitimate higher term seen / handoff done

    any role --leave--> STOPPED

Who counts. A heartbeat is followed only from the coordinator we follow, one its
predecessor endorsed (handoff), or the one our own election picks once the old one is set
aside; a node with no state yet follows only a member whose announced roles make it
eligible. A term is recorded only after its sender is shown legitimate, and never more
than ``MAX_TERM_STEP`` above a term already counted. State items read from the DHT count
only when signed by an entitled member (:func:`machine.counted_states`); a coordinator
steps down only for such a rival. Observers (``observer.py``) read the same items and
apply the same rules, but never claim.

The data plane (``swarm.links``, ``swarm.runtime``) never imports this package; the node and
the commands sit above it.
"""
