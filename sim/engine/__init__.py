"""The discrete-event engine (SimPy): shared-bandwidth links, compute tiles, host, streams.

``Simulation(hardware, graph, costs, graph_mode).run()`` advances time for one decode step
and returns per-op timings and the tidy event log. The engine never reads YAML.
"""
