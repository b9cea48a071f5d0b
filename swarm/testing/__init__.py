"""Test drivers that run the product's own sans-IO cores: :mod:`swarm.testing.sim`, a
one-process simulation of a swarm's control plane (a simulated clock, network and DHT)
driving the same :class:`swarm.control.core.ControlCore` as the plane."""
