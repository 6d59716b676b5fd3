"""tracestore: a lossless store for RL rollouts (legacy trajectories and v3 traces)."""

__version__ = "0.1.0"
